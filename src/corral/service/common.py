"""What the service's routes share: the JSON error, the bearer-token dependency, the
service's state (tokens, sandboxes, metrics, in-flight counts) as a dependency, and the
views of a sandbox and its policy. The routes live in routes/, one module a resource."""

from __future__ import annotations

import copy
import re
from typing import Annotated

from fastapi import Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.requests import HTTPConnection

from ..errors import (
    BackendUnavailable,
    CorralError,
    ImageError,
    PolicyError,
    SandboxClosed,
    SandboxSetupError,
    UnsupportedRule,
    UsageError,
)
from .ceiling import requested
from .tokens import Token


class ErrorDetail(BaseModel):
    kind: str
    field: str | None = None
    message: str
    step: str | None = None     # a setup error's step (SandboxSetupError.step)


class ErrorBody(BaseModel):
    """Every error's body."""

    error: ErrorDetail


def errors(*statuses: int) -> dict:
    """OpenAPI `responses` for these error statuses, each the JSON error body."""
    what = {400: "a bad request (field names it)", 401: "no valid bearer token",
            403: "beyond the token's ceiling (field names the rule)",
            404: "no such sandbox, command or file (or another token's)",
            409: "the sandbox ended, a command still running, a closed stdin, a review "
                 "that cannot be read", 413: "the body is over the cap",
            422: "the body does not match the schema, the tier cannot enforce the "
                 "policy, or the policy names an image this server does not have", 429: "a token's limit (Retry-After)",
            503: "the service is shutting down"}
    return {s: {"model": ErrorBody, "description": what[s]} for s in statuses}


#: what every route behind a token may answer
COMMON_ERRORS = errors(400, 401, 404, 409, 413, 422, 429)


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, field: str | None = None,
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.field = status, kind, message, field
        self.headers = headers or {}


_SURROGATE = re.compile("[\ud800-\udfff]")
_LONE_HIGH = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def error(status: int, kind: str, message: str, field: str | None = None,
          headers: dict | None = None, step: str | None = None) -> JSONResponse:
    """The JSON error every route answers; `step` only for a setup error (where building
    the sandbox failed: SandboxSetupError.step), so the SDK raises it with the same step."""
    body = {"kind": kind, "field": field, "message": message}
    if step is not None:
        body["step"] = step
    return SafeJSONResponse({"error": body}, status_code=status, headers=headers)


def corral_error(e: CorralError) -> JSONResponse:
    """A CorralError as the API answers it (its status, kind, field; a setup step)."""
    return error(status_of(e), e.kind, e.message, e.field,
                 step=getattr(e, "step", None) if isinstance(e, SandboxSetupError) else None)


# -- names that are not UTF-8 -----------------------------------------------------------------
# A sandbox names its files with any bytes but "/" and NUL; the files API (runtime/files.py)
# gives a byte that is not UTF-8 as a surrogate escape (U+DC80-U+DCFF, os.fsdecode's), which
# no JSON, protobuf or UTF-8 answer can carry. On the wire each such path component is
# written quoted: `"` + the component with `\\xNN` for each such byte, `\\\\` for a
# backslash and `\\"` for a quote + `"` (the byte 0xff in /scratch is `/scratch/"\\xff"`).
# A component that itself starts and ends with `"` is quoted too, so every name has one
# written form and back: a path sent in is read the same way, component by component.
_QUOTE_OUT = {0x5C: "\\\\", 0x22: '\\"', **{c: f"\\x{c & 0xFF:02x}"
                                            for c in range(0xDC80, 0xDD00)}}


def _quoted(c: str) -> bool:
    return len(c) >= 2 and c[0] == '"' and c[-1] == '"'


def wire_name(path: str) -> str:
    """A path or name from the sandbox as the API writes it: as it is, but for each
    component with a byte that is not UTF-8 (or shaped "...") written quoted."""
    if not isinstance(path, str):
        return path
    if not _SURROGATE.search(path) and '"' not in path:
        return path
    out = []
    for c in path.split("/"):
        if _SURROGATE.search(c) or _quoted(c):
            # a surrogate that stands for no byte is not from a file name: U+FFFD
            c = '"' + _LONE_HIGH.sub("\ufffd", c).translate(_QUOTE_OUT) + '"'
        out.append(c)
    return "/".join(out)


def local_name(path: str, field: str = "path") -> str:
    """A path sent in, its quoted components (wire_name's form) made the sandbox's names
    again; a quoted component that is not well formed is a FilesError (400) naming the
    field. A lone surrogate that is no surrogate escape (JSON may send one) stands for no
    byte of a name: a FilesError naming the field too."""
    if not isinstance(path, str):
        return path
    lone = _LONE_HIGH.search(path)
    if lone is not None:
        from ..runtime.files import FilesError

        raise FilesError(f"the path holds a lone surrogate (U+{ord(lone.group()):04X}) that "
                         "stands for no byte: send text, or a name as the API lists it",
                         path=field)
    if '"' not in path:
        return path
    return "/".join(_unquote(c, field) if _quoted(c) else c for c in path.split("/"))


