"""What the E2B face keeps beside the service's registry: each E2B sandbox's envd access
token (a random secret minted at create, the SDK's `envdAccessToken`: every data-plane
call must carry it as X-Access-Token), its template name and its sandbox-wide envVars.
Authentication of both planes lives here."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import threading
import time

from ..common import ApiError

#: the envd version corral answers as: every feature gate of the 2.63 SDK on
ENVD_VERSION = "0.6.4"
#: the SDK's default cwd and home
HOME = "/home/user"
#: the sandbox id the SDK uses in E2B_DEBUG mode
DEBUG_ID = "debug_sandbox_id"


class Face:
    """One E2B sandbox: the registry entry's id and owner, and the E2B-only parts."""

    def __init__(self, sid: str, owner: str, template: str, envs: dict[str, str], *,
                 account: bool = False, tier: str = "namespace") -> None:
        self.sid, self.owner, self.template, self.envs = sid, owner, template, envs
        #: whether the sandbox has the unprivileged account "user" (uid 1000, HOME), and
        #: its tier (named when "user" is refused)
        self.account, self.tier = account, tier
        self.access_token = "ea_" + secrets.token_urlsafe(24)
        self.started = time.time()
        self.watchers: dict = {}      # CreateWatcher's, by id
        self.ptys: dict = {}          # terminals (e2b/pty.py), by pid inside


