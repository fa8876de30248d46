"""The inside half of linux/enter.py: the code that runs in the processes it forks, the
zygote (`_zygote_main`: forks the entrants, reaps them and their commands, sends the
commands' statuses) and each entrant A (`_entrant`: drops its groups, joins the command's
cgroup and the target's namespaces, confines itself as the command will be, then starts the
command and hands it over). linux/enter.py's docstring tells the whole protocol; this module
only holds the child side, so that the host side reads apart from it."""

from __future__ import annotations

import _signal
import ctypes
import marshal
import os
import resource
import select
import socket
import time

try:
    import _posixsubprocess
except ImportError:  # pragma: no cover - not CPython
    _posixsubprocess = None

from . import _sys
from .shellexec import resolve, shell_env, shell_is_dash
from .supervise import inherited_signals, report_exec_failure

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
#: seccomp programs the zygote keeps made (one a policy in use; past this many, it starts
#: again)
PROGRAMS_KEPT = 32
#: a retired zygote whose commands have all been reaped waits at most this long for its
#: supervisor to read the statuses it still holds, then exits
RETIRED_FLUSH_S = 5.0

_libc = _sys._libc
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
_libc.syscall.restype = ctypes.c_long


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


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


def ns_pid(pid: int) -> int | None:
    """The pid of host pid `pid` inside its innermost pid namespace (the last NSpid field
    of /proc/PID/status), or None if unreadable. Only for a pid that cannot be recycled
    while this reads it: a child of the caller not reaped yet (the zygote's commands)."""
    return nspid_in(f"/proc/{pid}/status")


def nspid_in(path: str) -> int | None:
    """The last NSpid field of a /proc status or fdinfo file (one read, at most 8 KiB: no
    file object), or None if unreadable, absent or -1."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 8192)
        finally:
            os.close(fd)
    except OSError:
        return None
    return _last_nspid(data)


def _last_nspid(data: bytes) -> int | None:
    """The last number of the "NSpid:" line of a status or fdinfo text; None without one
    or when the kernel says -1 (reaped)."""
    at = data.find(b"\nNSpid:")
    if at < 0:
        return None
    end = data.find(b"\n", at + 1)
    field = data[at + 7:end if end >= 0 else len(data)].split()
    if not field or not field[-1].isdigit():
        return None
    return int(field[-1])


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
    # every object this process has is kept out of the collector's walks from now on: a
    # full collection here (or in an entrant) would write to all their headers, copying
    # every page the entrants share with this process
    import gc

    gc.freeze()
    # its end is its owner's (EOF on the socket), not a SIGINT or SIGTERM sent to the
    # whole group (Ctrl-C, systemd's stop) while the owner drains its commands; the
    # entrants give their commands every signal at its default (inherited_signals)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    # what every entrant inherits (this process's dispositions, set above for good): read
    # once here, not in each entrant (a read of /proc and its buffer, beside a command)
    ignored = inherited_signals()[0]
    _cap_args()   # made here once: an entrant that made them made two ctypes types
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    entrants: set[int] = set()
    # not polled: A writes its line just before it exits, and the pipe is read as A is
    # reaped (a wake-up of its own for the line cost a command ~0.1-0.3 ms under load:
    # the zygote's Python work and its copy-on-write faults, beside the command); unread
    # are at most the lines of entrants not reaped yet
    births_r, births_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(births_r, False)
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
            if len(chunk) < 4096:
                break     # drained (another read would raise BlockingIOError)
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
    polled = [False]      # status_sock registered for POLLOUT (a status waits)

    def flush() -> None:
        while unsent:
            try:
                status_sock.send(unsent[0])
            except BlockingIOError:
                if not polled[0]:
                    poller.register(status_sock.fileno(), select.POLLOUT)
                    polled[0] = True
                return
            except OSError:     # its supervisor has gone: nobody will ask
                unsent.clear()
                break
            unsent.pop(0)
        if polled[0]:     # (no KeyError raised and caught at every wake-up: its objects
            poller.unregister(status_sock.fileno())    # touched the zygote's pages)
            polled[0] = False

    def reap(block: bool) -> bool:
        """Reap what has exited (all, blocking, if `block`); False once none is left. A
        command's status goes to its supervisor with its pid inside the sandbox, read
        from its zombie before it is reaped (the supervisor's own read, as it starts,
        finds nothing once a fast command has been reaped)."""
        while True:
            try:   # seen, not reaped yet (WNOWAIT): its /proc entry is still there
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT
                                 | (0 if block else os.WNOHANG))
            except ChildProcessError:
                return False
            except InterruptedError:
                continue
            if info is None:
                return True
            done = info.si_pid
            if done in entrants:
                os.waitpid(done, 0)
                entrants.discard(done)
                read_births()   # its line, if it wrote one (before it exited)
                continue
            if done not in born:
                read_births()   # its A wrote "B SEQ" before it exited, so before this
            n = born.pop(done, None)
            inside = ns_pid(done) if n is not None else None
            status = os.waitpid(done, 0)[1]
            if n is not None:   # a command: its supervisor waits for this (it may have gone)
                unsent.append(b"%d %d %d" % (n, status, inside or 0))
                flush()
            # else its A failed before it told (and told its supervisor, which waits not)

    # the seccomp programs of the requests, made into ctypes objects once each: every
    # entrant then reads the zygote's own (made for each request, they were new objects
    # a page or two of which every entrant copied)
    programs: dict[tuple[bytes, bool], Program] = {}
    retired = False
    left = True
    chld = True     # a SIGCHLD came (its wakeup byte): a child may wait to be reaped; a
    # request alone needs no waitpid (with no child left it raised ChildProcessError, whose
    # objects touch pages the entrants share)
    while True:
        if chld:
            left, chld = reap(False), False
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
            chld = True
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
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
            program = programs.get((bpf, listen))
            if program is None:      # one per sandbox's program, kept (a few KB each)
                if len(programs) >= PROGRAMS_KEPT:
                    programs.clear()
                program = programs[(bpf, listen)] = Program(bpf, listen)
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
                     program, (births_w, seq), ignored)
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


def _entrant(theirs, target: _Received, attach: list[int], program: Program,
             birth: tuple[int, int], ignored: list[int] | None = None) -> None:
    """A's life (the module's docstring), in a child of the zygote: _exit on any failure,
    never return. `birth`: the zygote's births pipe and this request's sequence number;
    `ignored`: the signals it inherits ignored (supervise.inherited_signals), if known."""
    if ignored is None:
        ignored = inherited_signals()[0]
    zero_caps, header = _cap_args()
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
        for cap in range(target.last_cap + 1):   # while it has CAP_SETPCAP in its namespace
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


_CAP_ARGS: list = []


def _cap_args() -> tuple:
    """capset's arguments for no capability at all (a header, zeroed data), made once (in
    the zygote, before it forks: the entrants use its objects and only read them)."""
    if not _CAP_ARGS:
        _CAP_ARGS[:] = [(ctypes.c_uint32 * 6)(), (ctypes.c_uint32 * 2)(_sys._CAP_V3, 0)]
    return tuple(_CAP_ARGS)


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
