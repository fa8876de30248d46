"""The HTTP service `corral serve` runs: a FastAPI app over corral's sandboxes.

Every route but /health, /openapi.json and /docs needs `Authorization: Bearer
TOKEN` (tokens.py). A token sees only the sandboxes it created (another's answer 404, as if
they did not exist) and cannot create one beyond its ceiling (ceiling.py: 403 naming the
rule). Every error is `{"error": {"kind", "field", "message"}}` (and `step` for a setup
error). Request bodies are capped
(413) before any handler reads them (bodycap.py). The routes are in routes/, one module a
resource; what they share (auth, the service's state, errors) is in common.py.
"""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import CorralError
from .bodycap import BodyCap
from .ceiling import Exceeds
from .common import ApiError, SafeJSONResponse, Service, corral_error, error
from .limits import Limited
from .metrics import Metrics
from .registry import Registry
from .tokens import TokenStore

log = logging.getLogger("corral.serve")

BODY_MAX = 16 << 20          # bytes of one request body (a file write's content included)


def create_app(state_dir: str | None = None, *, opener=None, body_max: int = BODY_MAX,
               sweep: bool = True, config=None, e2b_debug: str | None = None):
    """The ASGI app. `opener(policy, timeout=, metadata=) -> sandbox` (registry.open_sandbox,
    a live sandbox, by default). `sweep`: at start-up, remove what a previous run left
    (its sandboxes' run directories, mounts and cgroups, if it died without its end).
    `config`: a config.Config (the server's [limits], [secrets] and --mcp)."""
    from .config import Config
    from .routes import ROUTERS

    config = config if config is not None else Config()
    registry = Registry(opener) if opener is not None else Registry()
    if state_dir:    # the audit store (docs/audit.md) lives in the same state directory
        from ..audit.record import set_path

        set_path(os.path.join(os.path.abspath(state_dir), "audit", "audit.db"))
    svc = Service(TokenStore(state_dir, config.limits), registry, Metrics(), config)

    @asynccontextmanager
    async def _lifespan(app):
        if sweep:
            _sweep()
        yield
        svc.draining = True
        n = registry.close_all()     # the service's end is every sandbox's end
        log.info("corral serve: shut down, %d sandbox(es) killed", n)

    app = FastAPI(title="corral", version=_version(), description=(
        "Self-hosted sandboxes for code that AI assistants write. Authenticate with "
        "`Authorization: Bearer TOKEN` (corral token create). The terminal is a WebSocket "
        "at `/sandboxes/{sid}/pty` (OpenAPI does not describe WebSockets: see "
        "docs/service.md for its frames)."),
        lifespan=_lifespan, default_response_class=SafeJSONResponse)
    app.state.service = svc
    app.state.registry = registry
    app.state.tokens = svc.tokens

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return error(e.status, e.kind, e.message, e.field, e.headers)

    @app.exception_handler(Limited)
    async def _limited(request, e: Limited):
        return error(429, "rate", e.message, e.field, {"Retry-After": str(e.retry_after)})

    @app.exception_handler(Exceeds)
    async def _exceeds(request, e: Exceeds):
        return error(403, "ceiling", e.message, e.field)

    @app.exception_handler(CorralError)
    async def _corral(request, e: CorralError):
        return corral_error(e)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.exception("corral serve: %s %s failed", request.method, request.url.path)
        return error(500, "internal", "the server failed on this request (its log says "
                     "why)", None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        first = (e.errors() or [{}])[0]
        loc = list(first.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        loc = ".".join(str(x) for x in loc) or None
        return error(422, "invalid", first.get("msg", "invalid request"), loc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e: StarletteHTTPException):
        kind = {404: "not_found", 405: "method"}.get(e.status_code, "http")
        headers = dict(getattr(e, "headers", None) or {})
        if e.status_code == 405:
            from .openapi import allowed

            headers["Allow"] = allowed(request)     # the router names one route's only
        return error(e.status_code, kind, str(e.detail), None, headers)

    for router in ROUTERS:
        app.include_router(router)

    from .openapi import document

    document(app)                  # the bearer scheme, Retry-After, what no router lists
    asgi = app
    if config.mcp:
        from .mcp_http import mount

        asgi = mount(app)          # /mcp: the MCP tools behind the same tokens (mcp_http.py)
    from .e2b import Dispatch
    from .fastexec import LeanExec

    # a foreground command's Result without FastAPI's per-request work (fastexec.py)
    asgi = LeanExec(asgi, svc)
    # E2B's wire protocol on the same port, told apart by its headers (service/e2b/)
    inner = Dispatch(asgi, svc, debug_owner=e2b_debug)
    wrapped = Counted(BodyCap(inner, body_max) if body_max else inner, svc.metrics)
    wrapped.state = app.state          # create_app(...).state.service, as on the app
    return wrapped


class Counted:
    """ASGI middleware: counts responses by status (GET /metrics). Pure ASGI (no
    BaseHTTPMiddleware): streams and a client's disconnect pass through untouched."""

    def __init__(self, app, metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting(msg):
            if msg["type"] == "http.response.start":
                self.metrics.response(msg["status"])
            await send(msg)

        return await self.app(scope, receive, counting)


def _sweep() -> None:
    """What sandboxes of a dead process left (this service's last run, killed without its
    end): removed, and the log says so, either way."""
    from ..linux.rundir import sweep_stale

    try:
        dead = sweep_stale()
    except OSError as e:
        log.warning("corral serve: sweep: could not look for sandboxes left over: %s", e)
        return
    if dead:
        log.info("corral serve: sweep: removed %d sandbox(es) left over by a process that "
                 "died: %s", len(dead), " ".join(sorted(dead)))
    else:
        log.info("corral serve: sweep: nothing left over")
    # their audit records: a sandbox this service (or any process) held when it died has
    # no end; it is closed as "lost" (docs/audit.md)
    from ..audit import record
    from ..audit.query import end_lost

    if not record.enabled():
        return
    try:
        lost = end_lost()
    except Exception as e:  # noqa: BLE001 - the store's trouble must not stop the service
        log.warning("corral serve: audit: could not close the records of lost sandboxes: %s",
                    e)
        return
    if lost:
        log.info("corral serve: audit: %d sandbox record(s) closed as lost: %s", len(lost),
                 " ".join(sorted(lost)))


def _version() -> str:
    from .. import __version__

    return __version__




def serve(config, *, e2b_debug: str | None = None) -> int:
    """Run the service for a config.Config (host and port filled) until SIGTERM or SIGINT,
    then drain: no new sandboxes (503), the requests in flight get config.drain_timeout
    seconds to finish, then whatever still runs is cancelled (a foreground command is
    killed with its request), and every sandbox is killed."""
    import uvicorn

    from ..backends.host import zygote

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = create_app(config.state_dir, config=config, e2b_debug=e2b_debug)
    svc = app.state.service
    drain = config.drain_timeout
    tls = {}
    if config.tls_cert is not None:
        tls = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
    log.info("corral serve: %s://%s:%d%s", "https" if tls else "http", config.host,
             config.port, " (MCP at /mcp)" if config.mcp else "")

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            first = not svc.draining
            svc.draining = True
            super().handle_exit(sig, frame)     # first: the exit must not hang on a log
            if first:
                # a signal handler may run while this thread is inside a write to stderr
                # (the log is a stream): that write raises (reentrant call), and raised
                # before super() it left the server running on; the line may be lost then
                try:
                    log.info("corral serve: signal %d: draining (no new sandboxes; "
                             "requests in flight have %gs, then every sandbox is killed)",
                             sig, drain)
                except Exception:      # noqa: BLE001 - see above
                    pass

    # the parser: httptools where installed, else h11, a response's writes joined into
    # one send (wire.py). The loop: asyncio's always (uvicorn's auto would take uvloop
    # wherever installed). uvloop's setns failure (EINVAL) came from the commands' zygote
    # forked inside a uvloop server; forked early (enter.warm) commands run on uvloop
    # 0.23 too, with no gain measured (docs/service.md): it is not in the lock
    from .wire import protocol

    uconfig = uvicorn.Config(app, host=config.host, port=config.port, loop="asyncio",
                             http=protocol(), log_level=config.log_level,
                             access_log=config.access_log,
                             timeout_keep_alive=config.keep_alive,
                             timeout_graceful_shutdown=drain, **tls)
    zygote.warm()   # the egress proxies' template, ready before the first sandbox asks
    sockets = None
    if e2b_debug:      # E2B_DEBUG mode: envd's and the code interpreter's ports on loopback
        import socket

        from .e2b import DEBUG_PORTS

        sockets = []
        for h, p in [(config.host, config.port)] + [("127.0.0.1", d) for d in DEBUG_PORTS]:
            s = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((h, p))
            sockets.append(s)
        log.info("corral serve: E2B_DEBUG mode: envd on 127.0.0.1:%d, the code "
                 "interpreter on 127.0.0.1:%d, one sandbox of token %r", *DEBUG_PORTS,
                 e2b_debug)
    Server(uconfig).run(sockets=sockets)
    return 0
