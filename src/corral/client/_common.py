"""What the sync and async SDK share: errors, the config, the shapes of answers."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading

import httpx

from .._record import Default, Record
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
from ..result import Result

DEFAULT_URL = "http://127.0.0.1:8787"


class ApiError(CorralError):
    """The service refused a request: HTTP `status`, the error's `kind`, `field`, message."""

    kind = "api"

    def __init__(self, status: int, kind: str, message: str, field: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, field=field)
        self.status = status
        self.kind = kind
        self.retry_after = retry_after


class AuthError(ApiError):
    """401: no token, a wrong one or a revoked one."""


class CeilingError(ApiError):
    """403: the policy asked for more than the token's ceiling allows (`field`: the rule)."""


class NotFound(ApiError):
    """404: no such sandbox (or another token's)."""


class RateLimited(ApiError):
    """429: a bound, which `field` names (the token's max_sandboxes or max_concurrent, the
    server's max_sandboxes, max_terminals or max_running); `retry_after` in seconds."""


def _raise(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        err = {"kind": "http", "field": None, "message": r.text[:500]}
    _raise_error(r.status_code, err, r.headers.get("retry-after"))


def _raise_raw(status: int, raw: bytes, retry: str | None = None) -> None:
    """_raise for an answer read without httpx (client/_fast.py): status, body bytes."""
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        err = {"kind": "http", "field": None,
               "message": raw.decode("utf-8", errors="replace")[:500]}
    _raise_error(status, err, retry)


def _raise_ws(e) -> None:
    """_raise for a WebSocket handshake the server refused (websockets' InvalidStatus)."""
    r = e.response
    try:
        err = json.loads(r.body)["error"]
    except (ValueError, KeyError, TypeError):
        err = {"kind": "http", "field": None, "message": f"HTTP {r.status_code}"}
    _raise_error(r.status_code, err, r.headers.get("Retry-After"))


def _raise_error(status: int, err: dict, retry: str | None = None) -> None:
    kind, field, message = err.get("kind", "http"), err.get("field"), err.get("message", "")
    if kind == "files":
        from ..runtime.files import FileNotFound, FilesError

        cls = FileNotFound if status == 404 else FilesError
        raise cls(message, path=field or "")
    if kind == "context":
        from ..runtime.session import ContextError

        raise ContextError(message, field=field)
    if kind == "review":
        from ..runtime.changes import ReviewError

        raise ReviewError(message, field=field)
    if kind in ("running", "timeout"):   # a wait (a stdin write) whose timeout passed
        raise TimeoutError(message)
    if kind == "setup":
        raise SandboxSetupError(message, step=err.get("step") or field or "", field=field)
    same = {"policy": PolicyError, "usage": UsageError, "unsupported": UnsupportedRule,
            "unavailable": BackendUnavailable, "closed": SandboxClosed,
            "image": ImageError}.get(kind)
    if same is not None:
        raise same(message, field=field)
    cls = {401: AuthError, 403: CeilingError, 404: NotFound, 429: RateLimited}.get(
        status, ApiError)
    raise cls(status, kind, message, field,
              float(retry) if retry and retry.isdigit() else None)


_tls = None
_tls_mu = threading.Lock()


def tls_context():
    """One TLS context for every client of this process: httpx builds one per client
    (reading the CA bundle: tens of ms), which a create per sandbox would pay each time.
    The system's CAs as httpx picks them (SSL_CERT_FILE / SSL_CERT_DIR honoured)."""
    global _tls
    with _tls_mu:
        if _tls is None:
            _tls = httpx.create_ssl_context(trust_env=True)
        return _tls


def _config(api_url: str | None, api_key: str | None) -> tuple[str, dict]:
    url = (api_url or os.environ.get("CORRAL_API_URL") or DEFAULT_URL).rstrip("/")
    key = api_key or os.environ.get("CORRAL_API_KEY")
    if not key:
        raise UsageError("no API key: pass api_key= or set CORRAL_API_KEY (corral token "
                         "create prints one)", field="api_key")
    return url, {"Authorization": f"Bearer {key}"}


_ssl_mu = threading.Lock()
_pools: dict[tuple[int, str], httpx.HTTPTransport] = {}
#: TCP_NODELAY on the SDK's connections: httpx writes a request's headers and its body
#: in two sends, and with Nagle's algorithm the body (a small second segment) waits for
#: the headers' ACK, which the server may delay; asyncio (the server) sets it already
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class _SharedPool(httpx.HTTPTransport):
    """A connection pool the process's sync Sandboxes of one service share (kept-alive
    connections: a create, a command, the next sandbox's create reuse them). A Sandbox's
    own Client closing (kill), or leaving its `with`, leaves it open; no bound on
    connections (each follower and watch holds one for its stream, as with a Client
    each). The process's exit closes it (`_close_pools`), not the collector."""

    def close(self) -> None:
        pass

    def __exit__(self, *exc) -> None:   # httpx.Client.__exit__ calls this, not close()
        pass


def shared_pool(url: str) -> httpx.HTTPTransport:
    """The shared pool for `url` in this process (a new one after a fork: a child never
    writes on its parent's connections)."""
    key = (os.getpid(), url)
    with _ssl_mu:
        pool = _pools.get(key)
    if pool is None:
        ctx = tls_context()
        with _ssl_mu:
            pool = _pools.get(key)
            if pool is None:
                if not _pools:
                    import atexit

                    atexit.register(_close_pools)
                pool = _pools[key] = _SharedPool(verify=ctx, limits=httpx.Limits(
                    max_connections=None, max_keepalive_connections=20),
                    socket_options=NODELAY)
    return pool


def _close_pools() -> None:
    """At exit: this process's shared pools closed, their kept-alive connections with
    them (else each is an "unclosed socket" ResourceWarning at shutdown)."""
    with _ssl_mu:
        pools = [p for k, p in _pools.items() if k[0] == os.getpid()]
        _pools.clear()
    for p in pools:
        try:
            httpx.HTTPTransport.close(p)
        except Exception:  # noqa: BLE001 - exiting: a pool that fails to close is let go
            pass


def sync_client(url: str, headers: dict, timeout: float | None = None) -> httpx.Client:
    """A sync client on the shared pool of `url` (timeout: httpx's default if None)."""
    kw = {} if timeout is None else {"timeout": timeout}
    return httpx.Client(base_url=url, headers=headers, transport=shared_pool(url),
                        verify=tls_context(), **kw)


def async_client(url: str, headers: dict, timeout: float | None = None) -> httpx.AsyncClient:
    """An async client of its own (its connections belong to one event loop) with the
    process's TLS context."""
    kw = {} if timeout is None else {"timeout": timeout}
    ctx = tls_context()
    return httpx.AsyncClient(base_url=url, headers=headers, verify=ctx, transport=
                             httpx.AsyncHTTPTransport(verify=ctx, socket_options=NODELAY),
                             **kw)


def _argv_or_cmd(cmd) -> dict:
    return {"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}


def _result(d: dict) -> Result:
    from ..result import Usage

    d = dict(d)
    d["usage"] = Usage(**d.get("usage", {}))
    return Result(**d)


def execution_of(d: dict):
    """The in-process Execution (runtime.session) from its JSON: results as CodeResult
    (text, html, png, ... attributes), logs.stdout / logs.stderr, error an ExecutionError
    (name, value, traceback) or None, execution_count, exit_code, the *_truncated flags."""
    from ..runtime.session import Execution

    ex = Execution()
    ex.results = [code_result_of(r) for r in d.get("results", ())]
    logs = d.get("logs") or {}
    ex.logs.stdout = list(logs.get("stdout", ()))
    ex.logs.stderr = list(logs.get("stderr", ()))
    ex.error = execution_error_of(d["error"]) if d.get("error") else None
    ex.execution_count = d.get("execution_count")
    ex.exit_code = d.get("exit_code")
    for flag in ("stdout_truncated", "stderr_truncated", "results_truncated"):
        setattr(ex, flag, bool(d.get(flag, False)))
    return ex


def code_result_of(d: dict):
    from ..runtime.session import MIME_ATTRS, CodeResult

    r = CodeResult({}, bool(d.get("is_main_result", False)))
    for attr in MIME_ATTRS.values():
        if d.get(attr) is not None:
            setattr(r, attr, d[attr])
    r.extra = dict(d.get("extra") or {})
    return r


def execution_error_of(d: dict):
    from ..runtime.session import ExecutionError

    tb = d.get("traceback") or ""
    return ExecutionError(d.get("name", ""), d.get("value", ""), [tb] if tb else [])


def context_of(d: dict):
    from ..runtime.session import Context

    return Context(d["id"], d["language"], d.get("cwd"))


def context_id(context) -> str | None:
    """A Context (in-process or from here) or its id, as the id."""
    if context is None or isinstance(context, str):
        return context
    return context.id


def code_body(code: str, language, context, timeout, env=None) -> dict:
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    body = {"code": code, "language": language, "context": context_id(context),
            "timeout": timeout}
    if env:
        body["env"] = dict(env)
    return body


def context_body(language: str, cwd, engine) -> dict:
    body = {"language": language, "cwd": cwd}
    if engine is not None:
        body["engine"] = engine
    return body


def code_line(line: str, on_stdout, on_stderr, on_result, on_error):
    """One NDJSON line of a cell's stream: calls back (str, CodeResult, ExecutionError as
    in-process), returns the Execution at its end (None before), raises for a failure."""
    import json

    item = json.loads(line)
    kind, data = item.get("type"), item.get("data")
    if kind == "stdout":
        if on_stdout is not None:
            on_stdout(data)
    elif kind == "stderr":
        if on_stderr is not None:
            on_stderr(data)
    elif kind == "result":
        if on_result is not None:
            on_result(code_result_of(data))
    elif kind == "error":
        if on_error is not None:
            on_error(execution_error_of(data))
    elif kind == "end":
        return execution_of(data)
    elif kind == "failed":
        _raise_error(500, data or {})
    return None


# -- files -------------------------------------------------------------------------------------
def entry_of(d: dict):
    from ..runtime.files import EntryInfo

    return rec(EntryInfo, d)


def write_info_of(d: dict):
    from ..runtime.files import WriteInfo

    return rec(WriteInfo, d)


def check_format(format: str, path) -> None:
    if format not in ("text", "bytes", "stream"):
        from ..runtime.files import FilesError

        raise FilesError(f'format {format!r} is not "text", "bytes" or "stream"',
                         path=str(path))


def as_bytes(data) -> bytes:
    """str (UTF-8) or bytes-like as bytes; a file object's whole content."""
    if hasattr(data, "read"):
        data = data.read()
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError("data is str, bytes-like, or a readable file object")


def batch_body(files) -> dict:
    """write_files' [{"path", "data"}] (or (path, data) pairs) as the batch's JSON."""
    out = []
    for f in files:
        path, data = (f["path"], f["data"]) if isinstance(f, dict) else f
        out.append({"path": path, "content": base64.b64encode(as_bytes(data)).decode(),
                    "encoding": "base64"})
    return {"files": out}


def watch_line(line: str):
    """One NDJSON line of a watch: ("event", FilesystemEvent), ("watching", path) or
    ("end", why)."""
    import json

    from ..runtime.watch import FilesystemEvent

    item = json.loads(line)
    if "watching" in item:
        return "watching", item["watching"]
    if "end" in item:
        return "end", item["end"]
    return "event", rec(FilesystemEvent, item)


def rec(cls, d: dict):
    """A Record of `cls` from a JSON object, fields it does not know left out (a newer
    server may send more)."""
    from .._record import fields

    names = fields(cls)
    return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()
                  if k in names})


