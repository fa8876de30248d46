"""The HTTP service `corral serve` runs: a FastAPI app over the in-process Sandbox.

Every route but /health, /metrics, /openapi.json and /docs needs `Authorization: Bearer
TOKEN` (tokens.py). A token sees only the sandboxes it created (another's answer 404, as if
they did not exist) and cannot create one beyond its ceiling (ceiling.py: 403 naming the
rule). Every error is `{"error": {"kind", "field", "message"}}`. Request bodies are capped
(413) before any handler reads them.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import BackendUnavailable, CorralError, PolicyError, UnsupportedRule, UsageError
from .ceiling import Exceeds, requested
from .limits import Concurrency, Limited, Quota, RateLimiter
from .registry import Registry
from .tokens import Token, TokenStore

log = logging.getLogger("corral.serve")

BODY_MAX = 16 << 20          # bytes of one request body (a file write's content included)
TIMEOUT_MAX = 86400          # seconds: the longest timeout a request may ask for


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, field: str | None = None,
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.field = status, kind, message, field
        self.headers = headers or {}


def _error(status: int, kind: str, message: str, field: str | None = None,
           headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "field": field, "message": message}},
                        status_code=status, headers=headers)


# -- request and response bodies -------------------------------------------------------------
class Strict(BaseModel):
    # strict: `true` is not a timeout of 1 s, "5" is not a number (schemathesis found it)
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateBody(Strict):
    policy: dict[str, Any] = Field(default_factory=dict, description=(
        "a policy in the TOML layout as JSON (docs/policy.md); fields left out take the "
        "token's ceiling's isolation and limits. A secret names only hosts and ttl: its "
        "source is the server's (the ceiling's), never sent"))


class ExecBody(Strict):
    argv: list[str] | None = Field(None, min_length=1, description="the command and arguments")
    cmd: str | None = Field(None, description="a shell command line, run with /bin/sh -c")
    stdin: str | None = Field(None, description="text given to the command's stdin")
    timeout: float | None = Field(None, gt=0, le=TIMEOUT_MAX, description=(
        "seconds, at most 86400; default the policy's limits.timeout"))


class WriteBody(Strict):
    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"


class CodeBody(Strict):
    code: str
    language: Literal["python", "javascript", "bash"] = "python"
    timeout: float | None = Field(None, gt=0, le=TIMEOUT_MAX, description="seconds, at most "
                                  "86400; default 300")


class ExplainBody(Strict):
    policy: dict[str, Any] = Field(default_factory=dict)


# -- metrics: a few counters in Prometheus text ----------------------------------------------
class Metrics:
    BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.created = 0
        self.runs: dict[str, int] = {}
        self.requests: dict[int, int] = {}
        self.hist = [0] * (len(self.BUCKETS) + 1)
        self.hist_sum = 0.0

    def run(self, verdict: str, seconds: float) -> None:
        with self.mu:
            self.runs[verdict] = self.runs.get(verdict, 0) + 1
            i = next((i for i, b in enumerate(self.BUCKETS) if seconds <= b), len(self.BUCKETS))
            self.hist[i] += 1
            self.hist_sum += seconds

    def text(self, live: int) -> str:
        with self.mu:
            out = ["# TYPE corral_sandboxes_live gauge", f"corral_sandboxes_live {live}",
                   "# TYPE corral_sandboxes_created_total counter",
                   f"corral_sandboxes_created_total {self.created}",
                   "# TYPE corral_runs_total counter"]
            out += [f'corral_runs_total{{verdict="{v}"}} {n}' for v, n in sorted(self.runs.items())]
            out.append("# TYPE corral_http_responses_total counter")
            out += [f'corral_http_responses_total{{status="{s}"}} {n}'
                    for s, n in sorted(self.requests.items())]
            out.append("# TYPE corral_run_seconds histogram")
            acc = 0
            for b, n in zip(self.BUCKETS, self.hist):
                acc += n
                out.append(f'corral_run_seconds_bucket{{le="{b}"}} {acc}')
            acc += self.hist[-1]
            out += [f'corral_run_seconds_bucket{{le="+Inf"}} {acc}',
                    f"corral_run_seconds_sum {self.hist_sum:.6f}",
                    f"corral_run_seconds_count {acc}"]
        return "\n".join(out) + "\n"


# -- the body cap, before any handler ---------------------------------------------------------
class BodyCap:
    """ASGI middleware: a request whose body passes `limit` bytes (by Content-Length, or
    as it arrives) is answered 413 and never reaches the app."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return await self._reply(send, 400, "content-length is not a number")
                if n > self.limit:
                    return await self._reply(send, 413, f"the body is {n} bytes, over the "
                                             f"cap of {self.limit}")
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._reply(send, 413, f"the body is over the cap of {self.limit} "
                                         "bytes")
            if not msg.get("more_body"):
                break
        body, done = b"".join(chunks), False

        async def replay():
            nonlocal done
            if done:
                return await receive()
            done = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    async def _reply(self, send, status, message):
        import json

        kind = "too_large" if status == 413 else "bad_request"
        data = json.dumps({"error": {"kind": kind, "field": "body", "message": message}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})


