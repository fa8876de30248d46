"""Starting a command inside a running sandbox from the host side, as `runc exec` and
nsenter do: nothing inside the sandbox is asked to start it.

    target = Target(init_pid)                 # pidfd + root dirfd of the sandbox's pid 1
    entrant = Entrant(target, cg.attach_fds(), Program(bpf))   # forked ahead, waiting
    pid, out_r, err_r = entrant.start(argv, env, cwd="/scratch", stdin_fd=0,
                                      rlimits=(256, 1 << 27, 31))
    ...                                       # supervise(pid, ..., before_wait=entrant.reap)
    target.close()

The supervisor (maybe multithreaded, and a child subreaper for as long as a live sandbox
runs) has a child A forked ahead of the command, by its zygote (`_Zygote`: a fork of the
supervisor made once, which forks the entrants on request, so that the supervisor itself
never forks per command and never pays the copy-on-write faults that follow a fork; A's
pidfd comes back to the supervisor, which waits on it to know A has exited). A is
single-threaded, which setns(CLONE_NEWUSER)
requires. A closes every fd it inherited (it may wait long: a copy of a pipe's write end
would keep a reader from seeing EOF), drops its supplementary groups (as host root; inside,
setgroups is denied), joins the command's cgroup, then joins every namespace of the target
with ONE setns(pidfd, flags) (Linux 5.8+: the user namespace first and the rest atomically,
so no half-entered state exists). It then confines itself exactly as the command will be:
the sandbox's root (fchdir to /proc/INIT/root, opened while the pidfd showed init alive,
then chroot "."), uid and gid 0 of the sandbox's user namespace (the sandbox's host uid;
or another id the namespace maps, an unprivileged account: Entrant(uid=)),
no capabilities (the bounding set emptied, then capset of zeros: an exec as uid 0 gains
nothing from an empty bounding set), signals at their defaults, no_new_privs, the seccomp
program. All of this happens before the command is asked for, so none of it (nor the fork,
nor the cgroup move, which on cgroup v1 waits for an RCU grace period) is on the command's
own path.

For the command, A receives argv, env, cwd and rlimits (in the message, or a memfd when
over INLINE_MAX) and its stdio (SCM_RIGHTS),
sets the rlimits and starts it with CPython's vfork + exec (_posixsubprocess, as subprocess
does: no page tables copied; a session of its own, the working directory as the command's
own uid without capabilities, every other fd closed). setns(CLONE_NEWPID) moved only A's
children, so the command (B) is in the sandbox's pid namespace. A sends B's pid and a
pidfd of B (opened while B could not have been reaped: A, its parent, lives and does not
wait) and exits; its exit hands B to the nearest child subreaper, the
zygote, which reaps A and B and sends B's wait status to the supervisor, under the
request's sequence number (A told the zygote B's pid for it before exiting: a pid can be
used again once reaped, so a status nobody read, keyed by pid, could be taken for a later
command's). The supervisor
watches B through its pidfd and takes the status from the zygote (Entrant.exit_status):
B is never the supervisor's child, so whatever is above the supervisor (a subreaper or a
PID 1 that never reaps) never holds B's zombie, on which the sandbox's dying init would
wait forever. Statuses nobody asks for (a command whose supervision ended early) wait in
the zygote once its status socket is full; past UNSENT_MAX of them the zygote retires
(forks no more; exits once its commands are reaped and their statuses sent) and the next
command gets a new zygote.

A failure before exec is written to a close-on-exec pipe (`py:ERRNO:message`,
`exec:ERRNO:` when the command's own exec failed, `cwd:ERRNO:` for its working directory);
a failure before A was ready comes on its socket. A failure after the command started
(B's pidfd cannot be opened or sent: the handover) must not leave it running with
nobody to supervise it: A kills B, says so (`run:ERRNO:PID:...`), and the supervisor
waits until the zygote has reaped B before it raises SandboxSetupError(step="handover")
(an A that dies silently after its ready is the same step: the caller kills the
command's cgroup). Step "enter" means nothing ran; "handover" that the command started
and was killed before anyone watched it.
"""

from __future__ import annotations

import _signal
import collections
import ctypes
import marshal
import os
import resource
import select
import socket
import threading
import time

try:
    import _posixsubprocess
except ImportError:  # pragma: no cover - not CPython
    _posixsubprocess = None

from ..errors import SandboxSetupError, UsageError
from . import _sys
from .shellexec import resolve, shell_env, shell_is_dash
from .supervise import _exec_report, _fail_report, inherited_signals, report_exec_failure

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
#: every namespace bwrap makes for a sandbox
ALL_NAMESPACES = (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS
                  | CLONE_NEWIPC | CLONE_NEWCGROUP)
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