class SandboxInfo(Record):
    """What `sb.get_info()` returns: runtime.live.SandboxInfo's fields."""

    id: str
    state: str                     # "running" | "ended"
    isolation: str
    created: float
    ends: float
    policy_digest: str = ""
    idle_timeout: float | None = None
    metadata: dict = Default(dict)
    usage: dict = Default(dict)
    ended_by: str | None = None
    offers: dict = Default(dict)   # what the tier gives: shell, pty, run_code, files, ...


class CommandInfo(Record):
    """One entry of `sb.commands.list()` (runtime.commands.CommandInfo without host pids)."""

    pid: int
    cmd: tuple[str, ...]
    background: bool
    started: float
    detached: bool = False


def info_of(d: dict) -> SandboxInfo:
    return rec(SandboxInfo, d)


def create_body(policy, timeout, metadata, user_account: bool) -> dict:
    body = {"policy": policy or {}, "timeout": timeout, "metadata": metadata}
    if user_account:
        body["user_account"] = True
    return body


def exec_body(cmd, *, env, cwd, stdin, timeout, background) -> dict:
    body = _argv_or_cmd(cmd) | {"timeout": timeout, "background": background}
    if env is not None:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            body["stdin"] = base64.b64encode(bytes(stdin)).decode()
            body["stdin_encoding"] = "base64"
    return body


