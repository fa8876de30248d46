"""The SDK, sync: Sandbox, its commands, files, terminals, changes and events."""

from __future__ import annotations

import json
import threading
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
    _raise_raw,
    _raise_ws,
    _result,
    applied_of,
    as_bytes,
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
    sync_client,
    watch_line,
    write_info_of,
    ws_url,
)

#: bytes a streamed read hands over at a time (as runtime.files.CHUNK)
CHUNK = 1 << 20
#: watch events a Watcher holds for its reader at most
WATCH_QUEUE = 4096


class CommandHandle:
    """A background command on the service (runtime.commands.CommandHandle's face): pid,
    cmd, running, wait(timeout), kill(), send_signal(sig), send_stdin(data, timeout),
    close_stdin(). With on_stdout / on_stderr, a thread of its own streams the output
    (bytes) to them as it comes."""

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
        """Whether it still runs (one request). Raises ApiError (NotFound once the
        service let it go: it keeps the last 16 ended commands)."""
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
        """SIGKILL the command and every process it started. Raises NotFound if the
        service no longer knows it."""
        self._sb._call("POST", f"commands/{self.pid}/kill")

    def send_signal(self, sig: int) -> bool:
        """Send signal number `sig` (1-64) to the command's own process (not those it
        started); False once it has exited."""
        return self._sb._call("POST", f"commands/{self.pid}/signal",
                              json={"signal": int(sig)})["sent"]

    def send_stdin(self, data: bytes | str, timeout: float | None = None) -> None:
        """Write data (str: UTF-8) to its stdin. Waits while the pipe is full, at most
        `timeout` seconds if given (then TimeoutError, part of data perhaps written).
        BrokenPipeError once its stdin is closed (or it ended), as in-process."""
        with broken_pipe():
            self._sb._call("POST", f"commands/{self.pid}/stdin", json=stdin_body(
                data, timeout=timeout), timeout=None if timeout is None else timeout + 30)

    def close_stdin(self) -> None:
        """Close its stdin (the command reads end of file); a no-op once closed."""
        try:
            self._sb._call("POST", f"commands/{self.pid}/stdin",
                           json=stdin_body(b"", True))
        except SandboxClosed as e:
            if e.field != "pid":
                raise

    def __repr__(self) -> str:
        return f"<CommandHandle pid={self.pid} {list(self.cmd)!r:.60}>"


