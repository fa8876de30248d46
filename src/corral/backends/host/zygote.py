"""The supervisor's side of the egress proxy's zygote (egress/zygote.py): one per
supervisor process, started in the background, asked for a proxy per sandbox.

    warm()                                   # start it now (a live sandbox, a service)
    got, notice = fork_proxy(config_json, listener, attach, uid, gid)
    if got is None: ...start a fresh proxy (launch.start_proxy)
    pid, events_r, err_r = got               # notice: None, or why the zygote was replaced

A proxy forked from the zygote is this process's child (clone(CLONE_PARENT)), so
host/proxy.Proxy stops and reaps it as it does a fresh one. Whenever the zygote cannot
serve (not ready yet, disabled, dead, stuck) the caller starts a fresh proxy: a sandbox
never waits for the zygote's start-up and never depends on it. A dead or stuck zygote is
reaped and a new one started in the background (at most RESTARTS in RESTART_WINDOW_S;
then none for this process's life), and the proxy started meanwhile says so in a
"notice" event.

CORRAL_EGRESS_ZYGOTE=0 in the environment turns it off (every proxy starts afresh).
"""

from __future__ import annotations

import array
import json
import os
import select
import socket
import sys
import threading
import time

from ...linux.supervise import kill_pid

#: how long a request may wait for the zygote's answer before it counts as stuck
REPLY_TIMEOUT_S = 2.0
#: restarts allowed within RESTART_WINDOW_S; beyond them, fresh proxies only
RESTARTS = 3
RESTART_WINDOW_S = 60.0

_lock = threading.Lock()
_zygote: _Zygote | None = None
_restarts: list[float] = []
_gave_up = False
_pending_notice: str | None = None
_started_proxies = 0


def enabled() -> bool:
    return not _disabled and os.environ.get("CORRAL_EGRESS_ZYGOTE", "1") != "0"


_disabled = False


def disable() -> None:
    """No zygote in this process (a detached sandbox's supervisor: one proxy only)."""
    global _disabled
    _disabled = True


class _Zygote:
    def __init__(self) -> None:
        from ...linux.supervise import spawn
        from .launch import proxy_env

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        null_r = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        null_w = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            argv = [sys.executable, "-I", "-c", "import corral.egress.zygote as z; z.main()",
                    str(theirs.fileno())]
            self.pid, _, _ = spawn(argv[0], argv, proxy_env(), stdin_fd=null_r,
                                   pass_fds=(theirs.fileno(),), stdout_fd=null_w)
        finally:
            theirs.close()
            os.close(null_r)
            os.close(null_w)
        self.ctrl = ours
        self.ready = False
        #: the spare proxy waiting in the zygote (our child: clone(CLONE_PARENT)), or None
        self.spare: int | None = None

    def poll_ready(self) -> bool:
        """Has it said ready (without waiting)? Raises OSError if it ended instead."""
        if self.ready:
            return True
        p = select.poll()
        p.register(self.ctrl, select.POLLIN)
        if not p.poll(0):
            return False
        msg = self._reply(self.ctrl.recv(1024))
        if msg.get("ready") is not True:
            raise OSError("the zygote sent a bad first message")
        self.ready = True
        return True

    def _reply(self, data: bytes) -> dict:
        """A message of the zygote's, checked; notes its spare and reaps the dead ones."""
        if not data:
            raise OSError("the zygote ended")
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            raise OSError("the zygote sent a bad message")
        self.spare = _pid(msg.get("spare"))
        for p in msg.get("reap", []) if isinstance(msg.get("reap"), list) else []:
            _reap(_pid(p))
        return msg

    def request(self, uid: int, gid: int, fds: list[int]) -> int:
        """A proxy's pid. OSError when the zygote is gone or stuck, ValueError when it
        refused (it is still serving)."""
        msg = json.dumps({"uid": uid, "gid": gid}).encode()
        self.ctrl.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   array.array("i", fds))])
        p = select.poll()
        p.register(self.ctrl, select.POLLIN)
        if not p.poll(int(REPLY_TIMEOUT_S * 1000)):
            raise OSError("the zygote did not answer within "
                          f"{REPLY_TIMEOUT_S:g}s")
        reply = self._reply(self.ctrl.recv(1024))
        pid = _pid(reply.get("pid"))
        if pid is not None:
            return pid
        raise ValueError(str(reply.get("error", "bad reply"))[:300])

    def end(self) -> str:
        """Kill and reap it and its spare; how it ended, in words."""
        self.ctrl.close()
        _reap(self.spare)
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if not done:
                kill_pid(self.pid)
                _, status = os.waitpid(self.pid, 0)
                return "stuck, killed"
        except ChildProcessError:
            return "ended (already reaped)"
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exited with status {os.WEXITSTATUS(status)}"


