"""What the sync and async SDK share: errors, the config, the shapes of answers."""

from __future__ import annotations

import base64
import os
import threading

import httpx

from .._record import Default, Record
from ..errors import (
    BackendUnavailable,
    CorralError,
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
    """429: the token's max-sandboxes or max-concurrent; `retry_after` in seconds."""


def _raise(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        err = {"kind": "http", "field": None, "message": r.text[:500]}
    _raise_error(r.status_code, err, r.headers.get("retry-after"))


def _raise_error(status: int, err: dict, retry: str | None = None) -> None:
    kind, field, message = err.get("kind", "http"), err.get("field"), err.get("message", "")
    if kind == "files":
        from ..runtime.files import FileNotFound, FilesError

        cls = FileNotFound if status == 404 else FilesError
        raise cls(message, path=field or "")
    if kind == "review":
        from ..runtime.changes import ReviewError

        raise ReviewError(message, field=field)
    if kind == "running":            # a wait whose timeout passed: as in-process
        raise TimeoutError(message)
    if kind == "setup":
        raise SandboxSetupError(message, step=field or "", field=field)
    same = {"policy": PolicyError, "usage": UsageError, "unsupported": UnsupportedRule,
            "unavailable": BackendUnavailable, "closed": SandboxClosed}.get(kind)
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


def _argv_or_cmd(cmd) -> dict:
    return {"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}


class Execution:
    """run_code's result, the in-process Execution's shape: results (dicts with text and
    other formats), logs (stdout, stderr lists), error (name, value, traceback) or None,
    execution_count; `.text` is the main result's text."""

    def __init__(self, d: dict) -> None:
        self.results: list[dict] = d.get("results", [])
        self.logs: dict = d.get("logs", {"stdout": [], "stderr": []})
        self.error: dict | None = d.get("error")
        self.execution_count: int | None = d.get("execution_count")

    @property
    def text(self) -> str | None:
        for r in self.results:
            if r.get("is_main_result"):
                return r.get("text")
        return None

    def to_dict(self) -> dict:
        return {"results": self.results, "logs": self.logs, "error": self.error,
                "execution_count": self.execution_count}


def _result(d: dict) -> Result:
    from ..result import Usage

    d = dict(d)
    d["usage"] = Usage(**d.get("usage", {}))
    return Result(**d)


def _file_content(d: dict, format: str):
    data = base64.b64decode(d["content"])
    return data if format == "bytes" else data.decode("utf-8", errors="replace")


def _write_body(path: str, data) -> dict:
    if isinstance(data, str):
        data = data.encode()
    return {"path": path, "content": base64.b64encode(bytes(data)).decode(),
            "encoding": "base64"}




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


class CommandInfo(Record):
    """One entry of `sb.commands.list()` (runtime.commands.CommandInfo without host pids)."""

    pid: int
    cmd: tuple[str, ...]
    background: bool
    started: float
    detached: bool = False


def info_of(d: dict) -> SandboxInfo:
    return rec(SandboxInfo, d)


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


def stdin_body(data, close: bool = False) -> dict:
    if isinstance(data, str):
        data = data.encode()
    return {"data": base64.b64encode(bytes(data)).decode(), "encoding": "base64",
            "close": close}


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