class Commands:
    """`sb.commands`: run (foreground or background) and list, as runtime.commands."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def run(self, cmd, *, env: dict[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | str | None = None, timeout: float | None = None,
            on_stdout=None, on_stderr=None, background: bool = False,
            user: str | None = None):
        """Run `cmd` (a shell line as str, or an argv list) with `env` added, in `cwd`,
        `stdin` (str or bytes) as its input. Foreground (default): waits and returns its
        Result; `timeout` seconds (default the policy's limits.timeout). on_stdout /
        on_stderr get each chunk as bytes as it comes (as in-process; wrap a callback in
        corral.TextChunks for str). If this call is interrupted (the connection drops),
        the service kills the command. background=True: a CommandHandle at once (default
        no timeout); it runs until it exits, is killed, or the sandbox ends. user: "root"
        (default) or "user" (the account of create(user_account=True)). Raises
        SandboxClosed (the sandbox ended), UsageError, ApiError (NotFound, RateLimited)."""
        sb = self._sb
        body = exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                         background=background)
        on_stdout, on_stderr = bytes_output(body, on_stdout, on_stderr)
        if user is not None:
            body["user"] = user
        if background:
            return CommandHandle(sb, sb._call("POST", "exec", json=body), on_stdout,
                                 on_stderr)
        if on_stdout is None and on_stderr is None:
            return _result(sb._exec(body, None if timeout is None else timeout + 60))
        http_timeout = httpx.Timeout(None if timeout is None else timeout + 60, connect=30)
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
        """The commands running now, then processes finished ones left behind (a
        CommandInfo each: pid inside, cmd, background, started, detached)."""
        return [rec(CommandInfo, d) for d in self._sb._call("GET", "commands")["commands"]]


class Files:
    """The sandbox's files over the service: runtime.files.Files' names and shapes (read,
    write, write_files, write_archive, list, info, exists, remove, rename, make_dir,
    watch). Errors are FilesError / FileNotFound, as in-process."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def read(self, path: str, format: str = "text"):
        """The file's content: "text" (UTF-8, bad bytes replaced), "bytes", or "stream"
        (an iterator of byte chunks as they arrive, for big files: the file is opened now,
        the transfer runs as you iterate; close() the iterator to stop early; chunks of
        1 MiB). Raises FileNotFound, FilesError (a directory, a bad format)."""
        check_format(format, path)
        sb = self._sb
        req = sb._http.build_request("GET", f"/sandboxes/{sb.id}/files/content",
                                     params={"path": path},
                                     timeout=httpx.Timeout(None, connect=30))
        r = sb._http.send(req, stream=True)
        if r.status_code >= 400:
            r.read()
            r.close()
            _raise(r)
        if format == "stream":
            return _chunks(r)
        try:
            data = r.read()
        finally:
            r.close()
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    def write(self, path: str, data, *, extract: bool = False):
        """Write data (str: UTF-8; bytes-like; a readable file object) to path, parents
        made, atomically; a WriteInfo. extract=True: data is a tar to unpack into the
        directory path (write_archive). Raises FilesError (a read-only path, a
        directory there), ApiError with status 413 over the service's 16 MiB cap."""
        if extract:
            return self.write_archive(path, data)
        return write_info_of(self._sb._call("PUT", "files/content", params={"path": path},
                                            content=as_bytes(data)))

    def write_files(self, files) -> list:
        """Write each of [{"path": ..., "data": ...}, ...] (or (path, data) pairs) in turn,
        in one request; a WriteInfo each. Raises FilesError at the first that fails (those
        before it are written), ApiError 413 over 16 MiB in all."""
        d = self._sb._call("POST", "files/batch", json=batch_body(files))
        return [write_info_of(w) for w in d["written"]]

    def write_archive(self, path: str, tar):
        """Unpack a tar (bytes or a binary file object; plain, gzip, bzip2 or xz) into the
        directory path, checked whole first on the service (runtime.archive): a member
        absolute or with `..`, a link out, a device node refuse it, nothing written
        (FilesError). A WriteInfo of the directory; ApiError 413 over 16 MiB."""
        return write_info_of(self._sb._call("PUT", "files/archive", params={"path": path},
                                            content=as_bytes(tar)))

    def list(self, path: str = ".", depth: int = 1) -> list:
        """The entries below path, down to depth levels: EntryInfo each (name, path,
        type, size (bytes), mode, mtime (time.time()), symlink_target), sorted by path;
        depth >= 1 (default 1: the directory's own entries). Raises FileNotFound."""
        d = self._sb._call("GET", "files/list", params={"path": path, "depth": depth})
        return [entry_of(x) for x in d["entries"]]

    def info(self, path: str):
        """The entry itself (a link described, not followed): an EntryInfo. Raises
        FileNotFound."""
        return entry_of(self._sb._call("GET", "files/info", params={"path": path}))

    def exists(self, path: str) -> bool:
        """Whether anything is at path (a dangling link counts)."""
        return self._sb._call("GET", "files/exists", params={"path": path})["exists"]

    def remove(self, path: str) -> None:
        """Remove a file, a link (not what it points to) or a directory tree. Raises
        FileNotFound, FilesError (a read-only path)."""
        self._sb._call("DELETE", "files", params={"path": path})

    def rename(self, old: str, new: str):
        """Move an entry within the sandbox (replacing a file at new); its new EntryInfo.
        Raises FileNotFound (no old), FilesError."""
        return entry_of(self._sb._call("POST", "files/rename", json={"old": old,
                                                                      "new": new}))

    def make_dir(self, path: str) -> bool:
        """The directory and its missing parents; True if anything was made. Raises
        FilesError (a file in the way, a read-only path)."""
        return self._sb._call("POST", "files/mkdir", json={"path": path})["made"]

    def watch(self, path: str, *, recursive: bool = False) -> Watcher:
        """Changes in a directory from now on (the watch is set up when this returns): a
        Watcher, as in-process (recursive: the subdirectories too). Raises FileNotFound,
        FilesError (not a directory)."""
        return Watcher(self._sb, path, recursive)


class _chunks:
    """A streamed read: an iterator of byte chunks; close() (or `with`, or reaching the
    end) lets the connection go, whether or not it was iterated."""

    def __init__(self, r: httpx.Response) -> None:
        self._r = r
        self._it = r.iter_bytes(CHUNK)

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._it)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let the connection go (the rest of the file unread)."""
        self._r.close()

    def __enter__(self):
        """`with`: close() at its end."""
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Watcher:
    """A watch on the service (runtime.watch.Watcher's face): get_new_events() (what came,
    without waiting), next_events(timeout) (waits up to timeout for the first), iteration
    (each event as it comes), stop(). Events are runtime.watch.FilesystemEvent: type
    "add", "modify", "remove", "rename", "chmod" or "overflow", name, path. A thread of
    its own reads the stream."""

    def __init__(self, sb: Sandbox, path: str, recursive: bool) -> None:
        import queue

        self.recursive = recursive
        self.done = False
        self.why: str | None = None
        # bounded: a reader that falls behind makes the stream wait (the service's own
        # queue, then the kernel's, which reports "overflow"), never memory grow here
        self._q: queue.Queue = queue.Queue(maxsize=WATCH_QUEUE)
        req = sb._http.build_request("GET", f"/sandboxes/{sb.id}/files/watch",
                                     params={"path": path, "recursive": recursive},
                                     timeout=httpx.Timeout(None, connect=30))
        self._r = r = sb._http.send(req, stream=True)
        if r.status_code >= 400:
            r.read()
            r.close()
            _raise(r)
        self._lines = r.iter_lines()
        try:
            kind, value = _next_watch_line(self._lines)
        except BaseException:
            r.close()
            raise
        if kind != "watching":
            r.close()
            raise ApiError(502, "stream", "the watch stream did not start with its path")
        self.path: str = value
        self._thread = threading.Thread(target=self._read, daemon=True,
                                        name="corral-client-watch")
        self._thread.start()

    def _read(self) -> None:
        import queue

        try:
            while True:
                kind, value = _next_watch_line(self._lines)
                if kind == "end":
                    self.why = value
                    return
                while not self.done:
                    try:
                        self._q.put(value, timeout=1.0)
                        break
                    except queue.Full:
                        continue
        except Exception:  # noqa: BLE001 - the stream broke or was closed by stop()
            return
        finally:
            try:
                self._q.put_nowait(None)
            except queue.Full:
                pass     # full: the reader drains it, then finds the stream's end below

    def next_events(self, timeout: float | None = None) -> list:
        """The events waiting, after waiting up to timeout seconds (None: until one comes)
        for the first. Empty on timeout, or once the watch has ended."""
        import queue

        if self.done:
            return []
        if self._q.empty() and not self._thread.is_alive():
            self.done = True
            return []
        try:
            first = self._q.get(timeout=timeout) if timeout != 0 else self._q.get_nowait()
        except queue.Empty:
            return []
        out = []
        item = first
        while True:
            if item is None:
                self.done = True
                return out
            out.append(item)
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return out

    def get_new_events(self) -> list:
        """The events that came since the last call, without waiting (a list)."""
        return self.next_events(0)

    def __iter__(self):
        while not self.done:
            yield from self.next_events(None)

    def stop(self) -> None:
        """End the watch (its stream closed); idempotent."""
        self.done = True
        self._r.close()

    close = stop

    def __enter__(self) -> Watcher:
        """`with`: stop() at its end."""
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _next_watch_line(lines):
    while True:
        line = next(lines)
        if line:                 # blank lines keep an idle stream open
            return watch_line(line)


class PtyHandle:
    """A terminal on the service over a WebSocket (runtime.pty.PtyHandle's face): pid (its
    command's, inside the sandbox: the host's pids stay on the host), send_input, resize,
    kill, wait. Output reaches on_data (bytes) from a thread of its own, as it comes."""

    pid: int | None              # inside the sandbox (in-process: the host's)
    pid_inside: int | None       # the same pid, under in-process's name for it

    def __init__(self, ws, on_data) -> None:
        self._ws = ws
        self._on_data = on_data
        self._result: Result | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        first = json.loads(ws.recv(timeout=60))
        #: the terminal's command's pid inside the sandbox (in-process, `pid` is the
        #: host's and `pid_inside` this one; the service never shows host pids)
        self.pid: int | None = first.get("pid")
        self.pid_inside: int | None = self.pid
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
        """A new window size in characters; the command's foreground group gets SIGWINCH
        (a bad size is reported by the service on the socket, not raised here)."""
        self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def kill(self) -> None:
        """End the terminal's command (and what it started); a no-op once it has ended.
        wait() then gives its Result (verdict "killed")."""
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
        """`with`: the terminal's command is killed at its end if still running."""
        return self

    def __exit__(self, *exc) -> None:
        if self._result is None:
            self.kill()
            try:
                self.wait(30)
            except (TimeoutError, ApiError):
                self._ws.close()


