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
import marshal
import os
import select
import socket
import threading

try:
    import _posixsubprocess
except ImportError:  # pragma: no cover - not CPython
    _posixsubprocess = None

from ..errors import SandboxSetupError, UsageError
from . import _sys
from .enter_inside import (
    INLINE_MAX,
    Program,
    _read_small,
    _wait_own,
    _write_all,
    _zygote_main,
    nspid_in,
)
from .supervise import _exec_report, _fail_report

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


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def ns_pid_of(pidfd: int) -> int | None:
    """The pid inside its innermost pid namespace of the process of `pidfd` (the last
    NSpid field of the pidfd's fdinfo): the process's own, never a recycled pid's; None
    once it has been reaped (the kernel says -1) or if unreadable."""
    return nspid_in(f"/proc/self/fdinfo/{pidfd}")


def _exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` has exited (a pidfd is readable once it has,
    zombie or not), without waiting."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


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
        return self.pidfd >= 0 and not _exited(self.pidfd)

    def close(self) -> None:
        for fd in (self.pidfd, self.root_fd):
            if fd >= 0:
                os.close(fd)
        self.pidfd = self.root_fd = -1


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
        #: the command's pid inside the sandbox, as the zygote read it before reaping it
        #: (exit_status() sets it; None until then, or if the zygote could not)
        self.ns_pid: int | None = None
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
        is then set). start() does it first anyway. Raises SandboxSetupError when A
        reports a failure, ConnectionResetError when A ended without a word (killed
        before it was ready, by the OOM killer or a kill of the sandbox's processes: it
        never had a request, nothing ran; the caller may take another)."""
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
            if not msg:
                raise ConnectionResetError("the sandbox's entrant ended before it was "
                                           "ready")
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
        said it exited: the zygote, its parent, reaps it and sends the status (and its
        pid inside the sandbox, kept as `ns_pid`)."""
        status, self.ns_pid = self.zygote.status_of(self.seq, b)
        unclaimed = getattr(self, "_unclaimed", None)
        if unclaimed is not None:
            unclaimed.detach()
        return status

    def waiting(self) -> bool:
        """Whether A still lives (a prepared one can be killed while it waits: by the OOM
        killer at the sandbox's memory limit, which weighs the pages A shares with the
        zygote as A's own, or by a kill of everything in the sandbox)."""
        return self.pidfd >= 0 and not _exited(self.pidfd)

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
        return self.answer(self.send(argv, env, cwd=cwd, stdin_fd=stdin_fd,
                                     rlimits=rlimits, stdout_fd=stdout_fd, words=words))

    def send(self, argv: list[str], env: dict[str, str], *, cwd: str, stdin_fd: int,
             rlimits: tuple[int, int, int | None], stdout_fd: int | None = None,
             words: list[str] | None = None) -> tuple:
        """start()'s first half: the request sent (A's answer then comes on `sock`: an
        event loop can wait for it); what answer() takes."""
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
        return out_r, err_r, fail_r, cwd

    def answer(self, sent: tuple) -> tuple[int, int, int]:
        """start()'s second half: A's answer to the request send() sent (it blocks until
        it comes); start()'s return and errors."""
        out_r, err_r, fail_r, cwd = sent
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
        self._statuses: dict[int, tuple[int, int | None]] = {}
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

    def status_of(self, seq: int, b: int) -> tuple[int, int | None]:
        """The wait status of command `b`, of request `seq` (it has exited: its pidfd
        said so), and its pid inside the sandbox as the zygote read it before reaping it
        (None if it could not). One caller at a time reads the socket, keeping the
        statuses of others for them."""
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
                    return _wait_own(b), None
                got, status, inside = msg.split(b" ")   # "SEQ STATUS PID-INSIDE"
                told = (int(status), int(inside) or None)
                with self._cond:
                    if int(got) == seq:
                        return told
                    self._forget_now()
                    if int(got) in self._forgotten:
                        self._forgotten.discard(int(got))
                        continue
                    self._statuses[int(got)] = told
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