def _unquote(c: str, field: str) -> str:
    from ..runtime.files import FilesError

    def bad(why: str):
        return FilesError(f"the quoted name {c[:80]!r} {why}: write a byte that is "
                          'not UTF-8 as \\xNN, a backslash as \\\\ and a quote as \\" '
                          'between the quotes (as the API lists it)', path=field)

    raw = bytearray()
    body, i = c[1:-1], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1:i + 2]
            if nxt in ("\\", '"'):
                raw += nxt.encode()
                i += 2
                continue
            hx = body[i + 2:i + 4]
            if nxt == "x" and len(hx) == 2 and all(h in "0123456789abcdefABCDEF" for h in hx):
                raw.append(int(hx, 16))
                i += 4
                continue
            raise bad("has a backslash that is not \\\\, \\\" or \\xNN")
        if ch == '"':
            raise bad("has a quote inside that is not \\\"")
        try:
            raw += ch.encode()
        except UnicodeEncodeError:
            raise bad("has a lone surrogate") from None
        i += 1
    if not raw or 0x2F in raw or 0 in raw:
        raise bad("is empty or holds a / or NUL byte")
    return raw.decode("utf-8", "surrogateescape")


def wire_names(x, keys=("name", "path", "symlink_target", "target", "old_target")) -> dict:
    """A record of names (an EntryInfo, WriteInfo, watch event, review Change) as JSON,
    each name in its wire form."""
    d = x.to_dict()
    for k in keys:
        if isinstance(d.get(k), str):
            d[k] = wire_name(d[k])
    return d


def wire_error(x):
    """A FilesError naming its path in the wire form (its field would show a byte that is
    not UTF-8 as \\udcff, a name no request can send back)."""
    from ..runtime.files import FilesError

    if not isinstance(x, FilesError) or not _SURROGATE.search(x.path or ""):
        return x
    return type(x)(x.message, path=wire_name(x.path), errno=x.errno)