def _pid(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _reap(pid: int | None) -> None:
    """Kill and reap pid if it is a child of ours (a spare; never anyone else's)."""
    if pid is None:
        return
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if not done:
            kill_pid(pid)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def warm() -> None:
    """Start the zygote now if it is enabled and not running (returns at once)."""
    with _lock:
        _ensure()


def _ensure() -> None:
    global _zygote, _gave_up
    if _zygote is not None or _gave_up or not enabled():
        return
    now = time.monotonic()
    _restarts[:] = [t for t in _restarts if now - t < RESTART_WINDOW_S]
    if len(_restarts) > RESTARTS:
        _gave_up = True
        return
    _restarts.append(now)
    try:
        _zygote = _Zygote()
    except OSError:
        _gave_up = True
        return
    if len(_restarts) == 1:
        import atexit

        atexit.register(_close_at_exit)


def _close_at_exit() -> None:
    """At this process's exit: close its end of the control socket (the zygote ends at
    EOF), rather than leave the socket to the interpreter's teardown (a ResourceWarning)."""
    z = _zygote
    if z is not None:
        z.ctrl.close()


def _lost(why: str) -> None:
    """The zygote cannot serve: reap it, remember the notice, start another."""
    global _zygote, _pending_notice
    z, _zygote = _zygote, None
    how = z.end() if z is not None else "gone"
    _pending_notice = (f"the egress proxy's zygote ({why}; {how}) was replaced: this "
                       f"sandbox's proxy was started afresh")
    _ensure()


def fork_proxy(config_json: str, listener: socket.socket, attach: list[int], uid: int,
               gid: int, *, live: bool = False):
    """((pid, events_r, err_r) of a proxy forked from the zygote, or None: then start a
    fresh one; notice: None, or why the zygote was replaced since the last proxy). The zygote starts on a live sandbox's proxy or this process's
    second one (a one-shot `corral run` never pays for it)."""
    global _started_proxies
    from .launch import config_fd

    with _lock:
        _started_proxies += 1
        if live or _started_proxies > 1:
            _ensure()
        z = _zygote
        try:
            if z is None or not z.poll_ready():
                return None, _take_notice()
        except OSError as e:
            _lost(str(e))
            return None, _take_notice()
        events_r, events_w = os.pipe()
        err_r, err_w = os.pipe()
        cfd = config_fd(config_json)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid = z.request(uid, gid, [cfd, listener.fileno(), null, events_w, err_w,
                                       *attach])
        except (OSError, ValueError) as e:
            os.close(events_r)
            os.close(err_r)
            if isinstance(e, OSError):
                _lost(str(e) or type(e).__name__)
            return None, _take_notice()
        finally:
            for fd in (cfd, null, events_w, err_w):
                os.close(fd)
        return (pid, events_r, err_r), _take_notice()


def _take_notice() -> str | None:
    global _pending_notice
    notice, _pending_notice = _pending_notice, None
    return notice


def zygote_pid() -> int | None:
    """The running zygote's pid (tests, benches)."""
    with _lock:
        return _zygote.pid if _zygote is not None else None


def wait_ready(timeout: float = 10.0) -> bool:
    """Start the zygote if needed and wait until it is ready (benches, tests, a service
    that wants its first sandbox's proxy fast)."""
    deadline = time.monotonic() + timeout
    warm()
    while time.monotonic() < deadline:
        with _lock:
            z = _zygote
            if z is None:
                return False
            try:
                if z.poll_ready():
                    return True
            except OSError as e:
                _lost(str(e))
        time.sleep(0.005)
    return False


def _after_fork_in_child() -> None:
    """A forked child of the supervisor (an entrant, a detached supervisor) has no zygote
    of its own: the pid is not its child. It starts its own if it needs one."""
    global _lock, _zygote, _started_proxies
    _lock = threading.Lock()
    if _zygote is not None:
        try:
            _zygote.ctrl.close()
        except OSError:
            pass
    _zygote = None
    _started_proxies = 0


os.register_at_fork(after_in_child=_after_fork_in_child)
