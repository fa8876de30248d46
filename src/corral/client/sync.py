"""The SDK, sync: Sandbox, its commands, files, terminals, changes and events."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from ..result import Result
from ._common import (
    ApiError,
    CommandInfo,
    Execution,
    SandboxInfo,
    _config,
    _file_content,
    _raise,
    _raise_error,
    _result,
    _write_body,
    applied_of,
    changes_of,
    exec_body,
    info_of,
    line_item,
    patch_of,
    rec,
    sse_events,
    stdin_body,
    tls_context,
    ws_url,
)


class CommandHandle:
    """A background command on the service (runtime.commands.CommandHandle's face): pid,
    cmd, running, wait(timeout), kill(), send_stdin(data), close_stdin(). With on_stdout
    / on_stderr, a thread of its own streams the output to them as it comes."""

    def __init__(self, sb: Sandbox, d: dict, on_stdout=None, on_stderr=None) -> None:
        self._sb = sb
        self.pid: int = d["pid"]
        self.cmd = tuple(d.get("cmd", ()))
        self.background = True
        self.started: float | None = d.get("started")
        self._result: Result | None = None
        self._thread = None
        if on_stdout is not None or on_stderr is not None:
            self._thread = threading.Thread(target=self._follow, args=(on_stdout, on_stderr),
                                            daemon=True, name=f"corral-client-{self.pid}")
            self._thread.start()

    def _follow(self, on_stdout, on_stderr) -> None:
        sb = self._sb
        try:
            with sb._http.stream("GET", f"/sandboxes/{sb.id}/commands/{self.pid}/output",
                                 timeout=httpx.Timeout(None, connect=30)) as r:
                if r.status_code >= 400:
                    return
                for line in r.iter_lines():
                    if line:
                        res = line_item(line, on_stdout, on_stderr)
                        if res is not None:
                            self._result = res
                            return
        except (httpx.HTTPError, ApiError):
            return

    @property
    def running(self) -> bool:
        if self._result is not None:
            return False
        d = self._sb._call("GET", f"commands/{self.pid}")
        if not d["running"]:
            self._result = _result(d["result"])
        return d["running"]

    def wait(self, timeout: float | None = None) -> Result:
        """Its Result once it has exited (after every chunk reached the callbacks).
        TimeoutError if `timeout` seconds pass first (it keeps running)."""
        if self._result is None:
            params = {} if timeout is None else {"timeout": timeout}
            self._result = _result(self._sb._call(
                "GET", f"commands/{self.pid}/wait", params=params,
                timeout=None if timeout is None else timeout + 30))
        if self._thread is not None:
            self._thread.join(30)
        return self._result

    def kill(self) -> None:
        """SIGKILL the command and every process it started."""
        self._sb._call("POST", f"commands/{self.pid}/kill")

    def send_stdin(self, data: bytes | str) -> None:
        self._sb._call("POST", f"commands/{self.pid}/stdin", json=stdin_body(data))

    def close_stdin(self) -> None:
        self._sb._call("POST", f"commands/{self.pid}/stdin", json=stdin_body(b"", True))

    def __repr__(self) -> str:
        return f"<CommandHandle pid={self.pid} {list(self.cmd)!r:.60}>"


class Commands:
    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def run(self, cmd, *, env: dict[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | str | None = None, timeout: float | None = None,
            on_stdout=None, on_stderr=None, background: bool = False):
        """Run `cmd` (a shell line as str, or an argv list). Foreground (default): waits
        and returns its Result; on_stdout / on_stderr get each chunk (str) as it comes
        (streamed as NDJSON). If this call is interrupted (the connection drops), the
        service kills the command. background=True: a CommandHandle at once; it runs
        until it exits, is killed, or the sandbox ends."""
        sb = self._sb
        body = exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                         background=background)
        if background:
            return CommandHandle(sb, sb._call("POST", "exec", json=body), on_stdout,
                                 on_stderr)
        http_timeout = httpx.Timeout(None if timeout is None else timeout + 60, connect=30)
        if on_stdout is None and on_stderr is None:
            return _result(sb._call("POST", "exec", json=body, timeout=http_timeout))
        with sb._http.stream("POST", f"/sandboxes/{sb.id}/exec", params={"stream": "ndjson"},
                             json=body, timeout=http_timeout) as r:
            if r.status_code >= 400:
                r.read()
                _raise(r)
            for line in r.iter_lines():
                if line:
                    res = line_item(line, on_stdout, on_stderr)
                    if res is not None:
                        return res
        raise ApiError(502, "stream", "the output stream ended without a result")

    def list(self) -> list[CommandInfo]:
        """The commands running now, then processes finished ones left behind."""
        return [rec(CommandInfo, d) for d in self._sb._call("GET", "commands")["commands"]]


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


class PtyHandle:
    """A terminal on the service over a WebSocket (runtime.pty.PtyHandle's face): pid (its
    command's, inside the sandbox: the host's pids stay on the host), send_input, resize,
    kill, wait. Output reaches on_data (bytes) from a thread of its own, as it comes."""

    def __init__(self, ws, on_data) -> None:
        self._ws = ws
        self._on_data = on_data
        self._result: Result | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        first = json.loads(ws.recv(timeout=60))
        self.pid: int | None = first.get("pid")
        self._thread = threading.Thread(target=self._read, daemon=True, name="corral-pty")
        self._thread.start()

    def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            for msg in self._ws:
                if isinstance(msg, bytes):
                    if self._on_data is not None:
                        self._on_data(msg)
                    continue
                m = json.loads(msg)
                if m.get("type") == "exit":
                    self._result = _result(m["result"])
                    return
        except ConnectionClosed:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by wait()
            self._error = e
        finally:
            self._done.set()

    def send_input(self, data: bytes | str) -> None:
        """Type data into the terminal (str: UTF-8). BrokenPipeError once it has ended."""
        from websockets.exceptions import ConnectionClosed

        if isinstance(data, str):
            data = data.encode("utf-8")
        try:
            self._ws.send(bytes(data))
        except ConnectionClosed:
            raise BrokenPipeError("the terminal has ended") from None

    def resize(self, cols: int, rows: int) -> None:
        self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def kill(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(json.dumps({"type": "kill"}))
        except ConnectionClosed:
            pass

    def wait(self, timeout: float | None = None) -> Result:
        """The command's Result once it has ended (stdout: what the terminal showed).
        TimeoutError if it has not in `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the terminal's command is still running after {timeout} s")
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise ApiError(502, "stream", "the terminal's connection closed without a result")
        self._ws.close()
        return self._result

    def __enter__(self) -> PtyHandle:
        return self

    def __exit__(self, *exc) -> None:
        if self._result is None:
            self.kill()
            try:
                self.wait(30)
            except (TimeoutError, ApiError):
                self._ws.close()


class Pty:
    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def create(self, cols: int = 80, rows: int = 24, cmd: str | None = None, *,
               on_data=None, cwd: str | None = None,
               timeout: float | None = None) -> PtyHandle:
        """A terminal of cols x rows running cmd (a shell command line; default an
        interactive bash), on_data called with each chunk (bytes) it shows."""
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        sb = self._sb
        url = ws_url(str(sb._http.base_url).rstrip("/"), f"/sandboxes/{sb.id}/pty",
                     {"cols": cols, "rows": rows, "cmd": cmd, "cwd": cwd, "timeout": timeout})
        try:
            ws = connect(url, additional_headers={"Authorization":
                                                  sb._http.headers["authorization"]},
                         open_timeout=60, max_size=2 << 20)
        except InvalidStatus as e:
            _raise_ws(e)
        return PtyHandle(ws, on_data)


def _raise_ws(e) -> None:
    r = e.response
    try:
        err = json.loads(r.body)["error"]
    except (ValueError, KeyError, TypeError):
        err = {"kind": "http", "field": None, "message": f"HTTP {r.status_code}"}
    _raise_error(r.status_code, err)


class Sandbox:
    """A sandbox on a corral service. Made by Sandbox.create or Sandbox.connect."""

    def __init__(self, info: dict, http: httpx.Client) -> None:
        self.id: str = info["id"]
        self.isolation: str = info.get("isolation", "")
        self.info = info
        self._http = http
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)

    @classmethod
    def create(cls, policy: dict | None = None, *, timeout: float = 300,
               metadata: dict[str, str] | None = None, api_url: str | None = None,
               api_key: str | None = None, request_timeout: float = 300.0) -> Sandbox:
        """A new live sandbox for `policy` (a dict in the TOML layout), within the token's
        ceiling (CeilingError naming the rule otherwise), ended after `timeout` seconds
        (set_timeout changes it) or by kill()."""
        url, headers = _config(api_url, api_key)
        http = httpx.Client(base_url=url, headers=headers, timeout=request_timeout,
                            verify=tls_context())
        try:
            r = http.post("/sandboxes", json={"policy": policy or {}, "timeout": timeout,
                                              "metadata": metadata})
            _raise(r)
        except BaseException:
            http.close()
            raise
        return cls(r.json(), http)

    @classmethod
    def connect(cls, sandbox_id: str, *, api_url: str | None = None,
                api_key: str | None = None, request_timeout: float = 300.0) -> Sandbox:
        """A running sandbox of this token's, by id (NotFound otherwise)."""
        url, headers = _config(api_url, api_key)
        http = httpx.Client(base_url=url, headers=headers, timeout=request_timeout,
                            verify=tls_context())
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
        with httpx.Client(base_url=url, headers=headers, verify=tls_context()) as http:
            r = http.get("/sandboxes")
            _raise(r)
            return r.json()["sandboxes"]

    def _call(self, method: str, sub: str, **kw) -> Any:
        r = self._http.request(method, f"/sandboxes/{self.id}/{sub}" if sub else
                               f"/sandboxes/{self.id}", **kw)
        _raise(r)
        return r.json()

    # -- the live sandbox's face --
    @property
    def state(self) -> str:
        return self.get_info().state

    def get_info(self) -> SandboxInfo:
        """State, created, ends, policy digest, usage so far, metadata."""
        d = self._call("GET", "")
        return info_of(dict(d, id=self.id))

    def set_timeout(self, seconds: float) -> None:
        """End the sandbox `seconds` from now (longer or shorter than before)."""
        self._call("POST", "timeout", json={"timeout": seconds})

    def exec(self, argv, *, stdin: str | bytes | None = None,
             timeout: float | None = None) -> Result:
        """Run argv (a list) or a shell line (a str): a corral Result."""
        return self.commands.run(argv, stdin=stdin, timeout=timeout)

    def run_code(self, code: str, *, language: str = "python",
                 timeout: float | None = None) -> Execution:
        return Execution(self._call("POST", "run_code", json={
            "code": code, "language": language, "timeout": timeout}))

    def explain(self) -> dict:
        return self._call("GET", "explain")

    # -- review mode --
    def changes(self) -> list:
        """What the sandbox changed in its workspace (runtime.changes.Change each)."""
        return changes_of(self._call("GET", "changes"))

    def changes_patch(self, paths=None) -> tuple[bytes, list]:
        """The changes as a git-style patch, and [(path, why)] of those left out."""
        return patch_of(self._call("GET", "changes/diff", params={
            "path": list(paths or ()), "encoding": "base64"}))

    def apply_changes(self, paths=None, *, exact: bool = False):
        """Copy the changes onto the host's workspace (only a token made with
        --apply-changes may: CeilingError otherwise); a runtime.changes.Applied."""
        return applied_of(self._call("POST", "changes/apply", json={
            "paths": None if paths is None else list(paths), "exact": exact}))

    def discard_changes(self) -> None:
        self._call("POST", "changes/discard")

    # -- events --
    def stream_events(self, since: int = 0, *, follow: bool = True):
        """The sandbox's events as they come (SSE): dicts {id, kind, data}, until the
        sandbox ends (follow=False: those so far). Not the in-process `sb.events` (a list
        of the sandbox's own teardown events): those come here as kind "sandbox"."""
        with self._http.stream("GET", f"/sandboxes/{self.id}/events",
                               params={"since": since, "follow": follow},
                               timeout=httpx.Timeout(None, connect=30)) as r:
            if r.status_code >= 400:
                r.read()
                _raise(r)
            for ev in sse_events(r.iter_lines()):
                if ev["kind"] == "end":
                    return
                yield ev

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
