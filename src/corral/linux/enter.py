"""Starting a command inside a running sandbox from the host side, as `runc exec` and
nsenter do: nothing inside the sandbox is asked to start it.

    target = Target(init_pid)                 # pidfd + root dirfd of the sandbox's pid 1
    pid, out_r, err_r = spawn_in(target, argv, env, cwd="/scratch", stdin_fd=0,
                                 attach=cg.attach_fds(), rlimits=(256, 1 << 27, 31),
                                 bpf=seccomp_program)
    ...                                       # supervise(pid, out_r, err_r, ...)
    target.close()

The "double fork": this process (the supervisor, maybe multithreaded) forks a child A.
A is single-threaded, which setns(CLONE_NEWUSER) requires. A drops its supplementary
groups (as host root; inside, setgroups is denied), joins the command's cgroup, takes
the rlimits, then joins every namespace of the target with ONE setns(pidfd, flags) (Linux
5.8+: the kernel joins the user namespace first and the rest atomically, so no half-entered
state exists). setns(CLONE_NEWPID) moves only A's future children, so A clones B with
CLONE_PARENT: B is in the sandbox's pid namespace and is a child of the supervisor itself,
which waits for it like any child (and gets its exit status and signal directly). A
reports B's pid on a pipe and exits.

B, in order: the sandbox's root (fchdir to /proc/INIT/root, opened by the supervisor
while the pidfd showed init alive, then chroot "."), uid and gid 0 of the sandbox's user
namespace (the sandbox's host uid; every other id is unmapped), no capabilities (the
bounding set emptied, then capset of zeros: an exec as uid 0 gains nothing from an empty
bounding set), the working directory (as that uid, without capabilities: the command's
own permissions), a session of its own, stdio, every other fd closed, signals at their
defaults, a parent-death SIGKILL, no_new_privs, the seccomp program, exec. Every call
between fork and exec is a plain syscall through objects built before the fork (no import,
no allocation that could wait on a lock another thread of the supervisor held).

A failure anywhere before exec is written to a close-on-exec pipe (`py:ERRNO:message` or
`exec:ERRNO:`, supervise's formats); an empty read means the command is running.
"""

from __future__ import annotations

import _signal
import ctypes
import os
import resource
import select

from ..errors import SandboxSetupError
from . import _sys
from .supervise import _exec_report, _fail_report, inherited_signals, report_exec_failure

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_PARENT = 0x00008000
SIGCHLD = 17
#: every namespace bwrap makes for a sandbox
ALL_NAMESPACES = (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS
                  | CLONE_NEWIPC | CLONE_NEWCGROUP)
_CLONE_NR = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine)
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

_libc = _sys._libc
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
_libc.syscall.restype = ctypes.c_long


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