class Pty:
    """`sb.pty`: terminals over a WebSocket (create), as runtime.pty.Pty."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def create(self, cols: int = 80, rows: int = 24, cmd: str | list | None = None, *,
               on_data=None, env: dict[str, str] | None = None, cwd: str | None = None,
               timeout: float | None = None) -> PtyHandle:
        """A terminal of cols x rows characters running cmd (a shell command line or an
        argv list; default an interactive bash) with `env` added, in `cwd`; on_data is
        called with each chunk (bytes) it shows, from a thread of the handle's. timeout:
        seconds (default the policy's limits.timeout). Raises UsageError (a bad size,
        env or cwd), UnsupportedRule (a tier without terminals), NotFound, RateLimited
        (the token's max_concurrent or the server's max_terminals; retry_after)."""
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        sb = self._sb
        url = ws_url(str(sb._http.base_url).rstrip("/"), f"/sandboxes/{sb.id}/pty",
                     pty_params(cols, rows, cmd, cwd, timeout, env))
        try:
            ws = connect(url, additional_headers={"Authorization":
                                                  sb._http.headers["authorization"]},
                         open_timeout=60, max_size=2 << 20)
        except InvalidStatus as e:
            _raise_ws(e)
        return PtyHandle(ws, on_data)


class Sandbox:
    """A sandbox on a corral service. Made by Sandbox.create or Sandbox.connect."""

    id: str
    isolation: str               # the tier: "namespace", "gvisor", ...
    info: dict                   # the service's view of it when made (GET /sandboxes/{id})
    commands: Commands
    files: Files
    pty: Pty

    def __init__(self, info: dict, http: httpx.Client) -> None:
        self.id: str = info["id"]
        self.isolation: str = info.get("isolation", "")
        self.info = info
        self._http = http
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)
        #: where a foreground command's Result is asked for without httpx (_fast.py):
        #: None until the first, False where httpx must carry it
        self._fast = None

    @classmethod
    def create(cls, policy: dict | None = None, *, timeout: float = 300,
               metadata: dict[str, str] | None = None, user_account: bool = False,
               api_url: str | None = None, api_key: str | None = None,
               request_timeout: float = 300.0) -> Sandbox:
        """A new live sandbox for `policy` (a dict in the TOML layout), within the token's
        ceiling (CeilingError naming the rule otherwise), ended after `timeout` seconds
        (default 300; set_timeout changes it) or by kill(). user_account=True: an
        unprivileged account beside root (commands.run(user="user"); the namespace tier
        with the service as root, UnsupportedRule elsewhere). request_timeout: seconds
        of each HTTP request. Raises PolicyError, RateLimited, AuthError."""
        url, headers = _config(api_url, api_key)
        http = sync_client(url, headers, request_timeout)
        try:
            r = http.post("/sandboxes", json=create_body(policy, timeout, metadata,
                                                         user_account))
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
        http = sync_client(url, headers, request_timeout)
        try:
            r = http.get(f"/sandboxes/{sandbox_id}")
            _raise(r)
        except BaseException:
            http.close()
            raise
        return cls(r.json(), http)

    @staticmethod
    def list(*, api_url: str | None = None, api_key: str | None = None) -> list[dict]:
        """This token's live sandboxes, each as GET /sandboxes/{id} shows it (id,
        isolation, created, policy, state, ends, usage, metadata). Raises AuthError."""
        url, headers = _config(api_url, api_key)
        with sync_client(url, headers) as http:
            r = http.get("/sandboxes")
            _raise(r)
            return r.json()["sandboxes"]

    def _call(self, method: str, sub: str, **kw) -> Any:
        r = self._http.request(method, f"/sandboxes/{self.id}/{sub}" if sub else
                               f"/sandboxes/{self.id}", **kw)
        _raise(r)
        return r.json()

    def _exec(self, body: dict, timeout: float | None, sub: str = "exec") -> Any:
        """POST exec's (or `sub`'s: run_code) JSON answer (a foreground command or cell,
        no stream): on a kept-alive connection of its own where that applies (_fast.py),
        else through httpx; the same errors either way. `timeout`: each read's and
        write's, None for none."""
        if self._fast is None:
            from ._fast import route_of

            self._fast = route_of(self._http) or False
        if self._fast is False or self._http.is_closed:
            return self._call("POST", sub, json=body,
                              timeout=httpx.Timeout(timeout, connect=30))
        from ._fast import post_exec

        status, headers, raw = post_exec(self._fast, self.id, body, timeout, sub)
        if status >= 400:
            _raise_raw(status, raw, headers.get("retry-after"))
        return json.loads(raw)

    # -- the live sandbox's face --
    @property
    def state(self) -> str:
        """"running" or "ended" (one request)."""
        return self.get_info().state

    @property
    def ends(self) -> float:
        """When (time.time()) its timeout passes (one request)."""
        return self.get_info().ends

    def get_info(self) -> SandboxInfo:
        """A SandboxInfo: state, created, ends (time.time() values), policy digest,
        idle_timeout, usage so far, metadata, ended_by, offers. Raises NotFound once the
        sandbox has ended and the service let it go."""
        d = self._call("GET", "")
        return info_of(dict(d, id=self.id))

    def set_timeout(self, seconds: float) -> None:
        """End the sandbox `seconds` from now (longer or shorter than before; at most 7
        days). Raises NotFound once it has ended."""
        self._call("POST", "timeout", json={"timeout": seconds})

    def exec(self, argv, *, stdin: str | bytes | None = None,
             timeout: float | None = None, on_stdout=None, on_stderr=None) -> Result:
        """Run argv (a list) or a shell line (a str) and wait: a corral Result;
        commands.run's stdin, timeout (seconds) and bytes callbacks."""
        return self.commands.run(argv, stdin=stdin, timeout=timeout, on_stdout=on_stdout,
                                 on_stderr=on_stderr)

    # -- run_code and code contexts --
    def run_code(self, code: str, *, language: str | None = None, context=None,
                 timeout: float | None = None, on_stdout=None, on_stderr=None,
                 on_result=None, on_error=None, env: dict[str, str] | None = None):
        """Run a cell in a persistent interpreter (language "python" by default,
        "javascript" or "bash"; or `context`: a Context or its id); its Execution
        (runtime.session's). timeout: seconds (default the policy's limits.timeout). env:
        variables for this cell only (python, javascript). on_stdout / on_stderr get each
        chunk (str, as in-process), on_result each CodeResult, on_error the
        ExecutionError, as they come. Raises ContextError (no such context, a language
        not the context's, a bad env), SandboxClosed."""
        body = code_body(code, language, context, timeout, env)
        http_timeout = httpx.Timeout(None if timeout is None else timeout + 60, connect=30)
        if on_stdout is None and on_stderr is None and on_result is None and on_error is None:
            return execution_of(self._exec(body, None if timeout is None else timeout + 60,
                                           "run_code"))
        with self._http.stream("POST", f"/sandboxes/{self.id}/run_code",
                               params={"stream": "ndjson"}, json=body,
                               timeout=http_timeout) as r:
            if r.status_code >= 400:
                r.read()
                _raise(r)
            for line in r.iter_lines():
                if line:
                    ex = code_line(line, on_stdout, on_stderr, on_result, on_error)
                    if ex is not None:
                        return ex
        raise ApiError(502, "stream", "the cell's stream ended without its Execution")

    def create_context(self, language: str = "python", cwd: str | None = None, *,
                       engine: str | None = None):
        """A new interpreter of its own (python, javascript or bash) starting in `cwd`
        (default the sandbox's working directory): a Context (id, language, cwd) to give
        run_code(context=). engine (python): "auto" (default), "ipykernel" or "runner".
        Raises ContextError (a bad cwd, an engine the image lacks)."""
        return context_of(self._call("POST", "contexts", json=context_body(
            language, cwd, engine)))

    def list_contexts(self) -> list:
        """Every Context, the languages' default ones (made by run_code) included."""
        return [context_of(c) for c in self._call("GET", "contexts")["contexts"]]

    def restart_context(self, context) -> None:
        """A fresh interpreter for the context (a Context or its id; same id); its
        variables are gone. Raises ContextError if there is no such context."""
        self._call("POST", f"contexts/{context_id(context)}/restart")

    def remove_context(self, context) -> None:
        """End the context's interpreter and forget it (a Context or its id); ContextError
        if there is none."""
        self._call("DELETE", f"contexts/{context_id(context)}")

    def explain(self) -> dict:
        """The sandbox's policy explained (docs/explain.md: what it may read, write and
        reach), as GET .../explain answers."""
        return self._call("GET", "explain")

    # -- review mode --
    def changes(self) -> list:
        """What the sandbox changed in its review-mode workspace (runtime.changes.Change
        each). Raises UsageError where the workspace is not in review mode."""
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
        """Forget every change: the workspace looks inside as the host's is (no command
        may be running). Raises UsageError where the workspace is not in review mode."""
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
        """End the sandbox on the service now: every process, mount and its proxy go
        (idempotent: a second kill, or one after it ended, is a no-op). Returns None,
        where in-process returns teardown problems (those stay in the service's log)."""
        if self._http.is_closed:
            return
        try:
            r = self._http.delete(f"/sandboxes/{self.id}")
            if r.status_code != 404:
                _raise(r)
        finally:
            self._http.close()

    def close(self) -> None:
        """kill(): what `with` calls at its end."""
        self.kill()

    def __enter__(self) -> Sandbox:
        """`with`: the sandbox is killed at its end."""
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
