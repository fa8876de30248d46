"""E2B's wire protocol on `corral serve`: the official `e2b` and `e2b-code-interpreter`
SDKs, unmodified, drive corral's live sandboxes with

    E2B_API_URL=http://HOST:PORT  E2B_SANDBOX_URL=http://HOST:PORT  E2B_API_KEY=<a corral token>

One port serves both faces. A request is E2B's when it carries `E2b-Sandbox-Port` (the
data plane: 49983 envd, 49999 the code interpreter; `E2b-Sandbox-Id` names the sandbox) or
`X-API-Key` (the control plane); every other request is the native API's (`Authorization:
Bearer`). The E2B face reuses the service's registry, tokens, ceilings, caps and errors:
an E2B sandbox is a native one (GET /sandboxes lists it under the same token), and every
command is a run of its CommandTable, audited and counted like any other.

- control.py: the REST control plane (/v2/sandboxes, /sandboxes/{id}, ...);
- connect.py: envd's Connect RPC framing (JSON codec) and process.Process;
- fs.py: filesystem.Filesystem and envd's plain-HTTP /files;
- interp.py: the code interpreter's /execute (NDJSON) and /contexts.

See docs/e2b.md for what maps to what and what is refused.
"""

from __future__ import annotations

ENVD_PORT = b"49983"
JUPYTER_PORT = b"49999"
#: E2B_DEBUG mode's ports (corral serve --e2b-debug TOKEN_NAME listens on them too)
DEBUG_PORTS = (49983, 49999)


class Dispatch:
    """ASGI: E2B's requests to the E2B apps, the rest to the native app."""

    def __init__(self, native, svc, *, debug_owner: str | None = None) -> None:
        import os

        from . import connect, control, interp
        from .state import E2bState

        self.native = native
        self.state = E2bState(svc, debug_owner=debug_owner)
        #: E2B_DOMAIN mode behind a TLS reverse proxy: host names api.DOMAIN and
        #: PORT-ID.DOMAIN (CORRAL_E2B_DOMAIN names DOMAIN) stand for the headers
        d = (os.environ.get("CORRAL_E2B_DOMAIN") or "").strip().lower().strip(".")
        self.domain = ("." + d).encode() if d else None
        self.control = control.app(self.state)
        self.envd = connect.app(self.state)
        self.interp = interp.app(self.state)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.domain is not None:
            scope = self._by_host(scope)
        if scope["type"] == "http":
            port = api = None
            for k, v in scope["headers"]:
                if k == b"e2b-sandbox-port":
                    port = v
                elif k == b"x-api-key":
                    api = v
            local = (scope.get("server") or (None, None))[1]
            if self.state.debug_owner and local in DEBUG_PORTS:
                # E2B_DEBUG mode: the SDK calls localhost:49983 and :49999 directly
                port = ENVD_PORT if local == DEBUG_PORTS[0] else JUPYTER_PORT
            if port is not None:
                app = self.interp if port == JUPYTER_PORT else self.envd
                if port not in (ENVD_PORT, JUPYTER_PORT):
                    from .state import plain_error

                    return await plain_error(send, 400, "E2b-Sandbox-Port: corral serves "
                                             "49983 (envd) and 49999 (code interpreter)")
                return await app(scope, receive, send)
            if api is not None:
                return await self.control(scope, receive, send)
        return await self.native(scope, receive, send)

    def _by_host(self, scope):
        """PORT-ID.DOMAIN: the scope with E2b-Sandbox-Port and E2b-Sandbox-Id set from the
        host name (what a client sent in those headers is dropped); api.DOMAIN: as is."""
        host = next((v for k, v in scope["headers"] if k == b"host"), b"").lower()
        host = host.rsplit(b":", 1)[0] if host.count(b":") == 1 else host
        if not host.endswith(self.domain):
            return scope
        label = host[:-len(self.domain)]
        port, dash, sid = label.partition(b"-")
        if not dash or port not in (ENVD_PORT, JUPYTER_PORT) or not sid or len(sid) > 64 \
                or not all(c in b"abcdefghijklmnopqrstuvwxyz0123456789_" for c in sid):
            return scope
        headers = [(k, v) for k, v in scope["headers"]
                   if k not in (b"e2b-sandbox-port", b"e2b-sandbox-id")]
        headers += [(b"e2b-sandbox-port", port), (b"e2b-sandbox-id", sid)]
        return {**scope, "headers": headers}