def stdin_body(data, close: bool = False, timeout: float | None = None) -> dict:
    if isinstance(data, str):
        data = data.encode()
    body = {"data": base64.b64encode(bytes(data)).decode(), "encoding": "base64",
            "close": close}
    if timeout is not None:
        body["timeout"] = timeout
    return body


class broken_pipe:
    """A command's stdin closed (409, kind "closed", field "pid", which _raise_error makes
    a SandboxClosed) as BrokenPipeError, as in-process; the sandbox's own end stays
    SandboxClosed."""

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb) -> None:
        if isinstance(e, SandboxClosed) and e.field == "pid":
            raise BrokenPipeError(e.message) from None


def bytes_output(body: dict, on_stdout, on_stderr):
    """With an output callback, ask for the output as base64 (the bytes as the command
    wrote them) and wrap the callbacks to get bytes, as in-process: (on_stdout,
    on_stderr), each None where it was."""
    if on_stdout is None and on_stderr is None:
        return on_stdout, on_stderr
    body["output_encoding"] = "base64"
    return _unb64(on_stdout), _unb64(on_stderr)


def _unb64(fn):
    if fn is None:
        return None

    def call(data: str) -> None:
        fn(base64.b64decode(data))
    return call


def pty_params(cols, rows, cmd, cwd, timeout, env) -> dict:
    """A terminal's query parameters (cmd a str, or an argv list as a shell line)."""
    import json
    import shlex

    if cmd is not None and not isinstance(cmd, str):
        cmd = shlex.join(str(a) for a in cmd)
    return {"cols": cols, "rows": rows, "cmd": cmd, "cwd": cwd, "timeout": timeout,
            "env": json.dumps(dict(env)) if env else None}


