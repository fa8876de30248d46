"""The SDK with `await`: AsyncSandbox and its commands, files, terminals, changes, events
(the sync names and shapes; see sync.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from ..errors import SandboxClosed
from ..result import Result
from ._common import (
    ApiError,
    CommandInfo,
    SandboxInfo,
    _config,
    _raise,
    _raise_ws,
    _result,
    applied_of,
    as_bytes,
    async_client,
    batch_body,
    broken_pipe,
    bytes_output,
    changes_of,
    check_format,
    code_body,
    code_line,
    context_body,
    context_id,
    context_of,
    create_body,
    entry_of,
    exec_body,
    execution_of,
    info_of,
    line_item,
    patch_of,
    pty_params,
    rec,
    sse_events,
    stdin_body,
    watch_line,
    write_info_of,
    ws_url,
)
from .sync import CHUNK, WATCH_QUEUE


class AsyncCommandHandle:
    """A background command (await wait(), kill(), send_signal(), send_stdin(),
    close_stdin()); with callbacks, a task streams its output (bytes) to them."""

    def __init__(self, sb: AsyncSandbox, d: dict, on_stdout=None, on_stderr=None) -> None:
        self._sb = sb
        self.pid: int = d["pid"]
        self.cmd = tuple(d.get("cmd", ()))
        self.background = True
        self.started: float | None = d.get("started")
        self._result: Result | None = None
        self._task = None
        if on_stdout is not None or on_stderr is not None:
            self._task = asyncio.ensure_future(self._follow(on_stdout, on_stderr))

    async def _follow(self, on_stdout, on_stderr) -> None:
        sb = self._sb
        try:
            async with sb._http.stream("GET", f"/sandboxes/{sb.id}/commands/{self.pid}/output",
                                       timeout=httpx.Timeout(None, connect=30)) as r:
                if r.status_code >= 400:
                    return
                async for line in r.aiter_lines():
                    if line:
                        res = line_item(line, on_stdout, on_stderr)
                        if res is not None:
                            self._result = res
                            return
        except (httpx.HTTPError, ApiError):
            return

    async def wait(self, timeout: float | None = None) -> Result:
        """Its Result once it has exited (after every chunk reached the callbacks).
        TimeoutError if `timeout` seconds pass first (it keeps running)."""
        if self._result is None:
            params = {} if timeout is None else {"timeout": timeout}
            self._result = _result(await self._sb._call(
                "GET", f"commands/{self.pid}/wait", params=params,
                timeout=None if timeout is None else timeout + 30))
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)
        return self._result

    async def kill(self) -> None:
        """SIGKILL the command and every process it started (NotFound if the service no
        longer knows it)."""
        await self._sb._call("POST", f"commands/{self.pid}/kill")

    async def send_signal(self, sig: int) -> bool:
        """Signal number `sig` (1-64) to the command's own process; False once it
        exited."""
        return (await self._sb._call("POST", f"commands/{self.pid}/signal",
                                     json={"signal": int(sig)}))["sent"]

    async def send_stdin(self, data: bytes | str, timeout: float | None = None) -> None:
        """Write data (str: UTF-8) to its stdin, waiting at most `timeout` seconds while
        the pipe is full (TimeoutError). BrokenPipeError once its stdin is closed."""
        with broken_pipe():
            await self._sb._call("POST", f"commands/{self.pid}/stdin", json=stdin_body(
                data, timeout=timeout), timeout=None if timeout is None else timeout + 30)

    async def close_stdin(self) -> None:
        """Close its stdin (end of file); a no-op once closed."""
        try:
            await self._sb._call("POST", f"commands/{self.pid}/stdin",
                                 json=stdin_body(b"", True))
        except SandboxClosed as e:
            if e.field != "pid":
                raise


class AsyncCommands:
    """`sb.commands` with await: run and list."""

    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def run(self, cmd, *, env: dict[str, str] | None = None, cwd: str | None = None,
                  stdin: bytes | str | None = None, timeout: float | None = None,
                  on_stdout=None, on_stderr=None, background: bool = False,
                  user: str | None = None):
        """As the sync commands.run: a Result (foreground) or an AsyncCommandHandle
        (background=True); on_stdout / on_stderr (plain functions) get bytes chunks;
        user "root" (default) or "user"."""
        sb = self._sb
        body = exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                         background=background)
        on_stdout, on_stderr = bytes_output(body, on_stdout, on_stderr)
        if user is not None:
            body["user"] = user
        if background:
            return AsyncCommandHandle(sb, await sb._call("POST", "exec", json=body),
                                      on_stdout, on_stderr)
        http_timeout = httpx.Timeout(None if timeout is None else timeout + 60, connect=30)
        if on_stdout is None and on_stderr is None:
            return _result(await sb._call("POST", "exec", json=body, timeout=http_timeout))
        async with sb._http.stream("POST", f"/sandboxes/{sb.id}/exec",
                                   params={"stream": "ndjson"}, json=body,
                                   timeout=http_timeout) as r:
            if r.status_code >= 400:
                await r.aread()
                _raise(r)
            async for line in r.aiter_lines():
                if line:
                    res = line_item(line, on_stdout, on_stderr)
                    if res is not None:
                        return res
        raise ApiError(502, "stream", "the output stream ended without a result")

    async def list(self) -> list[CommandInfo]:
        """The commands running now, then processes finished ones left behind."""
        d = await self._sb._call("GET", "commands")
        return [rec(CommandInfo, c) for c in d["commands"]]


class AsyncFiles:
    """The sync Files' names and shapes as coroutines; read(format="stream") gives an
    async iterator of byte chunks, watch() an AsyncWatcher."""

    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def read(self, path: str, format: str = "text"):
        """As Files.read: str, bytes, or ("stream") an async iterator of 1 MiB byte
        chunks. Raises FileNotFound, FilesError."""
        check_format(format, path)
        sb = self._sb
        req = sb._http.build_request("GET", f"/sandboxes/{sb.id}/files/content",
                                     params={"path": path},
                                     timeout=httpx.Timeout(None, connect=30))
        r = await sb._http.send(req, stream=True)
        if r.status_code >= 400:
            await r.aread()
            await r.aclose()
            _raise(r)
        if format == "stream":
            return _achunks(r)
        try:
            data = await r.aread()
        finally:
            await r.aclose()
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    async def write(self, path: str, data, *, extract: bool = False):
        """As Files.write: a WriteInfo. Raises FilesError, ApiError 413 over 16 MiB."""
        if extract:
            return await self.write_archive(path, data)
        return write_info_of(await self._sb._call("PUT", "files/content",
                                                  params={"path": path},
                                                  content=as_bytes(data)))

    async def write_files(self, files) -> list:
        """As Files.write_files: a WriteInfo each. Raises FilesError, ApiError 413."""
        d = await self._sb._call("POST", "files/batch", json=batch_body(files))
        return [write_info_of(w) for w in d["written"]]

    async def write_archive(self, path: str, tar):
        """As Files.write_archive: a hostile tar refused whole (FilesError)."""
        return write_info_of(await self._sb._call("PUT", "files/archive",
                                                  params={"path": path},
                                                  content=as_bytes(tar)))

    async def list(self, path: str = ".", depth: int = 1) -> list:
        """EntryInfos below path down to depth levels (default 1). FileNotFound."""
        d = await self._sb._call("GET", "files/list", params={"path": path, "depth": depth})
        return [entry_of(x) for x in d["entries"]]

    async def info(self, path: str):
        """The entry itself (a link not followed): an EntryInfo. FileNotFound."""
        return entry_of(await self._sb._call("GET", "files/info", params={"path": path}))

    async def exists(self, path: str) -> bool:
        """Whether anything is at path."""
        return (await self._sb._call("GET", "files/exists", params={"path": path}))["exists"]

    async def remove(self, path: str) -> None:
        """A file, a link or a directory tree. FileNotFound, FilesError."""
        await self._sb._call("DELETE", "files", params={"path": path})

    async def rename(self, old: str, new: str):
        """Move an entry within the sandbox; its new EntryInfo. FileNotFound, FilesError."""
        return entry_of(await self._sb._call("POST", "files/rename",
                                             json={"old": old, "new": new}))

    async def make_dir(self, path: str) -> bool:
        """The directory and its parents; True if anything was made. FilesError."""
        return (await self._sb._call("POST", "files/mkdir", json={"path": path}))["made"]

    async def watch(self, path: str, *, recursive: bool = False) -> AsyncWatcher:
        """Changes in a directory from now on (set up when this returns)."""
        w = AsyncWatcher()
        await w._start(self._sb, path, recursive)
        return w


class _achunks:
    """A streamed read: an async iterator of byte chunks; `await aclose()` (or `async
    with`, or reaching the end) lets the connection go."""

    def __init__(self, r: httpx.Response) -> None:
        self._r = r
        self._it = r.aiter_bytes(CHUNK)

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._it.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Let the connection go (the rest of the file unread)."""
        await self._r.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class AsyncWatcher:
    """The sync Watcher's face with await: `await next_events(timeout)`, `await
    get_new_events()`, `async for ev in w`, `await stop()`."""

    def __init__(self) -> None:
        self.done = False
        self.why: str | None = None
        self._q: asyncio.Queue = asyncio.Queue(maxsize=WATCH_QUEUE)   # bounded, as sync

    async def _start(self, sb: AsyncSandbox, path: str, recursive: bool) -> None:
        self.recursive = recursive
        req = sb._http.build_request("GET", f"/sandboxes/{sb.id}/files/watch",
                                     params={"path": path, "recursive": recursive},
                                     timeout=httpx.Timeout(None, connect=30))
        self._r = r = await sb._http.send(req, stream=True)
        if r.status_code >= 400:
            await r.aread()
            await r.aclose()
            _raise(r)
        self._lines = r.aiter_lines()
        try:
            kind, value = await _next_watch_line(self._lines)
        except BaseException:
            await r.aclose()
            raise
        if kind != "watching":
            await r.aclose()
            raise ApiError(502, "stream", "the watch stream did not start with its path")
        self.path: str = value
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                kind, value = await _next_watch_line(self._lines)
                if kind == "end":
                    self.why = value
                    return
                await self._q.put(value)
        except Exception:  # noqa: BLE001 - the stream broke or was closed by stop()
            return
        finally:
            try:
                self._q.put_nowait(None)
            except asyncio.QueueFull:
                pass     # full: the reader drains it, then finds the task done below

    async def next_events(self, timeout: float | None = None) -> list:
        """The events waiting, after waiting up to timeout seconds (None: until one
        comes) for the first; empty on timeout or once the watch has ended."""
        if self.done:
            return []
        if self._q.empty() and self._task.done():
            self.done = True
            return []
        try:
            item = (self._q.get_nowait() if timeout == 0 else
                    await asyncio.wait_for(self._q.get(), timeout))
        except (asyncio.QueueEmpty, TimeoutError):
            return []
        out = []
        while True:
            if item is None:
                self.done = True
                return out
            out.append(item)
            try:
                item = self._q.get_nowait()
            except asyncio.QueueEmpty:
                return out

    async def get_new_events(self) -> list:
        """The events that came since the last call, without waiting."""
        return await self.next_events(0)

    def __aiter__(self):
        return self._iter()

    async def _iter(self):
        while not self.done:
            for ev in await self.next_events(None):
                yield ev

    async def stop(self) -> None:
        """End the watch; idempotent."""
        self.done = True
        self._task.cancel()
        await self._r.aclose()

    close = stop

    async def __aenter__(self) -> AsyncWatcher:
        """`async with`: stop() at its end."""
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()