class Target:
    """A running sandbox to enter: a pidfd of its pid 1 (as the host sees it) and an
    O_PATH fd of that process's root directory, both opened once and checked against
    each other (the pidfd still live after the root was opened, so a recycled pid is
    never entered). Raises ProcessLookupError if it is gone."""

    def __init__(self, init_pid: int, flags: int = ALL_NAMESPACES, *,
                 pidfd: int | None = None) -> None:
        """`pidfd`: one opened earlier (taken over); open the Target only once the
        sandbox's root is finished (bwrap's init has forked the command): the root fd
        is the root init has at that moment."""
        self.pid = init_pid
        self.flags = flags
        self.pidfd = os.pidfd_open(init_pid) if pidfd is None else pidfd
        try:
            self.root_fd = os.open(f"/proc/{init_pid}/root",
                                   os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            _signal.pidfd_send_signal(self.pidfd, 0)   # still the same process
        except BaseException:
            os.close(self.pidfd)
            raise
        self.last_cap = _last_cap()

    def alive(self) -> bool:
        """Whether init has not exited (a pidfd is readable once it has, zombie or not:
        a signal to a zombie would still succeed)."""
        if self.pidfd < 0:
            return False
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        for fd in (self.pidfd, self.root_fd):
            if fd >= 0:
                os.close(fd)
        self.pidfd = self.root_fd = -1


class Program:
    """A seccomp program held in memory for a child to load (one prctl)."""

    def __init__(self, bpf: bytes) -> None:
        if not bpf or len(bpf) % 8:
            raise ValueError("not a classic BPF program")
        self.buf = ctypes.create_string_buffer(bpf, len(bpf))
        self.prog = _SockFprog(len(bpf) // 8, ctypes.addressof(self.buf))
        self.addr = ctypes.addressof(self.prog)


def spawn_in(target: Target, argv: list[str], env: dict[str, str], *, cwd: str,
             stdin_fd: int, attach: list[int], rlimits: tuple[int, int, int | None],
             program: Program, pipes: bool = True) -> tuple[int, int, int]:
    """Start argv inside `target` (see the module's docstring). Returns (pid as the host
    sees it, stdout read fd, stderr read fd); the pid is this process's child.
    `rlimits`: (RLIMIT_NOFILE, RLIMIT_FSIZE, RLIMIT_CPU seconds or None). Raises
    ExecFailed when the command's own exec failed (nothing of it ran; the child is
    reaped), SandboxSetupError for any other failure."""
    if _CLONE_NR is None:
        raise SandboxSetupError(f"entering a sandbox is not implemented on "
                                f"{os.uname().machine}", step="enter")
    ignored, _ = inherited_signals()
    argvb = [a.encode() for a in argv]
    envb = {k.encode(): v.encode() for k, v in env.items()}
    path = env.get("PATH", "/usr/bin:/bin")
    names = ([argvb[0]] if b"/" in argvb[0] else
             [os.path.join(d.encode(), argvb[0]) for d in path.split(":") if d])
    cwdb = cwd.encode()
    caps = list(range(target.last_cap + 1))
    zero_caps = (ctypes.c_uint32 * 6)()
    header = (ctypes.c_uint32 * 2)(_sys._CAP_V3, 0)
    libc, clone_nr, flags = _libc, _CLONE_NR, target.flags
    nofile, fsize, cpu = rlimits
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fail_r, fail_w = os.pipe()       # close-on-exec: EOF once B exec'd the command
    pid_r, pid_w = os.pipe()
    keep_in_b = (0, 1, 2, fail_w)
    a = os.fork()
    if a == 0:  # A: only syscalls from here on; _exit on any failure
        try:
            os.close(pid_r)
            os.setgroups([])
            for fd in attach:
                os.write(fd, b"0")
            _rlimits(nofile, fsize, cpu)
            if libc.setns(target.pidfd, flags) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns: {os.strerror(e)}")
            b = libc.syscall(clone_nr, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
            if b < 0:
                e = ctypes.get_errno()
                raise OSError(e, f"clone: {os.strerror(e)}")
            if b > 0:
                os.write(pid_w, str(b).encode())
                os._exit(0)
            # B: inside the sandbox's pid namespace
            os.close(pid_w)
            os.fchdir(target.root_fd)
            os.chroot(".")
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
            for cap in caps:
                libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
            libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
            if libc.syscall(_sys._CAPS[1], header, zero_caps) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"capset: {os.strerror(e)}")
            os.chdir(cwdb)
            os.setsid()
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            lo = 3
            for fd in keep_in_b[3:]:
                if fd > lo:
                    os.closerange(lo, fd)
                lo = fd + 1
            os.closerange(lo, 1 << 16)
            _signal.signal(13, 0)   # SIGPIPE, SIG_DFL (Python ignores it)
            _signal.signal(25, 0)   # SIGXFSZ
            for sig in ignored:
                if sig not in (9, 19):
                    try:
                        _signal.signal(sig, 0)
                    except (OSError, ValueError):
                        pass
            _signal.pthread_sigmask(2, [])
            libc.prctl(_sys.PR_SET_PDEATHSIG, 9, 0, 0, 0)
            if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"no_new_privs: {os.strerror(e)}")
            if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, program.addr, 0, 0) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"seccomp: {os.strerror(e)}")
            err = 0
            denied = False
            for name in names:   # execvp's search, on the sandbox's PATH
                try:
                    os.execve(name, argvb, envb)
                except OSError as e:   # as execvp: EACCES is kept, the search goes on
                    if e.errno == 13:
                        denied = True
                    elif e.errno not in (2, 20):
                        err = e.errno
                        break
            os.write(fail_w, report_exec_failure(err or (13 if denied else 2)))
            os._exit(127)
        except BaseException as e:  # noqa: BLE001 - reported to the supervisor, then die
            try:
                code = getattr(e, "errno", 0) or 0
                os.write(fail_w, f"py:{code}:{e}".encode()[:1000])
            finally:
                os._exit(127)
    for fd in (out_w, err_w, fail_w, pid_w):
        os.close(fd)
    try:
        _, status = os.waitpid(a, 0)
        got = _read_small(pid_r)
        report = _read_small(fail_r)
    finally:
        os.close(pid_r)
        os.close(fail_r)
    b = int(got) if got.isdigit() else 0
    if report:
        if b:
            os.waitpid(b, 0)
        os.close(out_r)
        os.close(err_r)
        if report.startswith(b"exec:"):
            raise _exec_report(report)
        message, code = _fail_report(report)
        raise SandboxSetupError(f"entering the sandbox failed: {message}", step="enter",
                                errno=code)
    if not b:
        os.close(out_r)
        os.close(err_r)
        raise SandboxSetupError(f"entering the sandbox failed (status {status})",
                                step="enter")
    return b, out_r, err_r


def _rlimits(nofile: int, fsize: int, cpu: int | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    if cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _read_small(fd: int, most: int = 1000) -> bytes:
    chunks = []
    n = 0
    while n < most:
        data = os.read(fd, most - n)
        if not data:
            break
        chunks.append(data)
        n += len(data)
    return b"".join(chunks)
