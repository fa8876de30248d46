"""The process tier's fork side: the reaper that becomes the run's subreaper, starts the
command (setsid, its pty, rlimits, Landlock, seccomp, its uid) and kills every process
of the run at the end, and the /proc walkers it uses to find them."""

from __future__ import annotations

import _signal
import os
import time

from ..errors import SandboxSetupError
from ..linux import landlock, limits
from ..linux._sys import _libc, set_pdeathsig

# here, not in the command's child: that runs as the run's uid under Landlock, which
# may not read corral's own source tree (CI's clone is in a 0700 directory)
from ..linux.shellexec import read_head
from ..linux.supervise import (
    ENOENT,
    child_fail_fd,
    report_exec_failure,
    shebang_interpreter,
)

SIGKILL, SIGTERM, SIGXCPU, SIGCHLD = 9, 15, 24, 17


#: how long the reaper keeps killing a run's processes before it gives up
KILL_DEADLINE_S = 5.0


PR_SET_CHILD_SUBREAPER = 36


TIOCSCTTY = 0x540E


PR_SET_DUMPABLE = 4


PR_CAPBSET_DROP = 24


MAX_FD = 0x7FFFFFFF


class _Stop(BaseException):
    pass


class _Child:
    """Everything the two forked processes need, prepared in the parent."""

    def __init__(self, **kw) -> None:
        self.listen_sock = None   # observed: where the seccomp listener goes
        self.__dict__.update(kw)
        self.argvb = [a.encode() for a in self.argv]

    def reaper(self) -> None:
        """spawn()'s child_setup: becomes the run's reaper; never returns. Runs in a fork
        of the supervisor, as the supervisor's user, outside the sandbox."""
        os.setsid()
        stopping = []

        def on_term(signum, frame) -> None:
            if not stopping:
                stopping.append(signum)
                raise _Stop

        _signal.signal(SIGCHLD, _signal.SIG_DFL)
        _signal.signal(SIGTERM, on_term)
        set_pdeathsig(SIGTERM)  # the supervisor died: kill the run
        if os.getppid() != self.parent:
            os._exit(125)
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        cmd = os.fork()
        if cmd == 0:
            self.command()  # raises (spawn reports it) or execs; never returns
            os._exit(127)
        try:
            os.closerange(0, MAX_FD)  # pipes, fail_w, the ruleset: the reaper holds nothing
            _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
            status = _reap(cmd, stopping)
        except BaseException:  # noqa: BLE001 - whatever happened, the run dies with us
            _kill_tree(os.getpid(), None)
            os._exit(125)
        _exit_as(status)

    def command(self) -> None:
        """The sandboxed command's setup, in the reaper's child; ends in execve."""
        os.setsid()  # a session of its own, apart from the reaper's
        if self.tty:  # fd 0 is the run's pty (corral.linux.tty): its controlling terminal
            import fcntl

            fcntl.ioctl(0, TIOCSCTTY, 0)
        for s in _signal.valid_signals():
            if s not in (SIGKILL, 19):
                try:
                    _signal.signal(s, _signal.SIG_DFL)
                except (OSError, ValueError, RuntimeError):
                    pass
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
        if self.attach:
            limits.RunCgroup.attach_self(self.attach)
        if self.bpf_cgroup:
            from ..linux import cgroup_bpf

            if not cgroup_bpf.enforced():  # fail closed: the address rules would not run
                raise SandboxSetupError(
                    "the cgroup socket programs do not apply to this command (cgroup v2 "
                    "socket matching is off on this host, e.g. after a v1 net_cls or "
                    "net_prio controller was used); refusing network allow on the process "
                    "tier: use isolation = \"namespace\"", step="egress-cgroup",
                    field="network.mode")
        limits.apply_rlimits(nofile=self.nofile, fsize=self.fsize,
                             cpu_seconds=self.cpu_seconds, nproc=self.nproc)
        if self.root:
            cap = 0
            while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
                cap += 1
            os.setgroups([])
            os.setresgid(self.gid, self.gid, self.gid)
            os.setresuid(self.uid, self.uid, self.uid)
        reaper = os.getppid()
        set_pdeathsig(SIGKILL)
        if os.getppid() != reaper:
            os._exit(125)
        if self.cwd_fd is not None:
            os.fchdir(self.cwd_fd)   # the workspace as opened, not its name again
        else:
            os.chdir(self.cwd)
        self.seccomp.no_new_privs()
        landlock.restrict_self(self.ruleset_fd)
        if self.listen_sock is not None:   # observed: the listener to the supervisor's
            lfd = self.seccomp.load_listening()   # observer, and never kept here (a
            _send_fd(self.listen_sock, lfd)     # holder could answer its own calls)
            os.close(lfd)
            self.listen_sock.close()
        else:
            self.seccomp.load()
        fail = child_fail_fd()  # close-on-exec: spawn learns the exec worked when it closes
        os.closerange(3, fail)
        os.closerange(fail + 1, MAX_FD)
        try:
            os.execvpe(self.argv[0], self.argv, self.env)
        except OSError as e:
            # nothing of the sandbox's has run in this process: its report is ours
            code = e.errno or 0
            interp = _missing_interpreter(self.argv[0], self.env) if code == ENOENT else None
            try:
                os.write(fail, report_exec_failure(code, interp))
            finally:
                os._exit(127)


