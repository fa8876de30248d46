"""`corral serve --mcp`: corral's MCP tools (mcp.py) over streamable HTTP at /mcp, in the
same process and behind the same bearer tokens as the REST API.

A request to /mcp carries `Authorization: Bearer TOKEN` like any other: no token, a wrong
or revoked one is 401 (the REST API's JSON error), a token over its rate 429. The token
decides everything else: its ceiling bounds every sandbox a tool makes, its
max_sandboxes and max_concurrent count the sandboxes and commands of both faces together,
and its sandboxes are the REST API's (the same registry, the token's name as owner), so
an agent can make one over MCP and a program read its files over REST. An MCP session is
bound to the token that opened it (the SDK answers 404 to another token); its own lazy
sandbox is killed when the session ends (the client's DELETE, the SDK's idle timeout, or
the server's end). A client of protocol 2026-07-28 has no session (each POST stands
alone): its calls without a sandbox_id share the token's own sandbox, killed after
IDLE_S unused, by kill_sandbox, or at the server's end.

The official SDK's StreamableHTTPSessionManager does the protocol; it runs inside the
FastAPI app's lifespan. Its DNS-rebinding check (Host and Origin headers) is off: it
guards servers that trust whoever can reach them, and this one trusts only a bearer
token, which a browser tricked by DNS rebinding does not have; a reverse proxy in front
may then keep its own host name.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager

log = logging.getLogger("corral.serve")

PATHS = ("/mcp", "/mcp/")
#: seconds a sessionless client's own sandbox lives unused (protocol 2026-07-28 has no
#: sessions: the token's own sandbox stands in for the session's)
IDLE_S = 1800


def mount(app):
    """Wrap the FastAPI `app` (create_app's, its state filled) so that /mcp is the MCP
    endpoint; returns the ASGI app to serve."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
    from mcp.server.transport_security import TransportSecuritySettings

    from .config import with_sources
    from .limits import Limited
    from .mcp import Caller, build

    svc = app.state.service
    config = svc.config

    def caller(ctx) -> Caller:
        req = ctx.request_context.request
        tok = req.scope.get("corral.token") if req is not None else None
        if tok is None:         # every request reaching the SDK went through guarded()
            raise ToolError("no token on this request")
        sid = req.headers.get("mcp-session-id") or "-"
        return Caller(tok.owner, with_sources(tok.ceiling, config.secrets),
                      f"{tok.owner}/{sid}", tok)

    server, _ = build(registry=svc.registry, caller=caller, busy=svc.busy,
                      quota=svc.quota, metrics=svc.metrics, running=svc.running)
    server.streamable_http_app(transport_security=TransportSecuritySettings(
        enable_dns_rebinding_protection=False))
    manager = server.session_manager
    endpoint = StreamableHTTPASGIApp(manager)

    before = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        async with manager.run():
            async with before(a) as st:     # the service's end kills every sandbox
                yield st

    app.router.lifespan_context = lifespan

    def sweep() -> None:
        """Kill the own sandbox of every session the SDK no longer holds (ended by the
        client's DELETE or its idle timeout), and a sessionless client's after IDLE_S
        unused."""
        live = getattr(manager, "_server_instances", None)
        for key in list(server.corral_defaults):
            name, tid, sid = key.split("/", 2)      # the owner is "NAME/ID" (tokens.py)
            owner = f"{name}/{tid}"
            if sid == "-" and server.corral_idle(key) > IDLE_S or \
                    sid != "-" and live is not None and sid not in live:
                server.corral_end_session(key, owner)

    async def refuse(send, status: int, kind: str, field: str, message: str,
                     headers=()) -> None:
        body = json.dumps({"error": {"kind": kind, "field": field,
                                     "message": message}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    async def guarded(scope, receive, send) -> None:
        import anyio

        auth = ""
        for k, v in scope.get("headers", ()):
            if k == b"authorization":
                auth = v.decode("latin-1")
        scheme, _, value = auth.partition(" ")
        www = [(b"www-authenticate", b"Bearer")]
        if scheme.lower() != "bearer" or not value.strip():
            return await refuse(send, 401, "auth", "authorization", "missing bearer token: "
                                "send Authorization: Bearer TOKEN (corral token create)", www)
        tok = await anyio.to_thread.run_sync(svc.tokens.verify, value.strip())
        if tok is None:
            return await refuse(send, 401, "auth", "authorization",
                                "the token is not valid (unknown or revoked)", www)
        try:
            svc.rates.admit(tok.name, tok.rate, tok.burst)
        except Limited as e:
            return await refuse(send, 429, "rate", e.field, e.message,
                                [(b"retry-after", str(e.retry_after).encode())])
        scope = dict(scope)
        scope["user"] = AuthenticatedUser(AccessToken(token=tok.sha256, client_id=tok.name,
                                                      subject=tok.sha256, scopes=[]))
        scope["corral.token"] = tok
        scope["path"] = "/mcp"
        try:
            await endpoint(scope, receive, send)
        finally:
            await anyio.to_thread.run_sync(sweep)

    async def asgi(scope, receive, send):
        if scope["type"] == "http" and scope.get("path") in PATHS:
            return await guarded(scope, receive, send)
        return await app(scope, receive, send)

    asgi.state = app.state          # as the FastAPI app's, for whoever holds the wrapper
    return asgi