class E2bState:
    def __init__(self, svc, *, debug_owner: str | None = None) -> None:
        import os

        from .control import load_templates

        self.svc = svc
        #: E2B_DEBUG mode: the token name whose one sandbox "debug_sandbox_id" stands for
        self.debug_owner = debug_owner
        self._debug_mu = threading.Lock()
        #: Idempotency-Key of a create: (token name, key) -> sandbox id, oldest first
        self.idem: dict[tuple[str, str], str] = {}
        #: (token name, key) -> [its lock, creates holding or waiting for it]: only keys
        #: with a create under way (the event loop's alone: no thread touches it)
        self._idem_locks: dict[tuple[str, str], list] = {}
        self.templates = load_templates(os.environ.get("CORRAL_E2B_TEMPLATES"))
        self._faces: dict[str, Face] = {}
        self._mu = threading.Lock()

    @contextlib.asynccontextmanager
    async def idem_lock(self, owner: str, key: str):
        """The lock of one Idempotency-Key of one token, for a create's check and make:
        a slow create holds up only retries of its own key (not every token's creates),
        and the lock goes once no create holds or waits for it."""
        k = (owner, key)
        held = self._idem_locks.get(k)
        if held is None:
            held = self._idem_locks[k] = [asyncio.Lock(), 0]
        held[1] += 1
        try:
            async with held[0]:
                yield
        finally:
            held[1] -= 1
            if held[1] == 0:
                del self._idem_locks[k]

    def add(self, face: Face) -> None:
        with self._mu:
            self._faces[face.sid] = face

    def face(self, sid: str) -> Face | None:
        with self._mu:
            return self._faces.get(sid)

    def drop(self, sid: str) -> None:
        with self._mu:
            face = self._faces.pop(sid, None)
        for w in (face.watchers.values() if face is not None else ()):
            w.stop()

    def api_token(self, headers):
        """The corral token X-API-Key carries (401 otherwise)."""
        t = self.svc.tokens.verify((headers.get("x-api-key") or "").strip())
        if t is None:
            raise ApiError(401, "auth", "X-API-Key is not a valid corral token (unknown or "
                           "revoked): set E2B_API_KEY to one (corral token create)",
                           "X-API-Key")
        return t

    def sandbox(self, request):
        """(entry, face) a data-plane call names: E2b-Sandbox-Id and its X-Access-Token;
        the token that made it still live. 404 for no such sandbox or a wrong token (one
        answer: no oracle for ids)."""
        headers = request.headers
        sid = headers.get("e2b-sandbox-id") or ""
        local = (request.scope.get("server") or (None, None))[1]
        if self.debug_owner and sid == DEBUG_ID and local in (49983, 49999):
            return self._debug()
        face = self.face(sid)
        # envd's calls carry X-Access-Token; the code interpreter's context calls only
        # E2B-Traffic-Access-Token (create answers the same secret as both)
        given = headers.get("x-access-token") or headers.get("e2b-traffic-access-token") \
            or ""
        if face is None or not hmac.compare_digest(face.access_token.encode(),
                                                   given.encode()):
            raise ApiError(404, "not_found", f"no sandbox {sid[:64]!r} (or a wrong "
                           "X-Access-Token)", "E2b-Sandbox-Id")
        if not self._owner_live(face.owner):
            raise ApiError(401, "auth", "the token that made this sandbox was revoked",
                           "X-Access-Token")
        e = self.svc.registry.get(face.owner, sid)
        if e is None:
            self.drop(sid)
            raise ApiError(404, "not_found", f"sandbox {sid[:64]!r} has ended",
                           "E2b-Sandbox-Id")
        return e, face

    def _debug(self):
        """E2B_DEBUG mode's one sandbox (the SDK names it "debug_sandbox_id" and sends no
        access token): made on first use, made again once it has ended, as the token
        named by --e2b-debug, within its ceiling."""
        with self._debug_mu:
            t = next((t for t in self.svc.tokens.load() if t.name == self.debug_owner
                      and not t.revoked), None)
            if t is None:
                raise ApiError(401, "auth", f"--e2b-debug names the token "
                               f"{self.debug_owner!r}, which is not live", "token")
            face = self.face(DEBUG_ID)
            e = self.svc.registry.get(t.owner, face.sid) if face is not None else None
            if e is None:
                from ..common import requested_policy

                policy = requested_policy(self.templates["base"], t, self.svc)
                account = _account_for(policy)
                from ..limits import Limited

                try:    # the token's max_sandboxes and the server's, as any create
                    with self.svc.reserve(t):
                        e = self.svc.registry.create(t.owner, policy, timeout=3600.0,
                                                     user_account=account, face="e2b")
                except Limited as err:
                    raise ApiError(429, "rate", err.message, err.field,
                                   {"Retry-After": str(err.retry_after)}) from None
                face = Face(e.id, t.owner, "base", {}, account=account,
                            tier=policy.isolation)
                with self._mu:
                    self._faces[DEBUG_ID] = face
            return e, face

    def _owner_live(self, owner: str) -> bool:
        return any(t.owner == owner and not t.revoked for t in self.svc.tokens.load())

    def user(self, headers, face) -> str | None:
        """envd's user (Authorization: Basic base64("NAME:")): None (no header) or "root",
        the sandbox's own root (corral's default); "user", its unprivileged account (uid
        1000, HOME /home/user), which a sandbox on the namespace tier has (corral as
        root). Any other name, or "user" where there is no account, is refused (fail
        closed: never a silent root)."""
        import base64

        h = headers.get("authorization") or ""
        scheme, _, value = h.partition(" ")
        if not h:
            return None
        name = "?"
        if scheme.lower() == "basic":
            try:
                name = base64.b64decode(value, validate=True).decode().partition(":")[0]
            except (ValueError, UnicodeDecodeError):
                name = "?"
        if name in ("", "root"):
            return "root" if name else None
        if name != "user":
            raise ApiError(400, "unsupported", f"user {name[:32]!r}: a sandbox has the "
                           "users \"root\" (its own root, unprivileged on the host) and "
                           "\"user\" (uid 1000 inside)", "user")
        if not face.account:
            raise ApiError(400, "unsupported", f"user \"user\": this sandbox runs on the "
                           f"{face.tier} tier, which has no unprivileged account inside; the "
                           "namespace tier has one (corral serve as root). Ask for "
                           "user=\"root\" or leave it out", "user")
        return "user"


def _account_for(policy) -> bool:
    """Whether an E2B sandbox of this policy gets the unprivileged account "user": on the
    namespace tier when corral runs as root (it maps a second uid; other tiers cannot)."""
    import os

    return policy.isolation == "namespace" and os.geteuid() == 0


async def plain_error(send, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def strict_json(raw: bytes, what: str) -> dict:
    """A JSON object from a request body (400 naming `what` otherwise)."""
    try:
        d = json.loads(raw or b"{}")
    except ValueError:
        raise ApiError(400, "invalid", f"{what}: the body is not JSON", what) from None
    if not isinstance(d, dict):
        raise ApiError(400, "invalid", f"{what}: the body is not a JSON object", what)
    return d