def line_item(line: str, on_stdout, on_stderr):
    """One NDJSON line of a command's stream: calls back for output, returns the Result
    at its end (None before), raises for an error line."""
    import json

    item = json.loads(line)
    if "stdout" in item:
        if on_stdout is not None:
            on_stdout(item["stdout"])
    elif "stderr" in item:
        if on_stderr is not None:
            on_stderr(item["stderr"])
    elif "result" in item:
        return _result(item["result"])
    elif "error" in item:
        _raise_error(500, item["error"])
    return None


def ws_url(base: str, path: str, params: dict) -> str:
    from urllib.parse import urlencode

    scheme = "wss" if base.startswith("https:") else "ws"
    rest = base.split("://", 1)[1]
    q = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{scheme}://{rest}{path}" + (f"?{q}" if q else "")


def sse_events(lines):
    """Server-Sent Events from an iterator of lines: dicts {id, kind, data}."""
    import json

    ev: dict = {}
    for line in lines:
        if not line:
            if "kind" in ev or "data" in ev:
                yield {"id": ev.get("id"), "kind": ev.get("kind", "message"),
                       "data": json.loads(ev.get("data") or "null")}
            ev = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            ev["id"] = int(value) if value.isdigit() else None
        elif name == "event":
            ev["kind"] = value
        elif name == "data":
            ev["data"] = ev.get("data", "") + value


def changes_of(d: dict) -> list:
    from ..runtime.changes import Change

    return [rec(Change, c) for c in d["changes"]]


def applied_of(d: dict):
    from ..runtime.changes import Applied

    return Applied(applied=tuple(d.get("applied", ())),
                   conflicts=tuple(tuple(x) for x in d.get("conflicts", ())),
                   refused=tuple(tuple(x) for x in d.get("refused", ())))


def patch_of(d: dict) -> tuple[bytes, list]:
    data = base64.b64decode(d["patch"]) if d.get("encoding") == "base64" \
        else d["patch"].encode()
    return data, [(o["path"], o["why"]) for o in d.get("omitted", ())]