#: a command's request (argv, env, cwd, rlimits) up to this size travels in the message
#: that hands the entrant its fds; a bigger one in a memfd
INLINE_MAX = 32 << 10
#: statuses the zygote keeps for its supervisor once the status socket is full (nobody has
#: read them: commands whose supervision ended early, never asked for): past this many it
#: retires (_zygote_main) instead of keeping more, and the next command gets a new zygote
UNSENT_MAX = 4096
#: a retired zygote whose commands have all been reaped waits at most this long for its
#: supervisor to read the statuses it still holds, then exits
RETIRED_FLUSH_S = 5.0

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
    """A seccomp program held in memory for a child to load (one prctl). `listen`: load
    it with a listener instead (seccomp_notify.install_listening; the program is then a
    seccomp_notify.notifying() one), whose fd the entrant hands back with its "ready"
    (Entrant.listener) and closes before it starts the command."""

    def __init__(self, bpf: bytes, listen: bool = False) -> None:
        if not bpf or len(bpf) % 8:
            raise ValueError("not a classic BPF program")
        self.bpf = bytes(bpf)
        self.listen = bool(listen)
        self.buf = ctypes.create_string_buffer(bpf, len(bpf))
        self.prog = _SockFprog(len(bpf) // 8, ctypes.addressof(self.buf))
        self.addr = ctypes.addressof(self.prog)


class Entrant:
    """A child forked ahead of a command (A of the module's docstring): it has dropped its
    groups, joined the command's cgroup and every namespace of the target, and waits on a
    socket for one command, which it then clones (B) and leaves. Preparing one takes the
    fork, the cgroup move (a cgroup v1 write waits for an RCU grace period) and the setns
    off the command's own start. `start()` once; `close()` if it is never used.

    If this process dies, A's end of the socket reads EOF and A exits."""

    def __init__(self, target: Target, attach: list[int], program: Program, *,
                 uid: int = 0) -> None:
        """`uid`: the id (uid and gid) inside the command takes: 0, the sandbox's root,
        or another id its user namespace maps (an unprivileged account)."""
        if _posixsubprocess is None or _sys._CAPS is None:
            raise SandboxSetupError(f"entering a sandbox needs CPython on x86_64 or "
                                    f"aarch64, not {os.uname().machine}", step="enter")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.pid = 0
        self.pidfd = -1
        #: the command's pidfd (B's), opened while A, its parent, still lived and had not
        #: waited: B could not have been reaped, so it is B's and no recycled pid's
        self.b_pidfd = -1
        self.direct = False
        self._ready = False
        self._listen = program.listen
        #: the seccomp listener of the command's filter (Program.listen), once ready: the
        #: caller takes it (an Observer watches it) and sets this to -1, or close() does
        self.listener = -1
        #: the zygote's number for this entrant's request: its command's status comes
        #: back under it (never under the pid, which is used again once reaped)
        self.seq = 0
        try:
            self.pid, self.pidfd, self.zygote, self.seq = _zygote().fork_entrant(
                theirs, target, attach, program, uid)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()

    def wait_ready(self) -> None:
        """Wait for A's "ready" (entered and confined; with Program.listen, `listener`
        is then set). start() does it first anyway. Raises SandboxSetupError."""
        self._wait_ready()

    def _wait_ready(self) -> None:
        if self._ready:
            return
        if self._listen:
            msg, fds, _, _ = socket.recv_fds(self.sock, 1100, 1, socket.MSG_CMSG_CLOEXEC)
            if msg == b"r" and len(fds) != 1:
                msg = b"epy:0:no seccomp listener came with the entrant's ready"
            for fd in fds[1:] if msg == b"r" else fds:
                os.close(fd)
            if msg == b"r":
                self.listener = fds[0]
        else:
            msg = self.sock.recv(1100)
        if msg != b"r":
            self._reap()
            if msg.startswith(b"e"):
                message, code = _fail_report(msg[1:])
                raise SandboxSetupError(f"entering the sandbox failed: {message}",
                                        step="enter", errno=code)
            raise SandboxSetupError("entering the sandbox failed", step="enter")
        self._ready = True

    def _reap(self) -> None:
        self.reap()
        self.sock.close()

    def reap(self) -> None:
        """Wait for A's exit, after start(). A is the zygote's child (it reaps it): its
        pidfd says when it has exited, and the kernel reparents A's children (the
        command, to the zygote) before it says so."""
        if self.pid:
            if self.pidfd >= 0:
                poller = select.poll()
                poller.register(self.pidfd, select.POLLIN)
                poller.poll()
                os.close(self.pidfd)
                self.pidfd = -1
            self.pid = 0

    def exit_status(self, b: int) -> int:
        """The wait status of the command `b` started, once its pidfd (b_pidfd) has
        said it exited: the zygote, its parent, reaps it and sends the status."""
        status = self.zygote.status_of(self.seq, b)
        unclaimed = getattr(self, "_unclaimed", None)
        if unclaimed is not None:
            unclaimed.detach()
        return status

    def close(self) -> None:
        """Let an unused one go (it exits at EOF), and reap it."""
        if self.listener >= 0:
            os.close(self.listener)
            self.listener = -1
        if self.pid:
            self.sock.shutdown(socket.SHUT_RDWR)
            self._reap()

    def start(self, argv: list[str], env: dict[str, str], *, cwd: str, stdin_fd: int,
              rlimits: tuple[int, int, int | None], stdout_fd: int | None = None,
              words: list[str] | None = None) -> tuple[int, int, int]:
        """Start argv (see spawn_in). `stdout_fd` (a terminal's slave): the command's
        stdout and stderr, no pipes made (both read fds returned are -1), and no session
        of its own (its first program makes one and takes the terminal: setsid --ctty).
        `words`: argv is /bin/sh -c of a line that is these plain words
        (shellexec.simple_words): exec'd without the shell when that gives what the shell
        would (shellexec.resolve, decided inside); `direct` then says it was."""
        self._wait_ready()
        # os.fsencode: bytes that are not UTF-8 (surrogate-escaped) are themselves again
        argvb = [os.fsencode(a) for a in argv]
        envb = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
        path = env.get("PATH", "/usr/bin:/bin")
        names = ([argvb[0]] if b"/" in argvb[0] else
                 [os.path.join(os.fsencode(d), argvb[0]) for d in path.split(":") if d])
        req = -1
        if stdout_fd is None:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            ours = [out_w, err_w]
        else:
            out_r = err_r = -1
            out_w = err_w = stdout_fd
            ours = []
        fail_r, fail_w = os.pipe()
        try:
            data = marshal.dumps((argvb, envb, names, os.fsencode(cwd), *rlimits,
                                  stdout_fd is None,
                                  None if words is None else [os.fsencode(w) for w in words]))
            if len(data) < INLINE_MAX:    # in the message: no memfd to make, write, read
                socket.send_fds(self.sock, [b"i" + data], [stdin_fd, out_w, err_w, fail_w])
            else:
                req = os.memfd_create("corral-request", os.MFD_CLOEXEC)
                _write_all(req, data)
                os.lseek(req, 0, os.SEEK_SET)
                socket.send_fds(self.sock, [b"x"], [stdin_fd, out_w, err_w, fail_w, req])
        except BaseException:
            for fd in (out_r, err_r, fail_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (req, *ours, fail_w):
                if fd >= 0:
                    os.close(fd)
        try:
            got, fds, _, _ = socket.recv_fds(self.sock, 1100, 1)
            #: exec'd without the shell (`words`): its signal deaths are reported as sh does
            self.direct = got.endswith(b"d") and len(got) > 1
            num = got[:-1] if self.direct else got
            b = int(num) if num.isdigit() and len(num) < 12 and len(fds) == 1 else 0
            if b:   # A is on its way out; reap() waits for it once the command exits
                self.b_pidfd = fds[0]
                self.sock.close()
                report = b""
                import weakref

                # a status nobody takes (the command's supervision ended early) is let go
                # of when this entrant is: kept by request number, it would stay for good
                self._unclaimed = weakref.finalize(self, self.zygote.forget, self.seq)
                self._unclaimed.atexit = False
            else:
                self._reap()
                report = _read_small(fail_r)
        finally:
            os.close(fail_r)
        if not b:
            for fd in fds:
                os.close(fd)
        if report or not b:
            for fd in (out_r, err_r):
                if fd >= 0:
                    os.close(fd)
            if report.startswith(b"exec:"):
                raise _exec_report(report)
            if report.startswith(b"cwd:"):
                code = report[4:].rstrip(b":")
                why = os.strerror(int(code)) if code.isdigit() and len(code) < 5 else "?"
                raise UsageError(f"cannot use {cwd!r} as the working directory inside the "
                                 f"sandbox: {why}", field="cwd")
            if report.startswith(b"run:"):
                raise self._not_handed_over(report)
            if not report and not got:
                # A died after its ready without a word (a signal): whether it had
                # started the command is unknown; a status the zygote may send for it is
                # nobody's, and the caller kills what is in the command's cgroup
                self.zygote.forget(self.seq)
                raise SandboxSetupError(
                    "the entrant ended before it handed the command over (killed by a "
                    "signal?); whatever it had started is killed with the command's "
                    "cgroup", step="handover")
            if not report and got.startswith(b"e"):
                report = got[1:]
            message, code = _fail_report(report) if report else ("no report", None)
            raise SandboxSetupError(f"entering the sandbox failed: {message}", step="enter",
                                    errno=code)
        return b, out_r, err_r

    def _not_handed_over(self, report: bytes) -> SandboxSetupError:
        """A's report that the command (B) had started when a later step failed
        (`run:ERRNO:PID:TK:message`: T, the zygote was told B's pid; K, A killed B):
        waits until the zygote has reaped B (its status comes under this request's
        number), so that nothing of the command is left, then the error to raise. When A
        could not kill it, the caller's kill of the command's cgroup does (and the
        zygote's status for it is let go of)."""
        parts = report.split(b":", 4)
        ok = (len(parts) == 5 and parts[1].isdigit() and len(parts[1]) <= 4
              and parts[2].isdigit() and 0 < len(parts[2]) <= 10
              and parts[3] in (b"00", b"01", b"10", b"11"))
        code = (int(parts[1]) or None) if ok else None
        if ok and parts[3] == b"11":
            self.zygote.status_of(self.seq, int(parts[2]))   # killed and reaped
        else:
            self.zygote.forget(self.seq)
        why = parts[4].decode(errors="replace") if ok else "no readable report"
        return SandboxSetupError(f"the command started but could not be handed over to "
                                 f"its supervisor ({why}); it was killed, and its Result "
                                 f"would mean nothing: run it again", step="handover",
                                 errno=code)


class _Zygote:
    """A small child of this process that forks the entrants (A), so that this process
    never forks for a command: a fork makes every page of it copy-on-write, and the
    supervisor then pays a page fault (and, threaded, a TLB shootdown) for each page it
    writes afterwards, about 180 of them on a command's path, a fraction of a millisecond.
    The zygote is a fork of this process made once, idle but for its requests: (A's socket
    end, the target's pidfd and root fd, the cgroup's attach fds, the seccomp program) in,
    (A's pid, the request's sequence number, a pidfd of A) out.

    It is a child subreaper: a command whose A exits is handed to it, not to this
    process, and it reaps the command and sends its wait status back on a socket of its
    own (`status_of`), under the request's sequence number. So the commands are never this process's children: if this
    process is SIGKILLed, they do not go to whatever subreaper or PID 1 is above it (one
    that never reaps would keep their zombies, and the sandbox's dying init waits, in the
    kernel, until every process of its pid namespace is reaped); the zygote outlives
    this process until it has reaped every command (bwrap's --die-with-parent ends the
    sandbox, so they all die), then exits. It leaves its loop when this process's end of
    its socket closes."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        st_ours, st_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                st_ours.close()
                _zygote_main(theirs, st_theirs)
            finally:
                os._exit(0)
        theirs.close()
        st_theirs.close()
        self.sock, self.pid, self.owner = ours, pid, os.getpid()
        self.lock = threading.Lock()
        self.status_sock = st_ours
        #: statuses read for other callers, by sequence number (unique for the zygote's
        #: life: a pid is not, and a status left unread must never match a later command)
        self._statuses: dict[int, int] = {}
        self._cond = threading.Condition(threading.Lock())
        self._reading = False
        #: requests whose status nobody will take (forget()): dropped as it comes
        self._forgotten: set[int] = set()
        #: forget()'s requests, not yet moved to _forgotten (under _cond, by status_of)
        self._to_forget: collections.deque[int] = collections.deque()

    def forget(self, seq: int) -> None:
        """Nobody will take request `seq`'s status: drop it, now or as it comes. Never
        waits for _cond: it runs from a finalizer, which the cyclic GC (or a signal
        handler) may run in a thread inside status_of that holds it (not reentrant: a
        deadlock); if _cond is taken, status_of lets the request go on its next call."""
        self._to_forget.append(seq)
        if self._cond.acquire(blocking=False):
            try:
                self._forget_now()
            finally:
                self._cond.release()

    def _forget_now(self) -> None:
        """Under _cond: the requests forget() was told of, their statuses dropped."""
        while self._to_forget:
            seq = self._to_forget.popleft()
            if self._statuses.pop(seq, None) is None:
                self._forgotten.add(seq)

    def status_of(self, seq: int, b: int) -> int:
        """The wait status of command `b`, of request `seq` (it has exited: its pidfd
        said so). One caller at a time reads the socket, keeping the statuses of others
        for them."""
        with self._cond:
            self._forget_now()
            while True:
                if seq in self._statuses:
                    return self._statuses.pop(seq)
                if not self._reading:
                    break
                self._cond.wait()
            self._reading = True
        try:
            while True:
                try:
                    msg = self.status_sock.recv(64)
                except OSError:
                    msg = b""
                if not msg:     # the zygote died: its commands came to us, if anyone
                    return _wait_own(b)
                got, _, status = msg.partition(b" ")
                with self._cond:
                    if int(got) == seq:
                        return int(status)
                    self._forget_now()
                    if int(got) in self._forgotten:
                        self._forgotten.discard(int(got))
                        continue
                    self._statuses[int(got)] = int(status)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()

    def fork_entrant(self, theirs, target: Target, attach: list[int], program: Program,
                     uid: int = 0) -> tuple[int, int, _Zygote, int]:
        req = marshal.dumps((target.flags, target.last_cap, program.bpf, uid,
                             program.listen))
        with self.lock:
            socket.send_fds(self.sock, [req], [theirs.fileno(), target.pidfd,
                                                target.root_fd, *attach])
            msg, fds, _, _ = socket.recv_fds(self.sock, 1100, 1)
        if not msg:
            raise BrokenPipeError("the zygote is gone")
        if msg == b"retired":
            for fd in fds:
                os.close(fd)
            raise _Retired()
        if msg[:1] == b"s":    # (never: statuses have their own socket)
            raise BrokenPipeError("the zygote is confused")
        a, _, seq = msg.partition(b" ")
        if not (a.isdigit() and seq.isdigit()) or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandboxSetupError("entering the sandbox failed: the zygote could not "
                                    f"fork an entrant ({msg[:200]!r})", step="enter")
        return int(a), fds[0], self, int(seq)

    def close(self) -> None:
        self.sock.close()
        self.status_sock.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class _Retired(Exception):
    """The zygote has retired (too many statuses unread: UNSENT_MAX) and forks no more
    entrants; it lives on until its commands are reaped and their statuses sent."""


_zygote_now: list = []
#: retired zygotes not yet exited (reaped by _zygote() once they have)
_zygote_retired: list = []
_zygote_lock = threading.Lock()


def _zygote() -> _Zygote:
    """This process's zygote, made on first use (and again after a fork or its death)."""
    with _zygote_lock:
        for old in list(_zygote_retired):
            try:
                done = old.owner != os.getpid() or os.waitpid(old.pid, os.WNOHANG)[0]
            except ChildProcessError:
                done = True
            if done:
                # its request socket only: statuses it sent before it exited may wait, unread,
                # on the other, whose readers (its entrants) hold it (closed as it is let go)
                old.sock.close()
                _zygote_retired.remove(old)
        z = _zygote_now[0] if _zygote_now else None
        if z is not None and z.owner == os.getpid():
            try:
                done, _ = os.waitpid(z.pid, os.WNOHANG)
            except ChildProcessError:
                done = z.pid
            if not done:
                return _ZygoteUser(z)
            z.sock.close()    # it has exited: its status socket's readers have had EOF
            z.status_sock.close()
        first = not _zygote_now
        z = _Zygote()
        _zygote_now[:] = [z]
        if first:
            import atexit

            atexit.register(_close_at_exit)
        return _ZygoteUser(z)


def warm() -> None:
    """Make this process's zygote now, if it has none. A long-lived process that imports
    much more before its first command (corral serve: FastAPI, pydantic, uvicorn) calls
    this first: the zygote is then a copy of a small process, and so is every entrant it
    forks for a command. An entrant's fork and its exit (on a command's path, beside the
    command) copy and tear down page tables for all the zygote maps: from a server's
    ~45 MB image they cost several times what they do from a ~12 MB one."""
    _zygote()


def _close_at_exit() -> None:
    """At this process's exit: close its end of the zygote's socket (the zygote reaps
    its entrants and ends at EOF) instead of leaving it to the interpreter's teardown."""
    with _zygote_lock:
        for z in (*_zygote_now, *_zygote_retired):
            if z.owner == os.getpid():
                z.sock.close()
                z.status_sock.close()


class _ZygoteUser:
    """fork_entrant through the zygote, made again once if it died meanwhile."""

    def __init__(self, z: _Zygote) -> None:
        self.z = z

    def fork_entrant(self, theirs, target, attach, program, uid=0):
        try:
            return self.z.fork_entrant(theirs, target, attach, program, uid)
        except _Retired:
            import weakref

            with _zygote_lock:
                if _zygote_now and _zygote_now[0] is self.z:
                    # never waited for here: it ends once its commands have (and its
                    # request socket must stay open till then: EOF tells it we are gone)
                    _zygote_retired.append(self.z)
                    weakref.finalize(self.z, self.z.status_sock.close)
                    _zygote_now.clear()
            return _zygote().z.fork_entrant(theirs, target, attach, program, uid)
        except (BrokenPipeError, ConnectionResetError):
            with _zygote_lock:
                if _zygote_now and _zygote_now[0] is self.z:
                    self.z.sock.close()     # it has died: the wait is short
                    try:
                        os.waitpid(self.z.pid, 0)
                    except ChildProcessError:
                        pass
                    self.z.status_sock.close()   # (its readers have had EOF)
                    _zygote_now.clear()
            return _zygote().z.fork_entrant(theirs, target, attach, program, uid)


class _Received:
    """The target as the zygote receives it (a Target's fields, from the request)."""

    def __init__(self, pidfd: int, root_fd: int, flags: int, last_cap: int,
                 uid: int = 0) -> None:
        self.pidfd, self.root_fd, self.flags, self.last_cap = pidfd, root_fd, flags, last_cap
        self.uid = uid


def _wait_own(b: int) -> int:
    """B's status when its zygote died first: B came to this process (a child subreaper
    while a live sandbox runs); if not, it was killed with the sandbox as far as anyone
    here can tell."""
    try:
        return os.waitpid(b, 0)[1]
    except ChildProcessError:
        return 9


def _zygote_main(sock, status_sock) -> None:
    """The zygote's loop: each request forks one A; A's that exited are reaped, and so
    are the commands (B) their exits handed over, whose statuses go to status_sock under
    their request's sequence number (each A writes "B SEQ" to the births pipe before it
    exits, so before B can be handed over).

    Statuses the socket will not take (its supervisor reads none: their commands'
    supervision ended early) wait in a list; once more than UNSENT_MAX wait, the zygote
    retires rather than keep more: each request gets "retired" (its supervisor makes a new
    zygote), and it lives on only to reap the entrants and commands it has and send their
    statuses, then exits (waiting RETIRED_FLUSH_S at most for a reader)."""
    import signal

    _close_all_but((0, 1, 2, sock.fileno(), status_sock.fileno()))
    _sys.become_subreaper()
    # its end is its owner's (EOF on the socket), not a SIGINT or SIGTERM sent to the
    # whole group (Ctrl-C, systemd's stop) while the owner drains its commands; the
    # entrants give their commands every signal at its default (inherited_signals)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    entrants: set[int] = set()
    births_r, births_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(births_r, False)
    poller.register(births_r, select.POLLIN)
    born: dict[int, int] = {}     # a command's pid: its request's sequence number
    seq = 0
    pending = b""

    def read_births() -> None:
        nonlocal pending
        while True:
            try:
                chunk = os.read(births_r, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            b, _, n = line.partition(b" ")
            if b.isdigit() and n.isdigit():
                born[int(b)] = int(n)
    # statuses nobody has read yet wait here, never in a blocking send: a supervisor that
    # took none (its supervision ended early) must not stop this loop, which forks every
    # live sandbox's entrants
    status_sock.setblocking(False)
    unsent: list[bytes] = []

    def flush() -> None:
        while unsent:
            try:
                status_sock.send(unsent[0])
            except BlockingIOError:
                poller.register(status_sock.fileno(), select.POLLOUT)
                return
            except OSError:     # its supervisor has gone: nobody will ask
                unsent.clear()
                break
            unsent.pop(0)
        try:
            poller.unregister(status_sock.fileno())
        except KeyError:
            pass

    def reap(block: bool) -> bool:
        """Reap what has exited (all, blocking, if `block`); False once none is left."""
        while True:
            try:
                done, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return False
            except InterruptedError:
                continue
            if not done:
                return True
            if done in entrants:
                entrants.discard(done)
                continue
            read_births()   # its A wrote "B SEQ" before it exited, so before this
            n = born.pop(done, None)
            if n is not None:   # a command: its supervisor waits for this (it may have gone)
                unsent.append(b"%d %d" % (n, status))
                flush()
            # else its A failed before it told (and told its supervisor, which waits not)

    retired = False
    while True:
        left = reap(False)
        flush()
        if not retired and len(unsent) > UNSENT_MAX:
            retired = True
        if retired and not left:     # every entrant and command of it reaped
            read_births()
            deadline = time.monotonic() + RETIRED_FLUSH_S
            while unsent and time.monotonic() < deadline:
                p = select.poll()
                p.register(status_sock.fileno(), select.POLLOUT)
                p.poll(max(1, int((deadline - time.monotonic()) * 1000)))
                flush()
            os._exit(0)
        try:
            ready = poller.poll()
        except InterruptedError:
            continue
        if any(fd == wake_r for fd, _ in ready):
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        if any(fd == births_r for fd, _ in ready):
            read_births()
        if not any(fd == sock.fileno() for fd, _ in ready):
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 64)
        if not msg:          # the supervisor has gone: so do the A's (their sockets end)
            # and the commands (the sandboxes die with it): reap them all, however long
            while reap(True):
                pass
            os._exit(0)
        if retired:
            for fd in fds:
                os.close(fd)
            sock.send(b"retired")
            continue
        try:
            flags, last_cap, bpf, uid, listen = marshal.loads(msg)
            if not isinstance(uid, int) or not 0 <= uid < 1 << 31:
                raise ValueError("uid")
            if not isinstance(listen, bool):
                raise ValueError("listen")
            theirs_fd, pidfd, root_fd, *attach = fds
        except (ValueError, TypeError, EOFError):
            for fd in fds:
                os.close(fd)
            sock.send(b"bad request")
            continue
        seq += 1
        try:
            program = Program(bpf, listen)
            a = os.fork()
        except (OSError, ValueError) as e:   # e.g. EAGAIN at a pids limit: said, not fatal
            for fd in fds:
                os.close(fd)
            sock.send(f"fork: {e}".encode()[:1000])
            continue
        if a == 0:
            sock.close()
            theirs = socket.socket(fileno=theirs_fd)
            os.close(births_r)
            _entrant(theirs, _Received(pidfd, root_fd, flags, last_cap, uid), attach,
                     program, (births_w, seq))
            os._exit(127)
        entrants.add(a)
        for fd in fds:
            os.close(fd)
        try:
            apidfd = os.pidfd_open(a)
        except OSError as e:
            sock.send(f"pidfd_open: {e.strerror}".encode())
            continue
        try:
            socket.send_fds(sock, [b"%d %d" % (a, seq)], [apidfd])
        finally:
            os.close(apidfd)


def _entrant(theirs, target: Target, attach: list[int], program: Program,
             birth: tuple[int, int]) -> None:
    """A's life (the module's docstring), in a child of the zygote: _exit on any failure,
    never return. `birth`: the zygote's births pipe and this request's sequence number."""
    ignored, _ = inherited_signals()
    caps = list(range(target.last_cap + 1))
    zero_caps = (ctypes.c_uint32 * 6)()
    header = (ctypes.c_uint32 * 2)(_sys._CAP_V3, 0)
    libc, flags = _libc, target.flags
    fail_w = -1
    started = 0        # B's pid once it runs: a failure after that is the handover's
    told = False       # the zygote knows B (it will send B's status under `seq`)
    try:
        # the zygote's SIGCHLD handler and wakeup fd are not A's (the fd number may be
        # reused here for a command's pipe)
        _signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        if program.listen:    # imported here: after the chroot the module is out of reach
            from .seccomp_notify import install_listening
        # nothing else of this process's: A may wait long, and a copy of a pipe's
        # write end (a command's stdin) would keep its reader from seeing EOF
        births_w, seq = birth
        _close_all_but((0, 1, 2, theirs.fileno(), target.pidfd, target.root_fd, births_w,
                        *attach))
        os.setgroups([])
        for fd in attach:
            os.write(fd, b"0")
            os.close(fd)
        if libc.setns(target.pidfd, flags) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns: {os.strerror(e)}")
        # A confines itself as the command will be (ahead of it, too), then
        # vforks it (B: no page tables copied) and leaves: B inherits all of it
        os.fchdir(target.root_fd)
        os.chroot(".")
        dash = shell_is_dash()
        os.close(target.root_fd)
        os.close(target.pidfd)
        for cap in caps:     # while it still has CAP_SETPCAP in the sandbox's namespace
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        # the sandbox's root (0), or an account its namespace maps: leaving uid 0 clears
        # every capability; an unmapped id is EINVAL, reported, and nothing runs
        uid = getattr(target, "uid", 0)
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if libc.syscall(_sys._CAPS[1], header, zero_caps) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"capset: {os.strerror(e)}")
        for sig in ignored:   # SIG_IGN survives exec; the command gets defaults
            if sig not in (9, 19):
                try:
                    _signal.signal(sig, 0)
                except (OSError, ValueError):
                    pass
        _signal.pthread_sigmask(2, [])
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"no_new_privs: {os.strerror(e)}")
        if program.listen:    # observed: the listener goes to the supervisor, never on
            lfd = install_listening(libc, program.addr)
            socket.send_fds(theirs, [b"r"], [lfd])
            os.close(lfd)     # before anything runs here: a holder could answer itself
        else:
            if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, program.addr, 0, 0) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"seccomp: {os.strerror(e)}")
            theirs.send(b"r")     # ready: entered and confined
        msg, fds, _, _ = socket.recv_fds(theirs, INLINE_MAX + 1, 5)
        if not msg or len(fds) != (4 if msg[:1] == b"i" else 5):
            os._exit(0)       # never used
        if msg[:1] == b"i":   # the request in the message itself
            stdin_fd, out_w, err_w, fail_w = fds
            data = msg[1:]
        else:                 # a big one, in a memfd
            stdin_fd, out_w, err_w, fail_w, req_fd = fds
            with open(req_fd, "rb") as f:
                data = f.read()
        (argvb, envb, names, cwdb, nofile, fsize, cpu,
         new_session, words) = marshal.loads(data)
        tries = [(argvb, names, envb)]
        if words and dash:    # a plain command line: without /bin/sh if it is the same
            found = resolve(words[0], envb)
            if found is not None:
                tries.insert(0, (words, [found], shell_env(envb, cwdb)))
        _rlimits(nofile, fsize, cpu)
        for n, (argvb, names, envb) in enumerate(tries):
            direct = n + 1 < len(tries)
            err_r, err_w2 = os.pipe()
            envl = [k + b"=" + v for k, v in envb.items()]
            # vfork + exec (CPython's C code, as subprocess): setsid, chdir, stdio,
            # every other fd closed, SIGPIPE and SIGXFSZ back to default
            b = _posixsubprocess.fork_exec(   # pass_fds must hold the error pipe
                argvb, names, True, (err_w2,), cwdb, envl, stdin_fd, -1, -1, out_w, -1,
                err_w, err_r, err_w2, True, new_session, -1, None, None, None, -1, None,
                True)
            os.close(err_w2)
            child_err = _read_small(err_r, 300)
            os.close(err_r)
            if not child_err:
                break
            os.waitpid(b, 0)
            _, _, rest = child_err.partition(b":")
            code, _, why = rest.partition(b":")
            if direct and why != b"noexec":
                continue      # its exec failed (a #! naming no interpreter): the shell
                # runs the line instead, and says why in its own words
            try:
                errno_ = int(code, 16)
            except ValueError:
                errno_ = 0
            if why == b"noexec":    # before exec: the working directory
                os.write(fail_w, f"cwd:{errno_}:".encode())
                os._exit(127)
            os.write(fail_w, report_exec_failure(errno_ or 2))
            os._exit(127)
        # B's pidfd, opened while B cannot have been reaped (this process is its
        # parent and does not wait), goes with its pid; then this process exits and B is
        # reparented to the nearest child subreaper, the zygote, which reaps it
        # first the zygote learns whose B is (one write under PIPE_BUF: whole, before
        # this process exits and B is handed over to it), then the supervisor
        started = b
        os.write(births_w, b"%d %d\n" % (b, seq))
        told = True
        pfd = os.pidfd_open(b)
        socket.send_fds(theirs, [b"%d%s" % (b, b"d" if direct else b"")], [pfd])
        try:    # the supervisor, just woken (often on this CPU), runs before this
            os.sched_yield()    # process's exit tears its memory down: ~0.5 ms sooner
        except OSError:
            pass
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 - reported to the supervisor, then die
        try:
            code = getattr(e, "errno", 0) or 0
            if started:   # the command runs but nobody supervises it: it must not
                killed = True
                try:
                    os.kill(started, 9)
                except OSError:
                    killed = False
                report = f"run:{code}:{started}:{told:d}{killed:d}:{e}".encode()[:1000]
            else:
                report = f"py:{code}:{e}".encode()[:1000]
            if fail_w >= 0:
                os.write(fail_w, report)
            else:
                theirs.send(b"e" + report)
        finally:
            os._exit(127)


def _close_all_but(keep) -> None:
    lo = 0
    for fd in sorted(set(keep)):
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, 0x7FFFFFFF)   # close_range(2): every fd, however high


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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
