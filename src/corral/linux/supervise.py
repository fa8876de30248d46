"""Starting one sandbox process and watching it: output caps, wall clock, CPU time.

Tier-neutral: a backend hands over the argv to exec (bwrap, runsc, ...), the environment,
the fds to pass, a `child_setup` run between fork and exec (cgroup attach, rlimits, dropping
to the sandbox uid, parent-death signal), and a `kill` for everything of the run. No
`subprocess`: a plain fork/exec keeps the start-up path short and lets the child setup run
in the right order.
"""

from __future__ import annotations

import _signal  # the C module: `signal` would import enum on the start-up path
import os
import select
import sys
import time

from ..errors import SandboxSetupError
from ._sys import child_ids

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

READ_CHUNK = 65536
#: after the sandbox's main process is gone, how long to wait for its pipes to close
DRAIN_GRACE_S = 2.0


class Stream:
    """One captured output stream with a byte cap: what is past the cap is read and dropped.

    cap None: nothing is kept and every byte goes to on_data (a stream its reader bounds
    itself, such as a run_code interpreter's: runtime/session.py)."""

    __slots__ = ("cap", "chunks", "kept", "truncated", "on_data")

    def __init__(self, cap: int | None, on_data: Callable[[bytes], None] | None) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False
        self.on_data = on_data

    def feed(self, data: bytes) -> None:
        if self.cap is None:
            if data and self.on_data is not None:
                self.on_data(data)
            return
        room = self.cap - self.kept
        if len(data) > room:
            data = data[:max(room, 0)]
            self.truncated = True
        if data:
            self.kept += len(data)
            self.chunks.append(data)
            if self.on_data is not None:
                self.on_data(data)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


class Outcome:
    __slots__ = ("status", "timed_out", "wall_s", "stdout", "stderr")

    def __init__(self) -> None:
        self.status: int | None = None      # raw wait status of the process we started
        self.timed_out: str | None = None   # "timeout" | "cpu_time"
        self.wall_s = 0.0
        self.stdout: Stream | None = None
        self.stderr: Stream | None = None


def spawn(path: str, argv: list[str], env: dict[str, str], *, stdin_fd: int,
          pass_fds: tuple[int, ...], child_setup: Callable[[], None] | None = None,
          uid: int | None = None, gid: int | None = None,
          stdout_fd: int | None = None) -> tuple[int, int, int]:
    """fork + exec. Returns (pid, stdout read fd, stderr read fd).

    With `stdout_fd` (a pty slave: corral.linux.tty) the child's stdout and stderr are that fd,
    no pipes are made, and both read fds returned are -1.

    With `uid`/`gid` the child drops every group and takes uid:gid before exec. Without a
    `child_setup`, the fork and exec are CPython's own C code (subprocess's), which costs
    about half of a fork from Python: no Python runs in the child, no at-fork hooks, no
    copy-on-write faults from reference counts. With uid/gid too, and this process plain
    root, this thread takes uid:gid for the moment of a vfork (_sys.child_ids), which
    saves copying the page tables as well (about 0.7 ms for a 12 MB supervisor; a fork
    costs more the bigger the host program); the child then needs no setuid of its own.
    The caller then does in the parent whatever must happen before the command runs
    (bwrap waits for it: see namespace.py).

    Signals: the child starts with every disposition at its default and nothing blocked,
    whatever this process ignores or this thread blocks (inherited_signals). The C path
    resets only SIGPIPE and SIGXFSZ, so when anything else is ignored or blocked (a caller
    under nohup, say) the Python fork path is taken, which resets them all; nothing is
    changed in this process itself (dispositions are process-wide: the host program's
    own SIG_IGN must stay)."""
    ignored, blocked = inherited_signals()
    if stdout_fd is None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ours = [out_r, out_w, err_r, err_w]
    else:
        out_r = err_r = -1
        out_w = err_w = stdout_fd
        ours = []
    fail_r, fail_w = os.pipe()  # CLOEXEC: closes on a successful exec
    try:
        if child_setup is None and _fork_exec is not None and not (ignored or blocked):
            fds = tuple(sorted({*pass_fds, fail_w}))
            if uid is not None and gid is not None and child_ids.usable():
                with child_ids(uid, gid):    # and so a vfork: see child_ids
                    pid = _fork_exec(path, argv, env, stdin_fd, out_w, err_w, fail_r,
                                     fail_w, fds, None, None)
            else:
                pid = _fork_exec(path, argv, env, stdin_fd, out_w, err_w, fail_r, fail_w,
                                 fds, uid, gid)
        else:
            pid = _py_fork_exec(path, argv, env, stdin_fd, out_w, err_w, fail_w, pass_fds,
                                child_setup, uid, gid, ignored)
    except BaseException:
        for fd in (*ours, fail_r, fail_w):
            os.close(fd)
        raise
    for fd in (*ours[1::2], fail_w):   # the write ends
        os.close(fd)
    report = os.read(fail_r, 1000)
    os.close(fail_r)
    if report:
        os.waitpid(pid, 0)
        for fd in ours[0::2]:
            os.close(fd)
        if report.startswith(b"exec:"):   # a child_setup's own exec of the command failed
            raise _exec_report(report)
        message, code = _fail_report(report)
        raise SandboxSetupError(f"starting {path} failed: {message}", step="exec",
                                errno=code)
    return pid, out_r, err_r


