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
    """One captured output stream with a byte cap: what is past the cap is read and dropped."""

    __slots__ = ("cap", "chunks", "kept", "truncated", "on_data")

    def __init__(self, cap: int, on_data: Callable[[bytes], None] | None) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False
        self.on_data = on_data

    def feed(self, data: bytes) -> None:
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
          uid: int | None = None, gid: int | None = None) -> tuple[int, int, int]:
    """fork + exec. Returns (pid, stdout read fd, stderr read fd).

    With `uid`/`gid` the child drops every group and takes uid:gid before exec. Without a
    `child_setup`, the fork and exec are CPython's own C code (subprocess's), which costs
    about half of a fork from Python: no Python runs in the child, no at-fork hooks, no
    copy-on-write faults from reference counts. With uid/gid too, and this process plain
    root, this thread takes uid:gid for the moment of a vfork (_sys.child_ids), which
    saves copying the page tables as well (about 0.7 ms for a 12 MB supervisor; a fork
    costs more the bigger the host program); the child then needs no setuid of its own.
    The caller then does in the parent whatever must happen before the command runs
    (bwrap waits for it: see namespace.py)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fail_r, fail_w = os.pipe()  # CLOEXEC: closes on a successful exec
    try:
        if child_setup is None and _fork_exec is not None:
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
                                child_setup, uid, gid)
    except BaseException:
        for fd in (out_r, out_w, err_r, err_w, fail_r, fail_w):
            os.close(fd)
        raise
    for fd in (out_w, err_w, fail_w):
        os.close(fd)
    report = os.read(fail_r, 1000)
    os.close(fail_r)
    if report:
        os.waitpid(pid, 0)
        os.close(out_r)
        os.close(err_r)
        message, code = _fail_report(report)
        raise SandboxSetupError(f"starting {path} failed: {message}", step="exec",
                                errno=code)
    return pid, out_r, err_r


def _py_fork_exec(path, argv, env, stdin_fd, out_w, err_w, fail_w, pass_fds, child_setup,
                  uid, gid) -> int:
    envb = {k.encode(): v.encode() for k, v in env.items()}
    argvb = [a.encode() for a in argv]
    pid = os.fork()
    if pid == 0:  # child: no Python-level cleanup may run here, only exec or _exit
        try:
            # Python ignores SIGPIPE and SIGXFSZ; the sandboxed command gets the defaults
            # (so `yes | head -1` ends quietly and RLIMIT_FSIZE raises SIGXFSZ), and no
            # blocked signals
            _signal.signal(13, 0)   # SIGPIPE, SIG_DFL
            _signal.signal(25, 0)   # SIGXFSZ, SIG_DFL
            _signal.pthread_sigmask(2, [])  # SIG_SETMASK, nothing blocked
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
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
    envl = [f"{k}={v}".encode() for k, v in env.items()]
    groups = [] if gid is not None else None
    return _posixsubprocess.fork_exec(
        [a.encode() for a in argv], [path.encode()], True, pass_fds, None, envl,
        stdin_fd, -1, -1, out_w, -1, err_w, fail_r, fail_w, True, False, -1,
        gid, groups, uid, -1, None, True)


def _fail_report(report: bytes) -> tuple[str, int | None]:
    """(message, errno) from what a child wrote on the fail pipe before it died:
    `py:errno:Type: message` (_py_fork_exec) or `Type:hex errno:noexec|message` (C)."""
    text = report.decode(errors="replace")
    if text.startswith("py:"):
        code, _, msg = text[3:].partition(":")
        return msg, int(code) if code.isdigit() and int(code) else None
    name, _, rest = text.partition(":")
    hexcode, _, msg = rest.partition(":")
    try:
        code = int(hexcode, 16) if hexcode else 0
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
              cpu_seconds: Callable[[], float] | None, output_cap: int,
              on_stdout: Callable[[bytes], None] | None = None,
              on_stderr: Callable[[bytes], None] | None = None,
              kill: Callable[[], None], started: float,
              extra: dict[int, Callable[[bytes], None]] | None = None) -> Outcome:
    """Watch the process until it and its output are done, enforcing the limits.
    `extra` fds (e.g. the egress proxy's events) are read along the way; they do not keep
    the watch going, and stay open for the caller."""
    out = Outcome()
    extra = dict(extra or {})
    out.stdout = Stream(output_cap, on_stdout)
    out.stderr = Stream(output_cap, on_stderr)
    streams = {out_r: out.stdout, err_r: out.stderr}
    sel = select.epoll()
    pidfd = os.pidfd_open(pid)
    try:
        for fd in streams:
            sel.register(fd, select.EPOLLIN)
        sel.register(pidfd, select.EPOLLIN)
        for fd in extra:
            sel.register(fd, select.EPOLLIN)
        deadline = started + timeout
        poll_every = 0.05 if cpu_seconds is not None else None
        next_poll = time.monotonic() + (poll_every or 0)
        drain_until: float | None = None
        while streams or out.status is None:
            now = time.monotonic()
            if drain_until is not None:       # exited: only the pipes are left to drain
                wait = drain_until - now
            else:                             # running, or killed and about to exit
                wait = deadline - now
                if poll_every is not None and out.timed_out is None:
                    wait = min(wait, next_poll - now)
            for fd, _ in sel.poll(max(wait, 0)):
                if fd == pidfd:
                    _, status = os.waitpid(pid, 0)
                    out.status = status
                    sel.unregister(pidfd)
                    drain_until = time.monotonic() + DRAIN_GRACE_S
                    continue
                if fd in extra:
                    data = os.read(fd, READ_CHUNK)
                    if data:
                        extra[fd](data)
                    else:
                        sel.unregister(fd)
                        del extra[fd]
                    continue
                data = os.read(fd, READ_CHUNK)
                if data:
                    streams[fd].feed(data)
                else:
                    sel.unregister(fd)
                    os.close(fd)
                    del streams[fd]
            now = time.monotonic()
            if out.status is None and out.timed_out is None:
                if now >= deadline:
                    out.timed_out = "timeout"
                    kill()
                elif poll_every is not None and now >= next_poll:
                    next_poll = now + poll_every
                    if cpu_seconds() >= cpu_time:  # type: ignore[misc]
                        out.timed_out = "cpu_time"
                        kill()
                if out.timed_out:
                    deadline = now + 3600  # the kill is done; wait for the exit
            if drain_until is not None and now >= drain_until and streams:
                kill()  # something still holds the pipes: the run is over, end it
                for fd in list(streams):
                    _read_what_is_there(fd, streams[fd])
                    sel.unregister(fd)
                    os.close(fd)
                    del streams[fd]
    finally:
        sel.close()
        os.close(pidfd)
        for fd in streams:
            os.close(fd)
    out.wall_s = time.monotonic() - started
    return out


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


def finish(outcome: Outcome, *, exit_code: int | None, sig: int | None, events: list[dict],
           usage, oom_kills: int, wall: float, cpu: float, memory: int, cap: int,
           isolation: str):
    """The Result of one command: limit events from what was observed, then the verdict.
    Shared by every tier (each decodes exit_code and sig its own way)."""
    from ..result import Result, decide_verdict

    timed_out = outcome.timed_out
    if sig == 24 and not timed_out:  # SIGXCPU: RLIMIT_CPU, the second layer of cpu_time
        timed_out = "cpu_time"
    if timed_out == "timeout":
        events.append({"kind": "limit", "limit": "timeout",
                       "message": f"wall clock limit of {wall:g}s reached; every process "
                                  f"of the run was killed"})
    elif timed_out == "cpu_time":
        events.append({"kind": "limit", "limit": "cpu_time",
                       "message": f"CPU time limit of {cpu:g}s reached; every process of "
                                  f"the run was killed"})
    if oom_kills:
        events.append({"kind": "limit", "limit": "memory",
                       "message": f"the memory cgroup killed {oom_kills} process(es) at "
                                  f"the {memory} byte limit"})
    for name, stream in (("stdout", outcome.stdout), ("stderr", outcome.stderr)):
        if stream.truncated:
            events.append({"kind": "limit", "limit": "output", "stream": name,
                           "message": f"{name} past {cap} bytes was dropped"})
    verdict = decide_verdict(exit_code=exit_code, signal=sig, oom_kills=oom_kills,
                             timed_out=timed_out)
    return Result(verdict=verdict, exit_code=exit_code, signal=sig,
                  stdout=outcome.stdout.text(), stderr=outcome.stderr.text(),
                  stdout_truncated=outcome.stdout.truncated,
                  stderr_truncated=outcome.stderr.truncated, usage=usage, events=events,
                  isolation=isolation)
