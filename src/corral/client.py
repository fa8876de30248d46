"""The Python SDK for `corral serve`: the in-process API's names, over HTTP.

    from corral.client import Sandbox

    with Sandbox.create(policy={"limits": {"memory": "1G"}},
                        api_url="http://127.0.0.1:8787", api_key="corral_...") as sb:
        print(sb.commands.run("echo hi").stdout)
        sb.files.write("/scratch/x.txt", "kept")
        print(sb.files.read("/scratch/x.txt"))
        print(sb.run_code("1+1").text)

api_url and api_key default to $CORRAL_API_URL and $CORRAL_API_KEY. Errors come back as
corral's own exception classes (corral.errors, FilesError and FileNotFound of the files
API), plus ApiError (a CorralError) for what the service refuses: `.status` is the HTTP
status, `.kind` and `.field` those of the service's error body. AsyncSandbox is the same
with `await`.
"""

from __future__ import annotations

import base64
import os
import threading
from typing import Any

import httpx

from .errors import BackendUnavailable, CorralError, PolicyError, UnsupportedRule, UsageError
from .result import Result

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
        from .runtime.files import FileNotFound, FilesError

        cls = FileNotFound if status == 404 else FilesError
        raise cls(message, path=field or "")
    same = {"policy": PolicyError, "usage": UsageError, "unsupported": UnsupportedRule,
            "unavailable": BackendUnavailable}.get(kind)
    if same is not None:
        raise same(message, field=field)
    cls = {401: AuthError, 403: CeilingError, 404: NotFound, 429: RateLimited}.get(
        status, ApiError)
    raise cls(status, kind, message, field,
              float(retry) if retry and retry.isdigit() else None)


def _config(api_url: str | None, api_key: str | None) -> tuple[str, dict]:
    url = (api_url or os.environ.get("CORRAL_API_URL") or DEFAULT_URL).rstrip("/")
    key = api_key or os.environ.get("CORRAL_API_KEY")
    if not key:
        raise UsageError("no API key: pass api_key= or set CORRAL_API_KEY (corral token "
                         "create prints one)", field="api_key")
    return url, {"Authorization": f"Bearer {key}"}


_tls = None
_tls_mu = threading.Lock()


def _tls_context():
    """One TLS context for every client of this process: httpx builds one per client
    (reading the CA bundle: tens of ms), which a create per sandbox would pay each time.
    The system's CAs as httpx picks them (SSL_CERT_FILE / SSL_CERT_DIR honoured)."""
    global _tls
    with _tls_mu:
        if _tls is None:
            _tls = httpx.create_ssl_context(trust_env=True)
        return _tls


def _client(url: str, headers: dict, timeout: float) -> httpx.Client:
    return httpx.Client(base_url=url, headers=headers, timeout=timeout, verify=_tls_context())


def _async_client(url: str, headers: dict, timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout,
                             verify=_tls_context())


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
    from .result import Usage

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


# -- sync ------------------------------------------------------------------------------------
class Commands:
    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def run(self, cmd, *, stdin: str | None = None, timeout: float | None = None,
            on_stdout=None, on_stderr=None) -> Result:
        """Run `cmd` (a shell line as str, or an argv list) and wait: a corral Result.
        on_stdout / on_stderr, if given, are called with each chunk of output (str) as it
        arrives (the service streams it as NDJSON)."""
        body = _argv_or_cmd(cmd) | {"stdin": stdin, "timeout": timeout}
        if on_stdout is None and on_stderr is None:
            return _result(self._sb._call("POST", "exec", json=body))
        import json

        sb = self._sb
        with sb._http.stream("POST", f"/sandboxes/{sb.id}/exec", params={"stream": "ndjson"},
                             json=body) as r:
            if r.status_code >= 400:
                r.read()
                _raise(r)
            for line in r.iter_lines():
                if not line:
                    continue
                item = json.loads(line)
                if "stdout" in item and on_stdout is not None:
                    on_stdout(item["stdout"])
                elif "stderr" in item and on_stderr is not None:
                    on_stderr(item["stderr"])
                elif "result" in item:
                    return _result(item["result"])
                elif "error" in item:
                    _raise_error(500, item["error"])
        raise ApiError(502, "stream", "the output stream ended without a result")


class Files:
    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def read(self, path: str, format: str = "text"):
        """The file's content: "text" (UTF-8, bad bytes replaced) or "bytes"."""
        d = self._sb._call("GET", "files", params={"path": path, "encoding": "base64"})
        return _file_content(d, format)

    def write(self, path: str, data) -> dict:
        """Write str or bytes to `path` (parents made); returns {name, path, type}."""
        return self._sb._call("PUT", "files", json=_write_body(path, data))

    def list(self, path: str = ".", depth: int = 1) -> list[dict]:
        """Entries below `path`: dicts with name, path, type, size, mode, mtime."""
        return self._sb._call("GET", "files/list", params={"path": path, "depth": depth})[
            "entries"]