# -- mapping corral's errors onto statuses -----------------------------------------------------
def _status_of(e: CorralError) -> int:
    from ..runtime.files import FileNotFound, FilesError
    from ..runtime.session import ContextError

    if isinstance(e, FileNotFound):
        return 404
    if isinstance(e, (PolicyError, UsageError, FilesError)):
        return 400
    if isinstance(e, (UnsupportedRule, BackendUnavailable)):
        return 422
    if isinstance(e, ContextError):
        return 409
    return 500


def _policy_view(policy) -> dict:
    """The effective policy as JSON, secrets by name and hosts only (never a source)."""
    import tomllib

    from ..policy.dump import dump_toml

    data = tomllib.loads(dump_toml(policy))
    for name, table in (data.get("secrets") or {}).items():
        data["secrets"][name] = {k: v for k, v in table.items() if k in ("hosts", "ttl",
                                                                          "plain_http")}
    return data


def auth(request: Request) -> Token:
    """The live token a request carries (401 otherwise): read from the state dir each time,
    so a revocation counts from the next request."""
    h = request.headers.get("authorization", "")
    scheme, _, value = h.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise ApiError(401, "auth", "missing bearer token: send Authorization: Bearer "
                       "TOKEN (corral token create)", "authorization",
                       {"WWW-Authenticate": "Bearer"})
    t = request.app.state.tokens.verify(value.strip())
    if t is None:
        raise ApiError(401, "auth", "the token is not valid (unknown or revoked)",
                       "authorization", {"WWW-Authenticate": "Bearer"})
    request.app.state.rates.admit(t.name, t.rate, t.burst)   # Limited: 429 (limits.py)
    return t


Auth = Annotated[Token, Depends(auth)]


