"""A supervisor process per detached live sandbox: it owns bwrap and the sandbox, and
serves clients (`Sandbox.connect(id)`, `corral sandbox exec/ls/kill`) over a unix socket.

    sid = start_detached(policy, timeout=600)     # spawns the supervisor, waits for ready
    sb = corral.Sandbox.connect(sid)              # runtime/remote.py

Why a supervisor and a socket (rather than clients entering with setns themselves): the
sandbox's state lives in one place (its command cgroups, its timeout and idle clock, the
egress proxy, bwrap as a child with --die-with-parent, the subreaper that reaps its init),
one process enforces its limits and ends it, and a client needs no privilege beyond
reaching the socket. The socket is `<run dir>/sock`, mode 0600, in a run directory owned
by corral's uid; every connection's peer must be that uid or root (SO_PEERCRED).

The protocol: frames of a 4-byte big-endian length and a JSON object, at most MAX_FRAME
bytes; anything else closes the connection. Requests (one per connection for "run"):

    {"op": "run", "cmd": str | [str], "env": {..} | null, "cwd": str | null,
     "timeout": number | null, "background": bool, "stdin": bool}
        -> {"ev": "started", "pid": N}, then {"ev": "out" | "err", "data": BASE64}...,
           then {"ev": "result", "result": {...Result, without stdout and stderr...}}.
           While it runs the client may send {"op": "stdin", "data": BASE64},
           {"op": "close_stdin"}, {"op": "kill"}.
    {"op": "info"} -> {"ev": "info", "info": {...}}
    {"op": "list"} -> {"ev": "list", "commands": [...]}
    {"op": "set_timeout", "seconds": N} -> {"ev": "ok"}
    {"op": "kill"} -> {"ev": "ok"} (the supervisor then exits)
    any failure -> {"ev": "error", "kind": ..., "message": ...}

If the supervisor is killed (even SIGKILL), bwrap dies with it and the next corral start
sweeps the run directory, its mounts, cgroups and registry entry (linux/rundir.py). The
supervisor runs below a reaper process of its own (`_reaper`), so that what its death
leaves (the zombies of the commands it entered, which the sandbox's init waits for) is
reaped whatever process started it and whatever subreaper or PID 1 is above.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import sys
import threading

MAX_FRAME = 1 << 20
#: the largest stdin chunk a client may send in one frame (base64 fits MAX_FRAME)
MAX_STDIN_CHUNK = 512 * 1024
#: how long start_detached waits for the supervisor to say it is ready
READY_TIMEOUT_S = 60.0
OPS = ("run", "info", "list", "set_timeout", "kill", "stdin", "close_stdin")


class ProtocolError(Exception):
    pass


def send_frame(sock: socket.socket, obj: dict, lock: threading.Lock | None = None) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise ProtocolError("frame too large")
    frame = struct.pack(">I", len(data)) + data
    if lock is None:
        sock.sendall(frame)
    else:
        with lock:
            sock.sendall(frame)


def recv_frame(sock: socket.socket) -> dict | None:
    """The next frame's object; None at a clean end of stream. Raises ProtocolError."""
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes, over {MAX_FRAME}")
    data = _recv_exact(sock, n)
    if data is None:
        raise ProtocolError("connection closed inside a frame")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):   # RecursionError: nesting past ~1000 levels
        raise ProtocolError("a frame is not JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a frame is not a JSON object")
    return obj


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if not buf:
                return None
            raise ProtocolError("connection closed inside a frame")
        buf += chunk
    return bytes(buf)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text, most: int) -> bytes:
    if not isinstance(text, str) or len(text) > (most * 4) // 3 + 4:
        raise ProtocolError("data must be base64 text within the size bound")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ProtocolError("data is not base64") from None


def _field(req: dict, name: str, types, optional: bool = True):
    v = req.get(name)
    if v is None and optional:
        return None
    if not isinstance(v, types) or isinstance(v, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)):
        raise ProtocolError(f"{name} has the wrong type")
    return v


# ---- the server ----------------------------------------------------------------------