def _send_fd(sock, fd: int) -> None:
    """Hand the listener over; if nobody takes it (the observer is gone), the command
    runs on with the filter and no listener: the kernel answers its refusals ENOSYS."""
    import socket

    try:
        socket.send_fds(sock, [b"l"], [fd], socket.MSG_NOSIGNAL)
    except OSError:
        pass


def _missing_interpreter(name: str, env: dict[str, str]) -> str | None:
    """The interpreter a file's #! line names, when execvpe(name) said ENOENT although the
    file is there (what is missing is its interpreter). Looked up as execvpe does (PATH for
    a bare name), in the command's own process: Landlock, seccomp and its uid already
    apply, so this reads only what the command could. At most 256 bytes are read."""
    if "/" in name:
        paths = [name]
    else:
        paths = [os.path.join(d or ".", name) for d in env.get("PATH", "").split(":")]
    for p in paths:
        head = read_head(p, 256)
        if head is not None:      # else not there (or not readable): the next one
            return shebang_interpreter(head)
    return None


def _reap(cmd: int, stopping: list) -> int | None:
    """Wait for the command (reaping orphans meanwhile), then kill what is left. Returns the
    command's wait status (None if a stop request got in the way of reading it)."""
    status = None
    try:
        while True:
            pid, st = os.waitpid(-1, 0)
            if pid == cmd:
                status = st
                break
    except _Stop:
        pass
    except ChildProcessError:
        pass
    if not stopping:
        stopping.append(0)  # a late SIGTERM no longer interrupts
    got = _kill_tree(os.getpid(), cmd)
    return status if status is not None else got


def _kill_tree(root: int, cmd: int | None) -> int | None:
    """SIGKILL every descendant of `root` (this process, a child subreaper: orphans come
    to it) until it has no children left. Returns the wait status of `cmd` if it was
    reaped here."""
    status = None
    deadline = time.monotonic() + KILL_DEADLINE_S
    delay = 0.0005
    while True:
        try:
            while True:
                pid, st = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid == cmd:
                    status = st
        except ChildProcessError:
            return status  # no children: no descendants at all
        if time.monotonic() > deadline:
            return status
        found = _descendants(root)
        for pid in found:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                # the pidfd pins the process; if the pid was reused it is not ours
                if _ppid(pid) in found or _ppid(pid) == root:
                    _signal.pidfd_send_signal(fd, SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _read_small(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _ppid(pid: int) -> int:
    try:
        data = _read_small(f"/proc/{pid}/stat")
    except OSError:
        return -1
    return int(data.rsplit(b")", 1)[1].split()[1])


def _descendants(root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = _ppid(int(name))
            if ppid > 0:
                kids.setdefault(ppid, []).append(int(name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _exit_as(status: int | None) -> None:
    """End the reaper the way the command ended: same exit code, or the same signal."""
    if status is not None and os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else SIGKILL
    try:
        if sig != SIGKILL:
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    finally:
        os._exit(128 + sig)


def _wait_quietly(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _uid_of(pid: str) -> tuple[int, int] | None:
    """(real uid, threads) of a process, from /proc/PID/status."""
    try:
        text = _read_small(f"/proc/{pid}/status")
    except OSError:
        return None
    uid = threads = None
    for line in text.split(b"\n"):
        if line.startswith(b"Uid:"):
            uid = int(line.split()[1])
        elif line.startswith(b"Threads:"):
            threads = int(line.split()[1])
    return (uid, threads or 1) if uid is not None else None


def _tasks_of_uid(uid: int) -> int:
    """Threads the user has now: RLIMIT_NPROC counts these."""
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = _uid_of(name)
            if got and got[0] == uid:
                n += got[1]
    return n


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is `uid` (a sandbox's dedicated uid)."""
    for _ in range(10):
        left = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            got = _uid_of(name)
            if not got or got[0] != uid:
                continue
            try:
                fd = os.pidfd_open(int(name))
            except OSError:
                continue
            try:
                got = _uid_of(name)
                if got and got[0] == uid:
                    _signal.pidfd_send_signal(fd, SIGKILL)
                    left += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        if not left:
            return
        time.sleep(0.01)
