"""A live sandbox of another process (its supervisor: runtime/supervisor.py), reached
through the registry and its unix socket.

    sb = corral.Sandbox.connect("3f9c0a1b2c4d")
    sb.commands.run("cat /scratch/notes").stdout
    h = sb.commands.run("python3 -m http.server 8000", background=True)
    sb.get_info(); sb.set_timeout(600); sb.kill()

The same faces as a Live sandbox's (commands.run foreground and background, list,
get_info, set_timeout, kill); each command is one connection, its output streamed as it
comes. Everything the supervisor sends is parsed strictly (supervisor.recv_frame).
"""

from __future__ import annotations

import socket
import threading

from ..errors import CorralError, SandboxClosed, UsageError
from ..result import Result, Usage
from .commands import CommandInfo, argv_of
from .live import SandboxInfo
from .registry import check_id, read_entry
from .supervisor import MAX_STDIN_CHUNK, ProtocolError, b64, recv_frame, send_frame, unb64

MAX_OUTPUT_CHUNK = 1 << 19


def _error(frame: dict) -> CorralError:
    kind = str(frame.get("kind", "error"))[:64]
    message = str(frame.get("message", "the supervisor failed"))[:2000]
    # the classes a caller tells apart (and their exit codes: a usage error is 2, as
    # in-process); any other kind keeps its name on a plain CorralError
    cls = {"closed": SandboxClosed, "usage": UsageError}.get(kind, CorralError)
    err = cls(message)
    err.kind = kind
    return err


class RemoteSandbox:
    """A live sandbox served by its supervisor process."""

    def __init__(self, sandbox_id: str) -> None:
        self.id = check_id(sandbox_id)
        entry = read_entry(self.id)
        if entry is None:
            raise SandboxClosed(f"no live sandbox {self.id} on this host (see `corral "
                                f"sandbox ls`)")
        self._socket = entry["socket"]
        self.isolation = entry["isolation"]
        self.metadata = entry["metadata"]
        self.commands = RemoteCommands(self)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self._socket)
        except OSError:
            s.close()
            raise SandboxClosed(f"sandbox {self.id} has ended (its supervisor is gone)") from None
        return s

    def _call(self, req: dict, want: str) -> dict:
        with self._connect() as s:
            try:
                send_frame(s, req)
                frame = recv_frame(s)
            except ConnectionError:    # reset or broken pipe: the supervisor died mid-call
                frame = None
        if frame is None:
            raise SandboxClosed(f"sandbox {self.id}: the supervisor closed the connection")
        if frame.get("ev") == "error":
            raise _error(frame)
        if frame.get("ev") != want:
            raise ProtocolError(f"expected {want!r}, got {frame.get('ev')!r}")
        return frame

    def get_info(self) -> SandboxInfo:
        info = self._call({"op": "info"}, "info").get("info")
        if not isinstance(info, dict):
            raise ProtocolError("info is not an object")
        return SandboxInfo(**{k: info[k] for k in SandboxInfo._fields if k in info})

    def set_timeout(self, seconds: float) -> None:
        self._call({"op": "set_timeout", "seconds": seconds}, "ok")

    def kill(self) -> list[str]:
        try:
            self._call({"op": "kill"}, "ok")
        except SandboxClosed:
            pass
        return []

    def close(self) -> list[str]:
        """Forget it: the sandbox is its supervisor's and keeps running (kill() ends it)."""
        return []

    @property
    def state(self) -> str:
        try:
            return self.get_info().state
        except SandboxClosed:
            return "ended"

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<corral remote sandbox {self.id}>"

    def __getattr__(self, name: str):
        # what a Live sandbox has and the supervisor's socket does not serve (yet): one
        # clear line instead of an AttributeError
        if name in _NOT_SERVED:
            raise UsageError(f"{name}: not served to a sandbox reached with "
                             f"Sandbox.connect() (only commands, get_info, set_timeout and "
                             f"kill are); use it in the process that created the sandbox, "
                             f"or through corral serve (docs/sessions.md)", field=name)
        raise AttributeError(name)


#: a Live sandbox's faces that a RemoteSandbox does not have
_NOT_SERVED = frozenset({"files", "pty", "run_code", "create_context", "list_contexts",
                         "restart_context", "remove_context", "changes", "apply_changes",
                         "discard_changes", "changes_patch", "exec", "files_for"})