#: what Python itself ignores (SIGPIPE, SIGXFSZ) and the C fork_exec puts back to default
#: (restore_signals); as bits of /proc's SigIgn mask (bit n-1 is signal n)
_PYTHON_IGNORES = 1 << 12 | 1 << 24


def inherited_signals() -> tuple[list[int], bool]:
    """(signals ignored in this process, whether this thread blocks any): what a child
    would carry across exec, which keeps SIG_IGN dispositions and the signal mask. Python's
    own SIGPIPE and SIGXFSZ are left out (both paths of spawn reset them). The caller of a
    library may ignore or block anything (`nohup`, `trap '' INT`, a thread that blocks
    signals for sigwait); the sandboxed command must start with every signal at its
    default and none blocked, or SIGINT/SIGHUP would not stop it and a blocked SIGTERM
    would wait forever. Read from /proc (the kernel's view: C code may have changed a
    disposition behind Python's back), about 25 us."""
    fd = os.open("/proc/thread-self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 8192)
    finally:
        os.close(fd)
    masks = {}
    for key in (b"SigBlk:", b"SigIgn:"):
        at = data.find(b"\n" + key)
        if at < 0:   # not Linux's /proc: assume the worst, the Python path resets both
            return list(range(1, 65)), True
        at += len(key) + 1
        masks[key] = int(data[at:data.index(b"\n", at)], 16)
    ign = masks[b"SigIgn:"] & ~_PYTHON_IGNORES
    return [n + 1 for n in range(ign.bit_length()) if ign >> n & 1], masks[b"SigBlk:"] != 0


def _py_fork_exec(path, argv, env, stdin_fd, out_w, err_w, fail_w, pass_fds, child_setup,
                  uid, gid, ignored=()) -> int:
    # os.fsencode: a str made from bytes that are not UTF-8 (sys.argv, a file name, both
    # decoded with surrogateescape) goes back to those bytes
    envb = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    argvb = [os.fsencode(a) for a in argv]
    pid = os.fork()
    if pid == 0:  # child: no Python-level cleanup may run here, only exec or _exit
        try:
            # Python ignores SIGPIPE and SIGXFSZ, the caller may ignore more (`ignored`,
            # see inherited_signals); the sandboxed command gets the defaults (so `yes |
            # head -1` ends quietly, RLIMIT_FSIZE raises SIGXFSZ, Ctrl-C stops it), and
            # no blocked signals. Handlers need no reset: exec sets them to default.
            _signal.signal(13, 0)   # SIGPIPE, SIG_DFL
            _signal.signal(25, 0)   # SIGXFSZ, SIG_DFL
            for sig in ignored:
                if sig not in (9, 19):   # SIGKILL, SIGSTOP: never ignored
                    try:
                        _signal.signal(sig, 0)
                    except (OSError, ValueError):
                        pass  # glibc's own (32, 33): not ours to change
            _signal.pthread_sigmask(2, [])  # SIG_SETMASK, nothing blocked
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            global _child_fail_fd
            _child_fail_fd = fail_w
            if child_setup is not None:
                child_setup()  # may use fds of the parent's (cgroup.procs): before closing
            if gid is not None:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
            if uid is not None:
                os.setresuid(uid, uid, uid)
            keep = sorted(set(pass_fds) | {fail_w})
            lo = 3
            for fd in keep:
                if fd > lo:
                    os.closerange(lo, fd)
                lo = fd + 1
            os.closerange(lo, 1 << 16)
            for fd in pass_fds:
                os.set_inheritable(fd, True)
            os.execve(path, argvb, envb)
        except BaseException as e:  # noqa: BLE001 - report anything to the parent, then die
            try:
                code = getattr(e, "errno", 0) or 0
                os.write(fail_w, f"py:{code}:{type(e).__name__}: {e}".encode()[:1000])
            finally:
                os._exit(127)
    return pid


def _c_fork_exec_311(path, argv, env, stdin_fd, out_w, err_w, fail_r, fail_w, pass_fds,
                     uid, gid) -> int:
    """CPython 3.11-3.13's _posixsubprocess.fork_exec (the 23-argument form subprocess
    uses). `pass_fds` must hold fail_w, which stays close-on-exec; the others become
    inheritable. Signals the parent ignores (SIGPIPE, SIGXFSZ) are reset to their defaults
    (restore_signals). CPython uses vfork when no uid/gid change is asked for. A child that
    fails before exec writes "Name:hex errno:message"."""
    envl = [os.fsencode(f"{k}={v}") for k, v in env.items()]   # bytes not UTF-8 kept
    groups = [] if gid is not None else None
    return _posixsubprocess.fork_exec(
        [os.fsencode(a) for a in argv], [os.fsencode(path)], True, pass_fds, None, envl,
        stdin_fd, -1, -1, out_w, -1, err_w, fail_r, fail_w, True, False, -1,
        gid, groups, uid, -1, None, True)


_child_fail_fd = -1


def child_fail_fd() -> int:
    """In a child_setup (the child of spawn's Python fork, or a fork of it): the fd whose
    closing on exec tells spawn the exec succeeded. A child_setup that execs the command
    itself keeps it open (close-on-exec) and, if that exec fails, writes
    `report_exec_failure` there: spawn then raises ExecFailed."""
    return _child_fail_fd


def report_exec_failure(errno: int, interpreter: str | None = None) -> bytes:
    """What a child_setup writes to child_fail_fd() when its exec of the command failed."""
    return f"exec:{errno}:".encode() + (interpreter or "").encode(errors="replace")[:256]


def _exec_report(report: bytes) -> ExecFailed:
    """ExecFailed from `exec:ERRNO:INTERPRETER` (a child of ours wrote it before it exec'd
    anything of the sandbox's; still parsed strictly)."""
    _, _, rest = report.partition(b":")
    code, _, interp = rest.partition(b":")
    errno = int(code) if code.isdigit() and len(code) <= 4 else 0
    return ExecFailed(errno, interp[:256].decode(errors="replace") or None)


def _fail_report(report: bytes) -> tuple[str, int | None]:
    """(message, errno) from what a child wrote on the fail pipe before it died:
    `py:errno:Type: message` (_py_fork_exec) or `Type:hex errno:noexec|message` (C)."""
    text = report.decode(errors="replace")
    if text.startswith("py:"):
        code, _, msg = text[3:].partition(":")
        ok = code.isascii() and code.isdigit() and len(code) <= 4 and int(code)
        return msg, int(code) if ok else None
    name, _, rest = text.partition(":")
    hexcode, _, msg = rest.partition(":")
    try:
        code = int(hexcode, 16) if hexcode and len(hexcode) <= 4 else 0
    except ValueError:
        code = 0
    detail = os.strerror(code) if code else (msg or name)
    message = f"{name}: {detail}" + (f" ({msg})" if msg and code and msg != "noexec" else "")
    return message, code or None


try:  # private, but what subprocess itself calls; its signature is known per version
    import _posixsubprocess
except ImportError:  # pragma: no cover - not CPython on a POSIX system
    _posixsubprocess = None
_fork_exec = (_c_fork_exec_311 if _posixsubprocess is not None
              and (3, 11) <= sys.version_info[:2] <= (3, 13) else None)


def supervise(pid: int, out_r: int, err_r: int, *, timeout: float, cpu_time: float,
              cpu_seconds: Callable[[], float] | None, output_cap: int | None,
              on_stdout: Callable[[bytes], None] | None = None,
              on_stderr: Callable[[bytes], None] | None = None,
              kill: Callable[[], None], started: float,
              extra: dict[int, Callable[[bytes], None]] | None = None,
              before_wait: Callable[[], None] | None = None, pidfd: int = -1,
              exit_status: Callable[[int], int] | None = None) -> Outcome:
    """Watch the process until it and its output are done, enforcing the limits.
    `extra` fds (e.g. the egress proxy's events) are read along the way; they do not keep
    the watch going, and stay open for the caller. `before_wait`: called once the process
    has exited, before it is reaped (a live sandbox's entrant: linux/enter.py).
    `pidfd` (the caller's, left open) and `exit_status` (its wait status once the pidfd
    said it exited): for a process that is not our child (a live sandbox's command, which
    the entrants' zygote reaps); else it is our child, watched and reaped here."""
    sel = select.epoll()
    w = None
    try:
        w = Watch(sel, pid, out_r, err_r, timeout=timeout, cpu_time=cpu_time,
                  cpu_seconds=cpu_seconds, output_cap=output_cap, on_stdout=on_stdout,
                  on_stderr=on_stderr, kill=kill, started=started, extra=extra,
                  before_wait=before_wait, pidfd=pidfd, exit_status=exit_status)
        while not w.done:
            for fd, _ in sel.poll(w.wait()):
                w.ready(fd)
            w.tick()
    finally:
        sel.close()
        if w is not None:
            w.close()
    return w.outcome


class Watch:
    """supervise()'s state, step by step, for whoever polls its fds: supervise() with
    epoll in its thread, or an event loop (runtime/commands.py's foreground command of
    the service, each fd a reader of the loop). `poller` has register(fd, mask) and
    unregister(fd). The caller polls, calls ready(fd) for each fd readable, then tick();
    wait() is how long it may sleep until the next tick (seconds, >= 0), `done` when the
    process has exited and its output is all in; close() once over (also on an error)."""

    def __init__(self, poller, pid: int, out_r: int, err_r: int, *, timeout: float,
                 cpu_time: float, cpu_seconds: Callable[[], float] | None,
                 output_cap: int | None, on_stdout: Callable[[bytes], None] | None = None,
                 on_stderr: Callable[[bytes], None] | None = None,
                 kill: Callable[[], None], started: float,
                 extra: dict[int, Callable[[bytes], None]] | None = None,
                 before_wait: Callable[[], None] | None = None, pidfd: int = -1,
                 exit_status: Callable[[int], int] | None = None,
                 before_fd: int = -1) -> None:
        """`before_fd`: an fd that becomes readable once before_wait() would not wait
        (a live sandbox's entrant's pidfd: linux/enter.py); polled here instead of
        waited for in before_wait() (an event loop never waits)."""
        out = self.outcome = Outcome()
        self.before_fd = before_fd
        self.pid, self.sel, self.kill, self.started = pid, poller, kill, started
        self.cpu_time, self.cpu_seconds = cpu_time, cpu_seconds
        self.before_wait, self.exit_status = before_wait, exit_status
        self.extra = dict(extra or {})
        out.stdout = Stream(output_cap, on_stdout)
        out.stderr = Stream(output_cap, on_stderr)
        self.streams = {fd: s for fd, s in ((out_r, out.stdout), (err_r, out.stderr))
                        if fd >= 0}
        self.own_pidfd = pidfd < 0
        self.pidfd = os.pidfd_open(pid) if pidfd < 0 else pidfd
        try:
            for fd in self.streams:
                poller.register(fd, select.EPOLLIN)
            poller.register(self.pidfd, select.EPOLLIN)
            for fd in self.extra:
                poller.register(fd, select.EPOLLIN)
        except BaseException:
            self.close()
            raise
        self.deadline = started + timeout
        self.poll_every = 0.05 if cpu_seconds is not None else None
        self.next_poll = time.monotonic() + (self.poll_every or 0)
        self.drain_until: float | None = None

    @property
    def done(self) -> bool:
        return not self.streams and self.outcome.status is not None

    def wait(self) -> float:
        out, now = self.outcome, time.monotonic()
        if self.drain_until is not None:     # exited: only the pipes are left to drain
            wait = self.drain_until - now
        else:                                # running, or killed and about to exit
            wait = self.deadline - now
            if self.poll_every is not None and out.timed_out is None:
                wait = min(wait, self.next_poll - now)
        return max(wait, 0)

    def ready(self, fd: int) -> None:
        if fd == self.before_fd:
            self.sel.unregister(fd)
            self.before_fd = -1
            self._exited()
            return
        if fd == self.pidfd:
            if self.outcome.status is not None:
                return
            self.sel.unregister(self.pidfd)
            if self.before_fd >= 0 and not _readable(self.before_fd):
                self.sel.register(self.before_fd, select.EPOLLIN)   # then _exited()
                return
            self.before_fd = -1
            self._exited()
            return
        if fd in self.extra:
            data = os.read(fd, READ_CHUNK)
            if data:
                self.extra[fd](data)
            else:
                self.sel.unregister(fd)
                del self.extra[fd]
            return
        stream = self.streams.get(fd)
        if stream is None:
            return
        data = os.read(fd, READ_CHUNK)
        if data:
            stream.feed(data)
        else:
            self.sel.unregister(fd)
            os.close(fd)
            del self.streams[fd]

    def _exited(self) -> None:
        """The process has exited (its pidfd said so): its status taken."""
        if self.before_wait is not None:
            self.before_wait()
        if self.exit_status is not None:
            self.outcome.status = self.exit_status(self.pid)
        else:
            self.outcome.status = os.waitpid(self.pid, 0)[1]
        self.drain_until = time.monotonic() + DRAIN_GRACE_S

    def tick(self) -> None:
        out, now, streams = self.outcome, time.monotonic(), self.streams
        if out.status is None and out.timed_out is None:
            if now >= self.deadline:
                out.timed_out = "timeout"
                self.kill()
            elif self.poll_every is not None and now >= self.next_poll:
                self.next_poll = now + self.poll_every
                if self.cpu_seconds() >= self.cpu_time:  # type: ignore[misc]
                    out.timed_out = "cpu_time"
                    self.kill()
            if out.timed_out:
                self.deadline = now + 3600  # the kill is done; wait for the exit
        if self.drain_until is not None and now >= self.drain_until and streams:
            self.kill()  # something still holds the pipes: the run is over, end it
            for fd in list(streams):
                _read_what_is_there(fd, streams[fd])
                self.sel.unregister(fd)
                os.close(fd)
                del streams[fd]

    def close(self) -> None:
        """Its own fds closed (the pidfd it opened, the pipes not yet drained); the
        outcome's wall time set."""
        if self.own_pidfd and self.pidfd >= 0:
            os.close(self.pidfd)
        self.pidfd = -1
        for fd in self.streams:
            os.close(fd)
        self.streams = {}
        self.outcome.wall_s = time.monotonic() - self.started


class LoopWatch:
    """A Watch driven by an event loop (asyncio's: add_reader, remove_reader, call_later):
    each fd a reader of the loop, its ticks a timer. `then(outcome, error)` is called once,
    from the loop, when it is over (error: what a step raised; the Watch is closed
    then, and the process perhaps still running: the caller kills it)."""

    def __init__(self, loop, then, pid: int, out_r: int, err_r: int, **kw) -> None:
        self.loop, self.then, self.fds, self.timer = loop, then, set(), None
        self.w = None
        self.w = Watch(self, pid, out_r, err_r, **kw)
        self._arm()

    def register(self, fd: int, _mask: int) -> None:
        self.loop.add_reader(fd, self._step, fd)
        self.fds.add(fd)

    def unregister(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        self.fds.discard(fd)

    def _arm(self) -> None:
        self.timer = self.loop.call_later(self.w.wait(), self._step, None)

    def _step(self, fd) -> None:
        w = self.w
        if w is None:
            return
        try:
            if fd is not None:
                w.ready(fd)
            w.tick()
            if not w.done:
                if fd is None or self.timer.when() > self.loop.time() + w.wait():
                    self.timer.cancel()
                    self._arm()
                return
        except BaseException as e:   # noqa: BLE001 - handed to `then`
            self._over(e)
            return
        self._over(None)

    def _over(self, error) -> None:
        w, self.w = self.w, None
        self.timer.cancel()
        for fd in list(self.fds):
            self.unregister(fd)
        w.close()
        self.then(w.outcome, error)


def _readable(fd: int) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def _read_what_is_there(fd: int, stream: Stream, most: int = 64) -> None:
    """What a pipe holds now, at most `most` reads (a writer that survived the kill could
    otherwise keep this going)."""
    os.set_blocking(fd, False)
    try:
        for _ in range(most):
            data = os.read(fd, READ_CHUNK)
            if not data:
                return
            stream.feed(data)
    except BlockingIOError:
        pass


def decode_status(status: int, *, signal_exit_codes: bool) -> tuple[int | None, int | None]:
    """(exit_code, signal) from a wait status. With `signal_exit_codes`, an exit code of
    129..192 is how the launcher reports that its child died of signal code-128 (bwrap
    does this), so it is decoded as that signal."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    if signal_exit_codes and 128 < code <= 128 + 64:
        return None, code - 128
    return code, None


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, 9)  # SIGKILL
    except ProcessLookupError:
        pass


# ---- a command that could not be started inside the sandbox ----------------------------

#: exit statuses as shells give them: no such command; found, but it cannot be executed
NOT_FOUND, CANNOT_EXECUTE = 127, 126
ENOENT, ENOTDIR = 2, 20
#: how much of a name from the command line or a #! line a message shows
MAX_NAME = 200


class ExecFailed(Exception):
    """The sandboxed command's own exec failed inside the sandbox: nothing of it ran.
    `errno` as execve gave it; `interpreter` is what the file's #! line names, when the
    file exists and that is what is missing (execve says ENOENT for both)."""

    def __init__(self, errno: int, interpreter: str | None = None) -> None:
        super().__init__(errno, interpreter)
        self.errno = errno
        self.interpreter = interpreter


def exec_failure(name: str, errno: int, interpreter: str | None = None) -> tuple[int, str]:
    """(exit status, the one line for stderr) of a command that could not be exec'd inside
    the sandbox: the one place, for every tier, that turns an exec failure into words.

     - ENOENT/ENOTDIR, no interpreter: 127, "command not found inside the sandbox"
     - ENOENT for a file whose #! line names an interpreter the sandbox lacks: 127, as
       bash and dash give for it, naming both
     - anything else (EACCES: not executable, a directory, a noexec mount; ENOEXEC): 126
    `name` (the caller's argv[0]) and `interpreter` (from a file of the sandbox: hostile)
    are shown escaped and cut short."""
    shown = _printable(name)
    if errno in (ENOENT, ENOTDIR):
        if interpreter:
            return NOT_FOUND, (f"corral: {shown}: its interpreter "
                                    f"{_printable(interpreter)} is missing inside the sandbox")
        return NOT_FOUND, f"corral: command not found inside the sandbox: {shown}"
    why = os.strerror(errno) if errno else "exec failed"
    return CANNOT_EXECUTE, f"corral: cannot execute inside the sandbox: {shown}: {why}"


def _printable(text: str) -> str:
    """Printable ASCII as is, anything else as a backslash escape; at most MAX_NAME."""
    out = "".join(c if " " <= c <= "~" and c != "\\" else
                  c.encode("unicode_escape", "backslashreplace").decode("ascii")
                  for c in text[:MAX_NAME])
    return out + ("..." if len(text) > MAX_NAME else "")


def _errno_name(code: int) -> str:
    import errno as _e

    return _e.errorcode.get(code, str(code))


def errno_from_message(message: str) -> int | None:
    """The errno whose strerror text (C locale; any case, as Go prints them) ends
    `message`: how bwrap and runsc report why their exec of the command failed."""
    global _STRERRORS
    if _STRERRORS is None:
        _STRERRORS = {os.strerror(n).lower(): n for n in range(1, 134)}
    text = message.strip().lower()
    for msg, code in _STRERRORS.items():
        if text.endswith(msg):
            return code
    return None


_STRERRORS: dict[str, int] | None = None


class HeldLine:
    """on_stderr for a launcher (bwrap, runsc) that writes its own failure to the stderr
    the command would have used. A first line that may be that message (it starts with
    `prefix`) is held back instead of streamed, until more output shows it was the
    command's (`feed`), or the run is over and the tier knows: `release()` passes it on,
    `replace(line)` says `line` instead. Output that cannot be the message passes at
    once; a command whose only stderr so far is one line starting with the prefix sees it
    streamed late (at its next output or its exit). At most LIMIT bytes are held."""

    __slots__ = ("held", "on_data", "passing", "prefix")
    LIMIT = 4096

    def __init__(self, on_data: Callable[[bytes], None] | None, prefix: bytes) -> None:
        self.on_data = on_data
        self.prefix = prefix
        self.held = b""
        self.passing = False

    def feed(self, data: bytes) -> None:
        if self.passing:
            if self.on_data is not None:
                self.on_data(data)
            return
        held = self.held + data
        n = min(len(held), len(self.prefix))
        newline = held.find(b"\n")
        if (held[:n] == self.prefix[:n] and len(held) <= self.LIMIT
                and newline in (-1, len(held) - 1)):
            self.held = held
            return
        self.held, self.passing = b"", True
        if self.on_data is not None:
            self.on_data(held)

    def line(self) -> bytes | None:
        """The held line, complete (with its newline), or None."""
        return self.held if self.held.endswith(b"\n") else None

    def release(self) -> None:
        held, self.held, self.passing = self.held, b"", True
        if held and self.on_data is not None:
            self.on_data(held)

    def replace_with_nothing(self) -> None:
        self.held, self.passing = b"", True

    def replace(self, line: str) -> None:
        self.held, self.passing = b"", True
        if self.on_data is not None:
            self.on_data((line + "\n").encode())


def shebang_interpreter(head: bytes) -> str | None:
    """The interpreter the #! line at the start of `head` names, as the kernel reads it:
    after #! and any blanks, up to the next blank (space or tab) or the end of the line, so
    a script saved with CRLF names "python3\r" (shown escaped); None when there is none."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].replace(b"\t", b" ").strip(b" ")
    word = line.split(b" ", 1)[0]
    return word.decode(errors="replace") if word else None


# bubblewrap's --json-status-fd, read by the namespace tier (one-shot and live)

def bwrap_child_pid(status_r: int, *, block: bool) -> int | None:
    """The pid of bwrap's init (the sandbox's pid 1, as the host sees it), from the first
    line bwrap writes to --json-status-fd: `{ "child-pid": 123, ... }`. (Parsed by hand:
    json is not imported on the start-up path.)"""
    if block:
        poller = select.poll()   # not select(): a busy supervisor has fds past 1024
        poller.register(status_r, select.POLLIN)
        if not poller.poll(10_000):
            raise SandboxSetupError("bubblewrap did not report its child in 10 s",
                                    step="bwrap-status")
    os.set_blocking(status_r, block)
    try:
        data = os.read(status_r, 65536)
    except BlockingIOError:
        return None
    _, found, rest = data.partition(b'"child-pid":')
    digits = rest.split(b",")[0].split(b"}")[0].strip()
    return int(digits) if found and digits.isdigit() else None


#: how bwrap words a failed exec of the command: "bwrap: execvp NAME: STRERROR\n"
BWRAP_EXEC_FAILED = b"bwrap: execvp "


def bwrap_status_rest(status_r: int, most: int = 16) -> bytes:
    """What bwrap wrote to --json-status-fd after the child's pid: `{ "exit-code": N }`
    once it has exited, if (and only if) bwrap's exec of the command succeeded. bwrap has
    exited by now, so this never waits; bounded all the same."""
    os.set_blocking(status_r, False)
    chunks = []
    try:
        for _ in range(most):
            data = os.read(status_r, 65536)
            if not data:
                break
            chunks.append(data)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def bwrap_exec_failure(line: bytes | None, name: str) -> tuple[str, ExecFailed] | None:
    """(name, ExecFailed) when bwrap exited 1 without reporting an exit code (the structured
    sign that it never exec'd the command: bwrap 0.8+ reports it only after a successful
    exec) and its last word was "execvp NAME: why"; None for any other failure of bwrap's
    (a mount, chdir), which keeps its own message. The reason is bwrap's strerror text
    (C locale: bwrap never calls setlocale)."""
    want = BWRAP_EXEC_FAILED + name.encode(errors="surrogateescape") + b": "
    if line is None or not line.startswith(want):
        return None
    errno = errno_from_message(line[len(want):].decode(errors="replace"))
    return (name, ExecFailed(errno)) if errno else None