def wire_json(v):
    """v (a JSON-able answer) with every string that holds a surrogate escape written as
    wire_name writes it: the one place an answer can meet a name not made safe by its
    route, so nothing the sandbox named fails an answer."""
    if isinstance(v, str):
        return wire_name(v) if _SURROGATE.search(v) else v
    if isinstance(v, dict):
        return {wire_json(k): wire_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [wire_json(x) for x in v]
    return v


class SafeJSONResponse(JSONResponse):
    """The app's JSON answer: as starlette's, or (a string holding a surrogate escape
    would fail the UTF-8 encoding: a 500, a connection cut) wire_json's form of it."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(wire_json(content))


def status_of(e: CorralError) -> int:
    """The HTTP status of one of corral's errors."""
    from ..runtime.files import FileNotFound, FilesError
    from ..runtime.session import ContextError

    if isinstance(e, FileNotFound):
        return 404
    if isinstance(e, (PolicyError, UsageError, FilesError)):
        return 400
    if isinstance(e, (UnsupportedRule, BackendUnavailable, ImageError)):
        return 422       # ImageError: an image this server does not have (or cannot use)
    if isinstance(e, (ContextError, SandboxClosed)):
        return 409
    if getattr(e, "kind", None) == "review":      # runtime.changes.ReviewError
        return 409
    return 500


class Service:
    """The state one app holds: its token store, its sandboxes, its metrics, its config
    (config.Config), and each token's limits at work (limits.py): its request bucket,
    its operations in flight (max_concurrent) and its creates under way (max_sandboxes),
    shared by the REST routes and /mcp; and the server's own bounds on open terminals
    (`terminals`, config max_terminals), on commands and cells running (`running`,
    config max_running), shared by the REST and E2B faces, and on live sandboxes (in
    `quota`, config max_sandboxes), shared by REST, /mcp and E2B."""

    def __init__(self, tokens, registry, metrics, config=None) -> None:
        from .config import Config
        from .limits import Concurrency, Gate, Quota, RateLimiter

        self.tokens, self.registry, self.metrics = tokens, registry, metrics
        self.config = config if config is not None else Config()
        self.rates = RateLimiter()
        self.busy = Concurrency()
        #: max_sandboxes: each token's, and the server's (config max_sandboxes, every
        #: token's and face's together: REST, /mcp, E2B), over its live sandboxes
        self.quota = Quota(self.config.max_sandboxes, registry.count)
        self.terminals = Gate(self.config.max_terminals, "max_terminals", "open terminals")
        self.running = Gate(self.config.max_running, "max_running",
                            "commands and cells running")
        self.draining = False

    def entry(self, sid: str, token: Token):
        e = self.registry.get(token.owner, sid)
        if e is None:
            raise ApiError(404, "not_found", f"no sandbox {sid!r}", "sandbox_id")
        return e

    def slot(self, token: Token):
        """One operation of a token in flight; over its max_concurrent: Limited (429)."""
        return self.busy.slot(token.owner, token.max_concurrent)

    def work(self, token: Token):
        """A command or cell of a token, which holds a thread of the server's own while it
        runs: one of the token's operations in flight (max_concurrent) and one of the
        server's commands and cells running (config max_running); past either, Limited."""
        from .limits import Both

        return Both(self.slot(token), self.running.slot())

    def reserve(self, token: Token):
        """A place for one more sandbox of the token while it is made; past its
        max_sandboxes, or the server's (those live and those being made): Limited (429)."""
        return self.quota.reserve(token.owner, token.max_sandboxes,
                                  lambda: self.registry.count(token.owner))


async def service(request: HTTPConnection) -> Service:
    # async (as auth): FastAPI runs a sync dependency in a worker thread, a hop of its
    # own per request (milliseconds on a loaded machine) for a dict lookup
    return request.app.state.service


async def auth(request: HTTPConnection) -> Token:
    """The live token a request carries (401 otherwise): the state dir's token file is
    looked at each time, so a revocation counts from the next request."""
    h = request.headers.get("authorization", "")
    scheme, _, value = h.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise ApiError(401, "auth", "missing bearer token: send Authorization: Bearer "
                       "TOKEN (corral token create)", "authorization",
                       {"WWW-Authenticate": "Bearer"})
    svc = request.app.state.service
    t = svc.tokens.verify(value.strip())
    if t is None:
        raise ApiError(401, "auth", "the token is not valid (unknown or revoked)",
                       "authorization", {"WWW-Authenticate": "Bearer"})
    svc.rates.admit(t.name, t.rate, t.burst)        # Limited: 429 (limits.py)
    return t


Auth = Annotated[Token, Depends(auth)]
Svc = Annotated[Service, Depends(service)]


def requested_policy(raw: dict, token: Token, svc: Service):
    """The policy `raw` asks for within the token's ceiling, the ceiling's secrets given
    their sources from the server config (config.with_sources)."""
    from .config import with_sources

    return requested(raw, with_sources(token.ceiling, svc.config.secrets))


def policy_view(policy) -> dict:
    """The effective policy as JSON, secrets by name and hosts only (never a source)."""
    import tomllib

    from ..policy.dump import dump_toml

    data = tomllib.loads(dump_toml(policy))
    for name, table in (data.get("secrets") or {}).items():
        data["secrets"][name] = {k: v for k, v in table.items() if k in ("hosts", "ttl",
                                                                          "plain_http")}
    return data


def view(e) -> dict:
    """A sandbox as the API shows it: id, isolation, created, policy, and what the live
    sandbox's get_info() says (state, ends, usage, metadata, ended_by)."""
    pv = getattr(e, "policy_json", None)
    if pv is None:          # the policy is fixed for the sandbox's life: made once
        pv = policy_view(e.policy)
        try:
            e.policy_json = pv
        except AttributeError:
            pass
    d = {"id": e.id, "isolation": e.sandbox.isolation, "created": e.created,
         "policy": copy.deepcopy(pv)}
    get_info = getattr(e.sandbox, "get_info", None)
    if get_info is not None:
        info = get_info().to_dict()
        info.pop("id", None)
        d.update(info)
    return d


# --- calls that block as long as sandboxed code decides ----------------------------------

def own_thread(loop, fn, name: str, pool=None):
    """fn() in a thread of its own, its result (or error) on the asyncio future returned.
    For a call that may block for as long as the sandbox's code likes (a write to a stdin
    or a terminal it does not read, a wait for a command): run_in_threadpool would hold
    one of anyio's 40 shared worker threads, which every sync route and every other
    token's requests need, meanwhile. `pool`: a commands.Threads whose idle thread takes
    it (a new one when none is idle: it still never waits for another job), instead of a
    thread started for it (a run_code cell's: the start costs about as much as a short
    cell's round trip)."""
    import threading

    fut = loop.create_future()

    def settle(value, error) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    def run() -> None:
        try:
            value, error = fn(), None
        except BaseException as err:  # noqa: BLE001 - handed to the future
            value, error = None, err
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:     # the loop has closed: nobody waits any more
            pass

    if pool is not None:
        pool.submit(run)
    else:
        threading.Thread(target=run, name=name, daemon=True).start()
    return fut


class OneWriter:
    """At most one write waiting on each target (a command's stdin, a terminal) at a time:
    the threads own_thread makes for writes to a target that is not reading stay one per
    target, however many requests come. `claim(target)` is False while another holds it."""

    def __init__(self) -> None:
        import threading

        self._mu = threading.Lock()
        self._held: set[int] = set()

    def claim(self, target) -> bool:
        with self._mu:
            if id(target) in self._held:
                return False
            self._held.add(id(target))
            return True

    def release(self, target) -> None:
        with self._mu:
            self._held.discard(id(target))


#: the service's writes in flight, by target
WRITERS = OneWriter()