class RemoteHandle:
    """A command in a remote sandbox: pid, wait, kill, send_stdin, close_stdin."""

    def __init__(self, sock: socket.socket, on_stdout, on_stderr) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._on = {"out": on_stdout, "err": on_stderr}
        self._chunks = {"out": [], "err": []}
        self._result: Result | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        frame = recv_frame(sock)
        if frame is None or frame.get("ev") == "error":
            sock.close()
            raise _error(frame or {})
        pid = frame.get("pid")
        if frame.get("ev") != "started" or not isinstance(pid, int):
            sock.close()
            raise ProtocolError("expected the command's start")
        self.pid = pid
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                frame = recv_frame(self._sock)
                if frame is None:
                    raise SandboxClosed("the supervisor closed the connection")
                ev = frame.get("ev")
                if ev in ("out", "err"):
                    data = unb64(frame.get("data"), MAX_OUTPUT_CHUNK)
                    self._chunks[ev].append(data)
                    if self._on[ev] is not None:
                        self._on[ev](data)
                elif ev == "result":
                    self._result = _result(frame.get("result"), self._chunks)
                    return
                elif ev == "error":
                    raise _error(frame)
                else:
                    raise ProtocolError(f"unexpected {ev!r}")
        except BaseException as e:  # noqa: BLE001 - given to wait()
            self._error = e
        finally:
            self._sock.close()
            self._done.set()

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> Result:
        if not self._done.wait(timeout):
            raise TimeoutError(f"command {self.pid} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result

    def _send(self, req: dict) -> None:
        try:
            send_frame(self._sock, req, self._send_lock)
        except OSError:
            raise BrokenPipeError("the command has ended") from None

    def send_stdin(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        for i in range(0, len(data), MAX_STDIN_CHUNK):
            self._send({"op": "stdin", "data": b64(data[i:i + MAX_STDIN_CHUNK])})

    def close_stdin(self) -> None:
        self._send({"op": "close_stdin"})

    def kill(self) -> None:
        try:
            self._send({"op": "kill"})
        except BrokenPipeError:
            pass


def _result(d, chunks) -> Result:
    if not isinstance(d, dict):
        raise ProtocolError("the result is not an object")
    usage = d.get("usage") if isinstance(d.get("usage"), dict) else {}
    fields = {k: d[k] for k in Result._fields if k in d and k not in ("usage", "stdout",
                                                                      "stderr")}
    r = Result(**fields, usage=Usage(**{k: usage[k] for k in Usage._fields if k in usage}))
    r.stdout = b"".join(chunks["out"]).decode("utf-8", errors="replace")
    r.stderr = b"".join(chunks["err"]).decode("utf-8", errors="replace")
    return r


class RemoteCommands:
    def __init__(self, owner: RemoteSandbox) -> None:
        self._owner = owner

    def run(self, cmd, *, env=None, cwd=None, stdin=None, timeout=None, on_stdout=None,
            on_stderr=None, background: bool = False):
        """As Live's commands.run; stdin: None or bytes (sent, then closed), or for a
        background command more later with send_stdin()."""
        argv_of(cmd)   # the same checks, here too: a clear error before any connection
        if stdin is not None and not isinstance(stdin, (bytes, bytearray, str)):
            raise TypeError("stdin must be None, str or bytes for a remote sandbox")
        s = self._owner._connect()
        try:
            send_frame(s, {"op": "run", "cmd": cmd if isinstance(cmd, str) else list(cmd),
                           "env": env, "cwd": cwd, "timeout": timeout,
                           "background": background,
                           "stdin": stdin is not None or background})
            h = RemoteHandle(s, on_stdout, on_stderr)
        except BaseException:
            s.close()
            raise
        if stdin is not None:
            h.send_stdin(stdin)
            if not background:
                h.close_stdin()
        return h if background else h.wait()

    def list(self) -> list[CommandInfo]:
        out = []
        for c in self._owner._call({"op": "list"}, "list").get("commands") or []:
            if isinstance(c, dict):
                out.append(CommandInfo(**{k: tuple(c[k]) if isinstance(c[k], list) else c[k]
                                          for k in CommandInfo._fields if k in c}))
        return out


def connect(sandbox_id: str) -> RemoteSandbox:
    return RemoteSandbox(sandbox_id)