def create_app(state_dir: str | None = None, *, opener=None, body_max: int = BODY_MAX,
               config=None):
    """The ASGI app. `opener(policy) -> sandbox` (registry.open_sandbox by default);
    `config`: a config.Config (the server's [limits], [secrets] and --mcp)."""
    from .config import Config

    config = config if config is not None else Config()
    tokens = TokenStore(state_dir, config.limits)
    registry = Registry(opener) if opener is not None else Registry()
    metrics = Metrics()
    busy = Concurrency()
    quota = Quota()

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def _lifespan(app):
        yield
        n = registry.close_all()     # the service's end is every sandbox's end
        log.info("corral serve: shut down, %d sandbox(es) killed", n)

    app = FastAPI(title="corral", version=_version(), description=(
        "Self-hosted sandboxes for code that AI assistants write. Authenticate with "
        "`Authorization: Bearer TOKEN` (corral token create)."),
        lifespan=_lifespan)
    app.state.registry = registry
    app.state.tokens = tokens
    app.state.rates = RateLimiter()
    app.state.busy = busy
    app.state.quota = quota
    app.state.config = config

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return _error(e.status, e.kind, e.message, e.field, e.headers)

    @app.exception_handler(Limited)
    async def _limited(request, e: Limited):
        return _error(429, "rate", e.message, e.field, {"Retry-After": str(e.retry_after)})

    @app.exception_handler(Exceeds)
    async def _exceeds(request, e: Exceeds):
        return _error(403, "ceiling", e.message, e.field)

    @app.exception_handler(CorralError)
    async def _corral(request, e: CorralError):
        return _error(_status_of(e), e.kind, e.message, e.field)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.exception("corral serve: %s %s failed", request.method, request.url.path)
        return _error(500, "internal", "the server failed on this request (its log says "
                      "why)", None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        first = (e.errors() or [{}])[0]
        loc = list(first.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        loc = ".".join(str(x) for x in loc) or None
        return _error(422, "invalid", first.get("msg", "invalid request"), loc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e: StarletteHTTPException):
        kind = {404: "not_found", 405: "method"}.get(e.status_code, "http")
        headers = dict(getattr(e, "headers", None) or {})
        if e.status_code == 405:
            from .openapi import allowed

            headers["Allow"] = allowed(request)
        return _error(e.status_code, kind, str(e.detail), None, headers)

    @app.middleware("http")
    async def _count(request: Request, call_next):
        response = await call_next(request)
        with metrics.mu:
            metrics.requests[response.status_code] = metrics.requests.get(
                response.status_code, 0) + 1
        return response

    def entry(sid: str, token: Token):
        e = registry.get(token.name, sid)
        if e is None:
            raise ApiError(404, "not_found", f"no sandbox {sid!r}", "sandbox_id")
        return e

    class _Busy:
        """One operation of a token in flight; over max_concurrent: 429."""

        def __init__(self, token: Token) -> None:
            self.token = token

        def __enter__(self):
            busy.enter(self.token.name, self.token.max_concurrent)   # Limited: 429

        def __exit__(self, *exc):
            busy.leave(self.token.name)

    # -- routes -------------------------------------------------------------------------------
    @app.get("/health", tags=["service"])
    def health():
        return {"ok": True, "sandboxes": registry.count()}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics_text():
        return PlainTextResponse(metrics.text(registry.count()),
                                 media_type="text/plain; version=0.0.4")

    @app.post("/sandboxes", status_code=201, tags=["sandboxes"])
    def create(body: CreateBody, token: Auth):
        policy = _requested(body.policy, token, config)
        with quota.reserve(token.name, token.max_sandboxes,       # Limited: 429
                           lambda: registry.count(token.name)), _Busy(token):
            e = registry.create(token.name, policy)
        with metrics.mu:
            metrics.created += 1
        log.info("sandbox %s created for token %s (%s)", e.id, token.name,
                 e.sandbox.isolation)
        return _view(e)

    @app.get("/sandboxes", tags=["sandboxes"])
    def list_(token: Auth):
        return {"sandboxes": [_view(e) for e in registry.list(token.name)]}

    @app.get("/sandboxes/{sid}", tags=["sandboxes"])
    def get(sid: str, token: Auth):
        return _view(entry(sid, token))

    @app.delete("/sandboxes/{sid}", tags=["sandboxes"])
    def kill(sid: str, token: Auth):
        if not registry.remove(token.name, sid):
            raise ApiError(404, "not_found", f"no sandbox {sid!r}", "sandbox_id")
        log.info("sandbox %s killed", sid)
        return {"killed": sid}

    @app.post("/sandboxes/{sid}/exec", tags=["commands"], responses={200: {"content": {
        "application/x-ndjson": {}}, "description": "the Result; with stream=ndjson, one "
        "JSON object a line: {\"stdout\": text} and {\"stderr\": text} chunks as they "
        "come, then {\"result\": Result}"}})
    def exec_(sid: str, body: ExecBody, token: Auth,
              stream: Literal["none", "ndjson"] = "none"):
        if (body.argv is None) == (body.cmd is None):
            raise ApiError(400, "usage", "give argv (a list) or cmd (a shell line), one of "
                           "them", "argv")
        argv = body.argv if body.argv is not None else ["/bin/sh", "-c", body.cmd]
        e = entry(sid, token)
        stdin = body.stdin.encode() if body.stdin is not None else None
        if stream == "ndjson":
            return _stream(e, token, argv, stdin, body.timeout)
        with _Busy(token), e.lock:
            t0 = time.monotonic()
            result = e.sandbox.exec(argv, stdin=stdin, timeout=body.timeout)
        metrics.run(result.verdict, time.monotonic() - t0)
        return result.to_dict()

    def _stream(e, token, argv, stdin, timeout):
        """The command's output as NDJSON lines while it runs, then its Result."""
        import json
        import queue

        from fastapi.responses import StreamingResponse

        from ..runtime.sandbox import TextChunks

        busy_slot = _Busy(token)
        busy_slot.__enter__()       # 429 now, before the 200 and its stream begin
        q: queue.Queue = queue.Queue(maxsize=256)   # a slow reader slows the command's reads

        def run():
            try:
                with e.lock:
                    t0 = time.monotonic()
                    r = e.sandbox.exec(
                        argv, stdin=stdin, timeout=timeout,
                        on_stdout=TextChunks(lambda t: q.put({"stdout": t})),
                        on_stderr=TextChunks(lambda t: q.put({"stderr": t})))
                metrics.run(r.verdict, time.monotonic() - t0)
                q.put({"result": r.to_dict()})
            except CorralError as err:
                q.put({"error": err.to_dict()})
            except Exception as err:   # noqa: BLE001 - the stream must end with a line
                q.put({"error": {"kind": "internal", "field": None, "message": str(err)}})
            finally:
                busy_slot.__exit__(None, None, None)
                q.put(None)

        threading.Thread(target=run, daemon=True, name=f"exec-{e.id}").start()

        def lines():
            while (item := q.get()) is not None:
                yield json.dumps(item) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/sandboxes/{sid}/run_code", tags=["code"])
    def run_code(sid: str, body: CodeBody, token: Auth):
        e = entry(sid, token)
        with _Busy(token), e.lock:
            t0 = time.monotonic()
            ex = e.sandbox.run_code(body.code, language=body.language, timeout=body.timeout)
        metrics.run("error" if ex.error else "ok", time.monotonic() - t0)
        return ex.to_dict()

    @app.get("/sandboxes/{sid}/files", tags=["files"])
    def read(sid: str, path: str, token: Auth,
             encoding: Literal["utf-8", "base64"] = "utf-8"):
        e = entry(sid, token)
        with e.files_lock:
            data = e.sandbox.files.read(path, format="bytes")
        if encoding == "base64":
            return {"path": path, "encoding": "base64",
                    "content": base64.b64encode(data).decode()}
        return {"path": path, "encoding": "utf-8",
                "content": data.decode("utf-8", errors="replace")}

    @app.put("/sandboxes/{sid}/files", tags=["files"])
    def write(sid: str, body: WriteBody, token: Auth):
        e = entry(sid, token)
        if body.encoding == "base64":
            try:
                data = base64.b64decode(body.content, validate=True)
            except ValueError:
                raise ApiError(400, "invalid", "content is not base64", "content") from None
        else:
            data = body.content.encode()
        with e.files_lock:
            info = e.sandbox.files.write(body.path, data)
        return info.to_dict()

    @app.get("/sandboxes/{sid}/files/list", tags=["files"])
    def list_files(sid: str, token: Auth, path: str = ".",
                   depth: Annotated[int, Query(ge=1, le=16, description="levels to "
                                               "descend, 1 to 16")] = 1):
        e = entry(sid, token)
        with e.files_lock:
            entries = e.sandbox.files.list(path, depth=depth)
        return {"entries": [x.to_dict() for x in entries]}

    @app.get("/sandboxes/{sid}/explain", tags=["explain"])
    def explain_sandbox(sid: str, token: Auth):
        from ..runtime.explain import explain

        return explain(entry(sid, token).policy)

    @app.post("/explain", tags=["explain"])
    def explain_policy(body: ExplainBody, token: Auth):
        from ..runtime.explain import explain

        return explain(_requested(body.policy, token, config))

    from .openapi import document

    document(app)                  # the error statuses and the bearer scheme (openapi.py)
    asgi = app
    if config.mcp:
        from .mcp_http import mount

        asgi = mount(app)          # /mcp: the MCP tools behind the same tokens (mcp_http.py)
    return BodyCap(asgi, body_max) if body_max else asgi


def _requested(raw: dict, token: Token, config):
    """The policy `raw` asks for within the token's ceiling, the ceiling's secrets given
    their sources from the server config (config.with_sources)."""
    from .config import with_sources

    return requested(raw, with_sources(token.ceiling, config.secrets))


def _view(e) -> dict:
    return {"id": e.id, "isolation": e.sandbox.isolation, "created": e.created,
            "policy": _policy_view(e.policy)}


def _version() -> str:
    from .. import __version__

    return __version__


def serve(config) -> int:
    """Run the service for a config.Config (host and port filled) until SIGTERM/SIGINT."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = create_app(config.state_dir, config=config)
    tls = {}
    if config.tls_cert is not None:
        tls = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
    log.info("corral serve: %s://%s:%d%s", "https" if tls else "http", config.host,
             config.port, " (MCP at /mcp)" if config.mcp else "")
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, **tls)
    return 0