async def _next_watch_line(lines):
    while True:
        line = await lines.__anext__()
        if line:
            return watch_line(line)


class AsyncPtyHandle:
    """A terminal (await send_input(), resize(), kill(), wait()); on_data gets output."""

    pid: int | None              # inside the sandbox, as PtyHandle's
    pid_inside: int | None

    def __init__(self, ws, on_data, pid) -> None:
        self._ws = ws
        self._on_data = on_data
        self.pid = self.pid_inside = pid
        self._result: Result | None = None
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for msg in self._ws:
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

    async def send_input(self, data: bytes | str) -> None:
        """Type data (str: UTF-8) into the terminal. BrokenPipeError once it has ended."""
        from websockets.exceptions import ConnectionClosed

        if isinstance(data, str):
            data = data.encode("utf-8")
        try:
            await self._ws.send(bytes(data))
        except ConnectionClosed:
            raise BrokenPipeError("the terminal has ended") from None

    async def resize(self, cols: int, rows: int) -> None:
        """A new window size in characters (SIGWINCH to its foreground group)."""
        await self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def kill(self) -> None:
        """End the terminal's command; a no-op once it has ended."""
        from websockets.exceptions import ConnectionClosed

        try:
            await self._ws.send(json.dumps({"type": "kill"}))
        except ConnectionClosed:
            pass

    async def wait(self, timeout: float | None = None) -> Result:
        """The command's Result once it has ended (stdout: what the terminal showed).
        TimeoutError if it has not in `timeout` seconds."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the terminal's command is still running after "
                               f"{timeout} s") from None
        await self._ws.close()
        if self._result is None:
            raise ApiError(502, "stream", "the terminal's connection closed without a result")
        return self._result


class AsyncPty:
    """`sb.pty` with await: create."""

    def __init__(self, sb: AsyncSandbox) -> None:
        self._sb = sb

    async def create(self, cols: int = 80, rows: int = 24, cmd: str | list | None = None,
                     *, on_data=None, env: dict[str, str] | None = None,
                     cwd: str | None = None, timeout: float | None = None) -> AsyncPtyHandle:
        """As Pty.create: a terminal of cols x rows running cmd (default an interactive
        bash) with env, in cwd, timeout seconds (default the policy's); on_data gets
        bytes. Raises UsageError, UnsupportedRule, NotFound, RateLimited."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        sb = self._sb
        url = ws_url(str(sb._http.base_url).rstrip("/"), f"/sandboxes/{sb.id}/pty",
                     pty_params(cols, rows, cmd, cwd, timeout, env))
        try:
            ws = await connect(url, additional_headers={
                "Authorization": sb._http.headers["authorization"]}, open_timeout=60,
                max_size=2 << 20)
        except InvalidStatus as e:
            _raise_ws(e)
        first = json.loads(await asyncio.wait_for(ws.recv(), 60))
        return AsyncPtyHandle(ws, on_data, first.get("pid"))


class AsyncSandbox:
    """Sandbox with `await`: `sb = await AsyncSandbox.create(...)`, `async with`."""

    id: str
    isolation: str
    info: dict
    commands: AsyncCommands
    files: AsyncFiles
    pty: AsyncPty

    def __init__(self, info: dict, http: httpx.AsyncClient) -> None:
        self.id: str = info["id"]
        self.isolation: str = info.get("isolation", "")
        self.info = info
        self._http = http
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.pty = AsyncPty(self)

    @classmethod
    async def create(cls, policy: dict | None = None, *, timeout: float = 300,
                     metadata: dict[str, str] | None = None, user_account: bool = False,
                     api_url: str | None = None, api_key: str | None = None,
                     request_timeout: float = 300.0) -> AsyncSandbox:
        """As Sandbox.create: a live sandbox for `policy`, ended after `timeout` seconds
        (user_account: its unprivileged account). Raises CeilingError, PolicyError,
        RateLimited, AuthError."""
        url, headers = _config(api_url, api_key)
        http = async_client(url, headers, request_timeout)
        try:
            r = await http.post("/sandboxes", json=create_body(policy, timeout, metadata,
                                                               user_account))
            _raise(r)
        except BaseException:
            await http.aclose()
            raise
        return cls(r.json(), http)

    @classmethod
    async def connect(cls, sandbox_id: str, *, api_url: str | None = None,
                      api_key: str | None = None,
                      request_timeout: float = 300.0) -> AsyncSandbox:
        """A running sandbox of this token's, by id (NotFound otherwise)."""
        url, headers = _config(api_url, api_key)
        http = async_client(url, headers, request_timeout)
        try:
            r = await http.get(f"/sandboxes/{sandbox_id}")
            _raise(r)
        except BaseException:
            await http.aclose()
            raise
        return cls(r.json(), http)

    @staticmethod
    async def list(*, api_url: str | None = None, api_key: str | None = None) -> list[dict]:
        """This token's live sandboxes (dicts, as Sandbox.list)."""
        url, headers = _config(api_url, api_key)
        async with async_client(url, headers) as http:
            r = await http.get("/sandboxes")
            _raise(r)
            return r.json()["sandboxes"]

    async def _call(self, method: str, sub: str, **kw) -> Any:
        r = await self._http.request(method, f"/sandboxes/{self.id}/{sub}" if sub else
                                     f"/sandboxes/{self.id}", **kw)
        _raise(r)
        return r.json()

    async def get_info(self) -> SandboxInfo:
        """A SandboxInfo (state, created, ends, usage, ...). NotFound once it ended."""
        return info_of(dict(await self._call("GET", ""), id=self.id))

    async def set_timeout(self, seconds: float) -> None:
        """End the sandbox `seconds` from now (at most 7 days). NotFound once it ended."""
        await self._call("POST", "timeout", json={"timeout": seconds})

    async def exec(self, argv, *, stdin: str | bytes | None = None,
                   timeout: float | None = None, on_stdout=None,
                   on_stderr=None) -> Result:
        """Run argv (a list) or a shell line and wait: a Result (commands.run's
        arguments; callbacks get bytes)."""
        return await self.commands.run(argv, stdin=stdin, timeout=timeout,
                                       on_stdout=on_stdout, on_stderr=on_stderr)

    # -- run_code and code contexts --
    async def run_code(self, code: str, *, language: str | None = None, context=None,
                       timeout: float | None = None, on_stdout=None, on_stderr=None,
                       on_result=None, on_error=None, env: dict[str, str] | None = None):
        """As the sync run_code: an Execution; env for this cell only; the callbacks are
        plain functions (str chunks), called as lines come. Raises ContextError."""
        body = code_body(code, language, context, timeout, env)
        http_timeout = httpx.Timeout(None if timeout is None else timeout + 60, connect=30)
        if on_stdout is None and on_stderr is None and on_result is None and on_error is None:
            return execution_of(await self._call("POST", "run_code", json=body,
                                                 timeout=http_timeout))
        async with self._http.stream("POST", f"/sandboxes/{self.id}/run_code",
                                     params={"stream": "ndjson"}, json=body,
                                     timeout=http_timeout) as r:
            if r.status_code >= 400:
                await r.aread()
                _raise(r)
            async for line in r.aiter_lines():
                if line:
                    ex = code_line(line, on_stdout, on_stderr, on_result, on_error)
                    if ex is not None:
                        return ex
        raise ApiError(502, "stream", "the cell's stream ended without its Execution")

    async def create_context(self, language: str = "python", cwd: str | None = None, *,
                             engine: str | None = None):
        """A new interpreter (a Context); engine (python): "auto" (default), "ipykernel"
        or "runner". Raises ContextError."""
        return context_of(await self._call("POST", "contexts",
                                           json=context_body(language, cwd, engine)))

    async def list_contexts(self) -> list:
        """Every Context, the default ones included."""
        return [context_of(c) for c in (await self._call("GET", "contexts"))["contexts"]]

    async def restart_context(self, context) -> None:
        """A fresh interpreter for the context (same id). ContextError if none."""
        await self._call("POST", f"contexts/{context_id(context)}/restart")

    async def remove_context(self, context) -> None:
        """End and forget the context. ContextError if none."""
        await self._call("DELETE", f"contexts/{context_id(context)}")

    async def explain(self) -> dict:
        """The sandbox's policy explained (GET .../explain)."""
        return await self._call("GET", "explain")

    async def changes(self) -> list:
        """The review-mode workspace's changes (Change each). UsageError otherwise."""
        return changes_of(await self._call("GET", "changes"))

    async def changes_patch(self, paths=None) -> tuple[bytes, list]:
        """The changes as a git-style patch, and [(path, why)] of those left out."""
        return patch_of(await self._call("GET", "changes/diff", params={
            "path": list(paths or ()), "encoding": "base64"}))

    async def apply_changes(self, paths=None, *, exact: bool = False):
        """Copy the changes to the host's workspace (an Applied); CeilingError for a
        token without --apply-changes."""
        return applied_of(await self._call("POST", "changes/apply", json={
            "paths": None if paths is None else list(paths), "exact": exact}))

    async def discard_changes(self) -> None:
        """Forget every change (no command may be running)."""
        await self._call("POST", "changes/discard")

    async def stream_events(self, since: int = 0, *, follow: bool = True):
        """The sandbox's events as they come: an async iterator of {id, kind, data}."""
        async with self._http.stream("GET", f"/sandboxes/{self.id}/events",
                                     params={"since": since, "follow": follow},
                                     timeout=httpx.Timeout(None, connect=30)) as r:
            if r.status_code >= 400:
                await r.aread()
                _raise(r)
            lines = [line async for line in r.aiter_lines()] if not follow else None
            if lines is not None:
                for ev in sse_events(lines):
                    if ev["kind"] == "end":
                        return
                    yield ev
                return
            buf: list[str] = []
            async for line in r.aiter_lines():
                buf.append(line)
                if line == "":
                    for ev in sse_events(buf):
                        if ev["kind"] == "end":
                            return
                        yield ev
                    buf = []

    async def kill(self) -> None:
        """End the sandbox now (idempotent); None (teardown problems stay in the
        service's log)."""
        if self._http.is_closed:
            return
        try:
            r = await self._http.delete(f"/sandboxes/{self.id}")
            if r.status_code != 404:
                _raise(r)
        finally:
            await self._http.aclose()

    async def close(self) -> None:
        """kill(): what `async with` calls at its end."""
        await self.kill()

    async def __aenter__(self) -> AsyncSandbox:
        """`async with`: the sandbox is killed at its end."""
        return self

    async def __aexit__(self, *exc) -> None:
        await self.kill()