class Server:
    """Serves one live sandbox on a unix socket until the sandbox ends."""

    def __init__(self, sb) -> None:
        self.sb = sb
        self.path = os.path.join(sb._live.dir.path, "sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(old)
        self.listener.listen(64)
        self.done = threading.Event()

    def serve(self) -> None:
        import select

        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        while self.sb.state == "running" and not self.done.is_set():
            if not poller.poll(500):
                continue
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()
        self.listener.close()

    def _peer_ok(self, conn: socket.socket) -> bool:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        return uid in (0, os.geteuid())

    def _conn(self, conn: socket.socket) -> None:
        lock = threading.Lock()
        try:
            with conn:
                if not self._peer_ok(conn):
                    return
                req = recv_frame(conn)
                if req is None:
                    return
                op = req.get("op")
                if op not in OPS:
                    raise ProtocolError(f"unknown op {op!r}")
                try:
                    if op == "run":
                        self._run(conn, req, lock)
                    elif op == "info":
                        send_frame(conn, {"ev": "info", "info": self.sb.get_info().to_dict()})
                    elif op == "list":
                        send_frame(conn, {"ev": "list", "commands": [
                            c.to_dict() for c in self.sb.commands.list()]})
                    elif op == "set_timeout":
                        self.sb.set_timeout(_field(req, "seconds", (int, float), False))
                        send_frame(conn, {"ev": "ok"})
                    elif op == "kill":
                        self.sb.kill()
                        send_frame(conn, {"ev": "ok"})
                        self.done.set()
                    else:
                        raise ProtocolError(f"{op} outside a run")
                except ProtocolError:
                    raise
                except Exception as e:  # noqa: BLE001 - reported to the client
                    kind = getattr(e, "kind", type(e).__name__)
                    send_frame(conn, {"ev": "error", "kind": kind, "message": str(e)}, lock)
        except (ProtocolError, OSError) as e:
            try:
                send_frame(conn, {"ev": "error", "kind": "protocol", "message": str(e)}, lock)
            except OSError:
                pass

    def _run(self, conn: socket.socket, req: dict, lock) -> None:
        cmd = req.get("cmd")
        if not isinstance(cmd, (str, list)):
            raise ProtocolError("cmd must be a string or a list")
        env = _field(req, "env", dict)
        cwd = _field(req, "cwd", str)
        timeout = _field(req, "timeout", (int, float))
        background = req.get("background") is True
        with_stdin = req.get("stdin") is True
        if timeout is None and not background:
            from ..plan import WallClock

            timeout = self.sb.plan.find(WallClock)[0].seconds

        # output may come before run() returns: the command's thread waits for "started";
        # this thread's own (an exec failure, reported inside run()) is sent after it
        said_started = threading.Event()
        me, early = threading.get_ident(), []

        def send(ev: str, data: bytes) -> None:
            frame = {"ev": ev, "data": b64(data)}
            if not said_started.is_set() and threading.get_ident() == me:
                early.append(frame)
                return
            said_started.wait()
            send_frame(conn, frame, lock)

        def out(data: bytes) -> None:
            send("out", data)

        def err(data: bytes) -> None:
            send("err", data)

        h = self.sb.commands.run(cmd, env=env, cwd=cwd, timeout=timeout, on_stdout=out,
                                 on_stderr=err, background=True)
        if not with_stdin:
            h.close_stdin()
        try:
            send_frame(conn, {"ev": "started", "pid": h.pid}, lock)
            for frame in early:
                send_frame(conn, frame, lock)
        finally:
            said_started.set()
        reader = threading.Thread(target=self._client_input, args=(conn, h), daemon=True)
        reader.start()
        result = h.wait()
        d = result.to_dict()
        d.pop("stdout"), d.pop("stderr")
        send_frame(conn, {"ev": "result", "result": d}, lock)

    def _client_input(self, conn: socket.socket, h) -> None:
        """stdin, close_stdin and kill from the client while its command runs; a client
        that goes away closes the command's stdin (a background command keeps running)."""
        try:
            while h.running:
                req = recv_frame(conn)
                if req is None:
                    break
                op = req.get("op")
                if op == "stdin":
                    try:
                        h.send_stdin(unb64(req.get("data"), MAX_STDIN_CHUNK))
                    except BrokenPipeError:
                        pass
                elif op == "close_stdin":
                    h.close_stdin()
                elif op == "kill":
                    h.kill()
                else:
                    raise ProtocolError(f"{op!r} during a run")
        except (ProtocolError, OSError):
            pass
        finally:
            h.close_stdin()


# ---- the supervisor process ------------------------------------------------------------

def main() -> int:
    """`python -m corral.runtime.supervisor`: reads {"policy_toml", "explicit", "timeout",
    "metadata"} as JSON from stdin, creates the sandbox, registers it, writes
    `ready ID` (or `error JSON`) on stdout, then serves until the sandbox ends."""
    if os.fork():      # the starter waits only for this first process: no zombie left
        os._exit(0)
    _reaper()          # returns in the supervisor, a child of a reaper of its own
    raw = sys.stdin.buffer.read(MAX_FRAME + 1)
    out = sys.stdout
    try:
        if len(raw) > MAX_FRAME:
            raise ProtocolError("configuration too large")
        conf = json.loads(raw)
        import tomllib

        from ..backends.host import zygote
        from ..policy import policy_from_dict
        from .live import Live, policy_digest
        from .registry import remove_entry, write_entry

        # one sandbox, one proxy for this process's life: a zygote would only add a
        # process (it pays off from the second proxy of a process on)
        zygote.disable()
        policy = policy_from_dict(tomllib.loads(conf["policy_toml"]))
        policy = policy.replace(explicit=frozenset(conf["explicit"]))
        sb = Live(policy, timeout=conf["timeout"], metadata=conf.get("metadata"))
        server = Server(sb)
        write_entry({"id": sb.id, "pid": os.getpid(), "socket": server.path,
                     "created": sb.created, "ends": sb.ends, "isolation": sb.isolation,
                     "policy_digest": policy_digest(policy), "metadata": sb.metadata})
    except Exception as e:  # noqa: BLE001 - reported to whoever started us
        out.write("error " + json.dumps({"kind": getattr(e, "kind", type(e).__name__),
                                         "message": str(e),
                                         "exit_code": getattr(e, "exit_code", 125)}) + "\n")
        out.flush()
        return 1
    out.write(f"ready {sb.id}\n")
    out.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        server.serve()
    finally:
        sb.kill()
        remove_entry(sb.id)
    return 0


def _reaper() -> None:
    """Fork the supervisor under a process of its own that is a child subreaper and does
    nothing but reap, until the supervisor and everything it left are gone; return in the
    supervisor.

    Why: a command entered into a live sandbox is a child of the supervisor (linux/enter.py),
    outside the sandbox's pid namespace. Killed with the supervisor (init's end takes the
    whole namespace), it is a zombie that only its new parent can reap, and the sandbox's
    init does not finish exiting (zap_pid_ns_processes) until every process of its
    namespace is reaped. The new parent would be the nearest child subreaper above, or the
    host's PID 1: a PID 1 that never reaps (some containers), or a process that is a
    subreaper and does not reap (an application while corral itself made it one for a run,
    which then never waits for orphans it did not start) keeps the sandbox's init and its
    namespaces for as long as it lives. With this reaper in between, the supervisor's
    orphans come here, whoever started it, and are reaped at once."""
    from ..linux._sys import become_subreaper

    become_subreaper()
    pid = os.fork()
    if pid == 0:
        return
    # holds nothing of the starter's: its stdout pipe reaches EOF when the supervisor goes
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:   # nothing left below this process
            os._exit(0)
        except InterruptedError:
            continue


def start_detached(policy, *, timeout: float = 300, metadata=None, env=None) -> str:
    """Start a supervisor process for a new live sandbox; returns its id once it is
    ready. Raises the supervisor's own error (a CorralError with its message) if the
    sandbox could not be made."""
    import subprocess

    from ..errors import CorralError
    from ..policy.dump import dump_toml
    from .live import _check_metadata, _check_timeout

    conf = {"policy_toml": dump_toml(policy), "explicit": sorted(policy.explicit),
            "timeout": _check_timeout(timeout), "metadata": _check_metadata(metadata)}
    p = subprocess.Popen([sys.executable, "-m", "corral.runtime.supervisor"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, start_new_session=True,
                         env=dict(os.environ if env is None else env))
    try:
        p.stdin.write(json.dumps(conf).encode())
        p.stdin.close()
        line = p.stdout.readline(MAX_FRAME).decode(errors="replace").strip()
    finally:
        p.stdout.close()
    p.wait()
    if line.startswith("ready "):
        return line[6:]
    try:
        info = json.loads(line[6:]) if line.startswith("error ") else {}
    except ValueError:
        info = {}
    err = CorralError(info.get("message") or f"the supervisor exited ({p.returncode}) "
                                             f"without a sandbox")
    err.kind = info.get("kind", "setup")
    err.exit_code = info.get("exit_code", 125)
    raise err


if __name__ == "__main__":
    sys.exit(main())