class Sandbox:
    """A sandbox on a corral service. Made by Sandbox.create or Sandbox.connect."""

    def __init__(self, info: dict, http: httpx.Client) -> None:
        self.id: str = info["id"]
        self.isolation: str = info.get("isolation", "")
        self.info = info
        self._http = http
        self.commands = Commands(self)
        self.files = Files(self)

    @classmethod
    def create(cls, policy: dict | None = None, *, api_url: str | None = None,
               api_key: str | None = None, request_timeout: float = 300.0) -> Sandbox:
        """A new sandbox for `policy` (a dict in the TOML layout), within the token's
        ceiling (CeilingError naming the rule otherwise)."""
        url, headers = _config(api_url, api_key)
        http = _client(url, headers, request_timeout)
        try:
            r = http.post("/sandboxes", json={"policy": policy or {}})
            _raise(r)
        except BaseException:
            http.close()
            raise
        return cls(r.json(), http)

    @classmethod
    def connect(cls, sandbox_id: str, *, api_url: str | None = None,
                api_key: str | None = None, request_timeout: float = 300.0) -> Sandbox:
        url, headers = _config(api_url, api_key)
        http = _client(url, headers, request_timeout)
        try:
            r = http.get(f"/sandboxes/{sandbox_id}")
            _raise(r)
        except BaseException:
            http.close()
            raise
        return cls(r.json(), http)

    @staticmethod
    def list(*, api_url: str | None = None, api_key: str | None = None) -> list[dict]:
        url, headers = _config(api_url, api_key)
        with _client(url, headers, 30.0) as http:
            r = http.get("/sandboxes")
            _raise(r)
            return r.json()["sandboxes"]

    def _call(self, method: str, sub: str, **kw) -> Any:
        r = self._http.request(method, f"/sandboxes/{self.id}/{sub}", **kw)
        _raise(r)
        return r.json()

    def exec(self, argv, *, stdin: str | None = None, timeout: float | None = None) -> Result:
        """Run argv (a list) or a shell line (a str): a corral Result."""
        return self.commands.run(argv, stdin=stdin, timeout=timeout)

    def run_code(self, code: str, *, language: str = "python",
                 timeout: float | None = None) -> Execution:
        return Execution(self._call("POST", "run_code", json={
            "code": code, "language": language, "timeout": timeout}))

    def explain(self) -> dict:
        return self._call("GET", "explain")

    def kill(self) -> None:
        """End the sandbox on the service (idempotent here: a second kill is a no-op)."""
        if self._http.is_closed:
            return
        try:
            r = self._http.delete(f"/sandboxes/{self.id}")
            if r.status_code != 404:
                _raise(r)
        finally:
            self._http.close()

    close = kill

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


# -- async -----------------------------------------------------------------------------------
class AsyncCommands:
    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def run(self, cmd, *, stdin: str | None = None,
                  timeout: float | None = None) -> Result:
        body = _argv_or_cmd(cmd) | {"stdin": stdin, "timeout": timeout}
        return _result(await self._sb._call("POST", "exec", json=body))


class AsyncFiles:
    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def read(self, path: str, format: str = "text"):
        d = await self._sb._call("GET", "files", params={"path": path, "encoding": "base64"})
        return _file_content(d, format)

    async def write(self, path: str, data) -> dict:
        return await self._sb._call("PUT", "files", json=_write_body(path, data))

    async def list(self, path: str = ".", depth: int = 1) -> list[dict]:
        d = await self._sb._call("GET", "files/list", params={"path": path, "depth": depth})
        return d["entries"]


class AsyncSandbox:
    """Sandbox with `await`: `sb = await AsyncSandbox.create(...)`, `async with`."""

    def __init__(self, info: dict, http: httpx.AsyncClient) -> None:
        self.id: str = info["id"]
        self.isolation: str = info.get("isolation", "")
        self.info = info
        self._http = http
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)

    @classmethod
    async def create(cls, policy: dict | None = None, *, api_url: str | None = None,
                     api_key: str | None = None,
                     request_timeout: float = 300.0) -> AsyncSandbox:
        url, headers = _config(api_url, api_key)
        http = _async_client(url, headers, request_timeout)
        try:
            r = await http.post("/sandboxes", json={"policy": policy or {}})
            _raise(r)
        except BaseException:
            await http.aclose()
            raise
        return cls(r.json(), http)

    async def _call(self, method: str, sub: str, **kw) -> Any:
        r = await self._http.request(method, f"/sandboxes/{self.id}/{sub}", **kw)
        _raise(r)
        return r.json()

    async def exec(self, argv, *, stdin: str | None = None,
                   timeout: float | None = None) -> Result:
        return await self.commands.run(argv, stdin=stdin, timeout=timeout)

    async def run_code(self, code: str, *, language: str = "python",
                       timeout: float | None = None) -> Execution:
        return Execution(await self._call("POST", "run_code", json={
            "code": code, "language": language, "timeout": timeout}))

    async def kill(self) -> None:
        if self._http.is_closed:
            return
        try:
            r = await self._http.delete(f"/sandboxes/{self.id}")
            if r.status_code != 404:
                _raise(r)
        finally:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.kill()
