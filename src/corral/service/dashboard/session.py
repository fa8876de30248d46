"""Dashboard logins: a browser pastes its token once and gets a session cookie.

- The cookie holds a random session id (32 bytes), never the token. The server keeps, in
  memory only, the id's sha256 -> (the token's name and sha256, when it was made, when last
  used). Nothing about a session is written to disk; a restart logs everyone out.
- The cookie is HttpOnly, SameSite=Strict, Path=/, and Secure (with the `__Host-` name
  prefix) when the service speaks TLS.
- Every request re-checks the token behind the session against the token file: a revoked
  token ends its sessions at once. A session lasts MAX_AGE at most, IDLE without use.
- The pages are GET and change nothing. The two POSTs (log in, log out) must be
  same-origin: an Origin header equal to this server's origin (or, without one, a
  Referer on it); anything else is 403. The JSON API never takes the cookie: it stays
  bearer-only, so no state-changing route can be reached with a browser's ambient
  credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

MAX_AGE = 12 * 3600
IDLE = 2 * 3600
MAX_SESSIONS = 4096
COOKIE = "corral_session"
COOKIE_TLS = "__Host-corral_session"


class Viewer:
    """Who a page is for: a live token's name, whether it is admin, and so whose runs it
    sees (`actor`: None for every token's)."""

    def __init__(self, token) -> None:
        self.name = token.name
        self.owner = token.owner
        self.admin = token.admin
        self.actor = None if token.admin else f"token:{token.name}"

    def sees(self, owner: str) -> bool:
        """Whether its pages show a sandbox of `owner` (a registry owner: a token's
        name and id, not a name another token may have had before)."""
        return self.admin or owner == self.owner


class Sessions:
    def __init__(self) -> None:
        self._mu = threading.Lock()
        #: sha256(session id) -> [token name, token sha256, created, last used]
        self._by: dict[str, list] = {}

    def create(self, token) -> str:
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._mu:
            self._expire(now)
            while len(self._by) >= MAX_SESSIONS:      # the oldest goes first
                del self._by[min(self._by, key=lambda k: self._by[k][2])]
            self._by[_h(sid)] = [token.name, token.sha256, now, now]
        return sid

    def lookup(self, sid: str | None, tokens):
        """The live Token behind a session id, or None (unknown, expired, the token
        revoked or replaced). Marks it used."""
        if not sid or len(sid) > 100:
            return None
        key, now = _h(sid), time.monotonic()
        with self._mu:
            s = self._by.get(key)
            if s is None:
                return None
            if now - s[2] > MAX_AGE or now - s[3] > IDLE:
                del self._by[key]
                return None
            s[3] = now
            name, sha = s[0], s[1]
        for t in tokens.current():
            if t.name == name and not t.revoked and hmac.compare_digest(t.sha256, sha):
                return t
        self.end(sid)
        return None

    def end(self, sid: str | None) -> None:
        if sid:
            with self._mu:
                self._by.pop(_h(sid), None)

    def _expire(self, now: float) -> None:
        for k in [k for k, s in self._by.items()
                  if now - s[2] > MAX_AGE or now - s[3] > IDLE]:
            del self._by[k]


def _h(sid: str) -> str:
    return hashlib.sha256(sid.encode("ascii", "replace")).hexdigest()


def cookie_name(request) -> str:
    return COOKIE_TLS if request.url.scheme == "https" else COOKIE


def session_id(request) -> str | None:
    return request.cookies.get(cookie_name(request))


def set_cookie(response, request, sid: str) -> None:
    tls = request.url.scheme == "https"
    response.set_cookie(cookie_name(request), sid, max_age=MAX_AGE, path="/", secure=tls,
                        httponly=True, samesite="strict")


def clear_cookie(response, request) -> None:
    tls = request.url.scheme == "https"
    response.delete_cookie(cookie_name(request), path="/", secure=tls, httponly=True,
                           samesite="strict")


def origin_of(request) -> str:
    host = request.headers.get("host", "")
    return f"{request.url.scheme}://{host}"


def same_origin(request) -> bool:
    """A POST from one of this server's own pages: its Origin is ours (browsers send it on
    every POST); without an Origin, its Referer is on ours; neither: refused."""
    mine = origin_of(request)
    origin = request.headers.get("origin")
    if origin is not None:
        return hmac.compare_digest(origin.encode(), mine.encode())
    ref = request.headers.get("referer")
    return ref is not None and (ref == mine or ref.startswith(mine + "/"))


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this server, nothing else (no open
    redirect: "//host", "/\\host", a scheme, control characters are all "/")."""
    if not isinstance(target, str) or not target.startswith("/") or len(target) > 2000:
        return "/"
    if target.startswith(("//", "/\\")) or any(ord(c) < 0x21 or c == "\\" for c in target):
        return "/"
    return target
