"""Seeing the syscalls a sandbox's seccomp profile refuses, without changing what it
refuses: seccomp's user notification (Linux 5.0+), for programs corral loads itself.

    prog = notifying(bpf)                      # every ERRNO(x) -> USER_NOTIF
    fd = install_listening(addr_of_sock_fprog) # in the child, instead of prctl: a listener
    ...                                        # the fd goes to the host side (SCM_RIGHTS)
    obs = Observer(bpf)                        # the ORIGINAL program; one thread
    tally = obs.watch(fd)                      # answers each refusal, counts it
    tally.entries()                            # [(nr, errno, count)], other, total
    obs.close()

How the errno stays the same: the program handed to the kernel is the original with each
`ret ERRNO(x)` (the allow list's ENOSYS and every refusal's EPERM, EOPNOTSUPP, ...) turned
into `ret USER_NOTIF`; ALLOW, KILL and TRAP are unchanged, as is every test and jump. So a
call the original allows is allowed by the kernel itself, never seen here, and costs what
it cost before. A call the original refuses stops in the kernel and waits; the observer
reads its struct seccomp_data, runs the ORIGINAL program on it (evaluate(): the same
instructions, the same path) and answers with that program's errno (error = -x), so the
command sees exactly what it would have seen unobserved.

Fail closed: if the listener goes (the observer closed, its process dead), the kernel
answers every notifying call ENOSYS from then on: still refused. The observer never
answers "continue", and the listener fd is never in the sandbox (the child closes its
copy before it execs anything; a holder of the listener could let its own calls through).

Bounded: counts per syscall number, at most MAX_DISTINCT numbers a listener; the rest are
counted together (`other`). The answer for one (nr, arch, args) is cached (the programs
never read the instruction pointer, which notifying() checks), so a flood of one refused
call costs a dict lookup per call on the host side.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import os
import select
import socket
import struct
import threading

SYS_SECCOMP = 317                      # x86_64
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
RET_ACTION_FULL = 0xFFFF0000
RET_ERRNO = 0x00050000
RET_USER_NOTIF = 0x7FC00000
#: the kernel caps a RET_ERRNO's data at this (include/linux/err.h); a notification's
#: answer is not capped, and a bigger one would reach the caller as a plain return value
MAX_ERRNO = 4095
# struct seccomp_notif: id u64, pid u32, flags u32, data (nr i32, arch u32, ip u64,
# args u64[6]); struct seccomp_notif_resp: id u64, val s64, error s32, flags u32
NOTIF = struct.Struct("<QII iIQ6Q")
RESP = struct.Struct("<QqiI")
IOCTL_NOTIF_RECV = (3 << 30) | (NOTIF.size << 16) | (0x21 << 8) | 0     # _IOWR('!', 0)
IOCTL_NOTIF_SEND = (3 << 30) | (RESP.size << 16) | (0x21 << 8) | 1     # _IOWR('!', 1)
#: distinct syscall numbers counted one by one per listener; the rest as `other`
MAX_DISTINCT = 64
#: answers remembered per observer (cleared when full)
CACHE_MAX = 4096

# classic BPF opcodes that seccomp programs here use (linux/filter.h), by what they do
LD_W_ABS, LD_IMM, LDX_IMM, ST, STX, LD_MEM, LDX_MEM = 0x20, 0x00, 0x01, 0x02, 0x03, 0x60, 0x61
ALU_AND_K, ALU_OR_K, TAX, TXA, JA = 0x54, 0x44, 0x07, 0x87, 0x05
JUMPS = {0x15: "eq", 0x25: "gt", 0x35: "ge", 0x45: "set",       # against k
         0x1D: "eq", 0x2D: "gt", 0x3D: "ge", 0x4D: "set"}       # against x
RET_K = 0x06
KNOWN = {LD_W_ABS, LD_IMM, LDX_IMM, ST, STX, LD_MEM, LDX_MEM, ALU_AND_K, ALU_OR_K, TAX,
         TXA, JA, RET_K, *JUMPS}
#: bytes of struct seccomp_data a program may read: nr, arch, args (not the ip at 8..15)
READABLE = (range(0, 8), range(16, 64))


def _insns(prog: bytes):
    if not prog or len(prog) % 8:
        raise ValueError("not a classic BPF program")
    return [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog), 8)]


def notifying(prog: bytes) -> bytes:
    """`prog` with each `ret ERRNO(x)` made `ret USER_NOTIF`, the rest byte for byte.
    Raises ValueError for a program evaluate() could not answer for exactly: an opcode it
    does not know, a `ret a`, a read of the instruction pointer or past the struct."""
    out = bytearray(prog)
    for i, (code, _jt, _jf, k) in enumerate(_insns(prog)):
        if code not in KNOWN:
            raise ValueError(f"BPF opcode {code:#x} at {i} is not one evaluate() runs")
        if code == LD_W_ABS and not (k % 4 == 0 and any(k in r for r in READABLE)):
            raise ValueError(f"BPF load of offset {k} at {i}: not nr, arch or an argument")
        if code in (ST, STX, LD_MEM, LDX_MEM) and not 0 <= k < 16:
            raise ValueError(f"BPF scratch slot {k} at {i}")
        if code == RET_K and k & RET_ACTION_FULL == RET_ERRNO:
            struct.pack_into("<I", out, i * 8 + 4, RET_USER_NOTIF)
    return bytes(out)


def evaluate(prog: bytes, data: bytes) -> int:
    """What classic BPF program `prog` returns for one struct seccomp_data (64 bytes), as
    the kernel runs it: 32-bit A and X, 16 scratch words, jumps relative to the next
    instruction. Only the opcodes of KNOWN (notifying() has checked the program)."""
    insns = _insns(prog)
    a = x = pc = 0
    mem = [0] * 16
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == LD_W_ABS:
            a = int.from_bytes(data[k:k + 4], "little")
        elif code == LD_IMM:
            a = k
        elif code == LDX_IMM:
            x = k
        elif code == ST:
            mem[k] = a
        elif code == STX:
            mem[k] = x
        elif code == LD_MEM:
            a = mem[k]
        elif code == LDX_MEM:
            x = mem[k]
        elif code == ALU_AND_K:
            a &= k
        elif code == ALU_OR_K:
            a |= k
        elif code == TAX:
            x = a
        elif code == TXA:
            a = x
        elif code == JA:
            pc += k
        elif code in JUMPS:
            v = x if code & 0x08 else k
            op = JUMPS[code]
            taken = (a == v if op == "eq" else a > v if op == "gt" else a >= v
                     if op == "ge" else bool(a & v))
            pc += jt if taken else jf
        elif code == RET_K:
            return k
        else:
            raise ValueError(f"BPF opcode {code:#x} at {pc - 1}")


def errno_of(prog: bytes, data: bytes) -> int:
    """The errno the original program answers for `data` (capped at MAX_ERRNO, as the
    kernel does); ENOSYS (what the kernel says when no listener is left) if it does not
    answer with an errno, which a notifying program derived from it cannot reach."""
    ret = evaluate(prog, data)
    if ret & RET_ACTION_FULL == RET_ERRNO:
        return min(ret & 0xFFFF, MAX_ERRNO)     # as the kernel caps it
    return _errno.ENOSYS


def install_listening(libc, prog_addr: int) -> int:
    """Load the program (a struct sock_fprog at prog_addr; no_new_privs already set) on
    the calling thread with a listener: returns its fd. For a child between fork and exec
    (libc: a ctypes CDLL with use_errno)."""
    fd = libc.syscall(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER,
                      SECCOMP_FILTER_FLAG_NEW_LISTENER, ctypes.c_void_p(prog_addr))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"seccomp(NEW_LISTENER): {os.strerror(e)}")
    return fd


class Tally:
    """The refusals one listener answered: per syscall number [count, errno], at most
    MAX_DISTINCT numbers, the rest in `other`."""

    __slots__ = ("closed", "counts", "other", "total")

    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = {}
        self.other = 0
        self.total = 0
        self.closed = threading.Event()   # set once the listener is gone

    def add(self, nr: int, errno: int) -> None:
        self.total += 1
        seen = self.counts.get(nr)
        if seen is not None:
            seen[0] += 1
        elif len(self.counts) < MAX_DISTINCT:
            self.counts[nr] = [1, errno]
        else:
            self.other += 1

    def entries(self) -> list[tuple[int, int, int]]:
        """(nr, errno, count), most counted first."""
        counts = list(self.counts.items())   # one step under the GIL: the observer's
        return sorted(((nr, e, n) for nr, (n, e) in counts),     # thread may still add
                      key=lambda t: (-t[2], t[0]))


class Observer:
    """One thread answering the listeners of one sandbox (watch() each); every answer is
    the original program's errno. close() stops it and closes the listeners (the kernel
    then answers ENOSYS)."""

    def __init__(self, original: bytes, name: str = "corral-seccomp") -> None:
        notifying(original)               # the same checks: evaluate() can run it
        self.original = bytes(original)
        self._cache: dict[bytes, int] = {}
        self._fds: dict[int, Tally] = {}
        self._socks: dict[int, tuple[socket.socket, Tally]] = {}   # listeners to come
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def watch(self, fd: int) -> Tally:
        """Answer listener `fd` from now on (the observer owns it and closes it)."""
        tally = Tally()
        with self._lock:
            if self._closed:      # the kernel answers its calls ENOSYS: still refused
                os.close(fd)
                tally.closed.set()
                return tally
            self._fds[fd] = tally
            self._wake()
        return tally

    def watch_socket(self, sock: socket.socket) -> Tally:
        """Answer the listener that will come on `sock` (a unix socket: one message with
        the fd) from the moment it arrives, so that nothing on the child's way to its exec
        can wait on an unanswered refusal. The observer owns `sock` and closes it; EOF
        without a listener ends the Tally."""
        tally = Tally()
        with self._lock:
            if self._closed:
                sock.close()
                tally.closed.set()
                return tally
            self._socks[sock.fileno()] = (sock, tally)
            self._wake()
        return tally

    def _receive(self, fd: int) -> None:
        with self._lock:
            sock, tally = self._socks.pop(fd)
        try:
            _, fds, _, _ = socket.recv_fds(sock, 16, 1,
                                           socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT)
        except OSError:
            fds = []
        sock.close()
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            tally.closed.set()
            return
        with self._lock:
            if self._closed:
                os.close(fds[0])
                tally.closed.set()
            else:
                self._fds[fds[0]] = tally

    def close(self) -> None:
        """Stop answering: the thread ends, every listener is closed. Idempotent."""
        with self._lock:
            if self._wake_w < 0:
                return
            self._closed = True
            self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self._wake_w >= 0:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        """With the lock held (close() closes the pipe under it)."""
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:   # full: a wake-up is pending anyway
            pass

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        polled: set[int] = set()
        buf = bytearray(NOTIF.size)
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    for fd in (self._fds.keys() | self._socks.keys()) - polled:
                        poller.register(fd, select.POLLIN)
                        polled.add(fd)
                for fd, ev in poller.poll():
                    if fd in self._socks:
                        poller.unregister(fd)
                        polled.discard(fd)
                        self._receive(fd)
                    elif fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 512)
                        except BlockingIOError:
                            pass
                    elif ev & select.POLLIN:
                        self._answer(fd, buf)
                    elif ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        poller.unregister(fd)
                        polled.discard(fd)
                        self._drop(fd)
        finally:   # closed, or this thread failed: either way no listener is left
            with self._lock:   # unanswered (a watch() after this closes its fd at once)
                self._closed = True
                fds = list(self._fds)
                socks, self._socks = list(self._socks.values()), {}
            for fd in fds:
                self._drop(fd)
            for sock, tally in socks:
                sock.close()
                tally.closed.set()

    def _drop(self, fd: int) -> None:
        with self._lock:
            tally = self._fds.pop(fd, None)
        if tally is not None:
            os.close(fd)
            tally.closed.set()

    def _answer(self, fd: int, buf: bytearray) -> None:
        buf[:] = bytes(len(buf))          # the kernel wants it zeroed
        try:
            fcntl.ioctl(fd, IOCTL_NOTIF_RECV, buf, True)
        except OSError:                   # ENOENT: the caller was killed meanwhile
            return
        nid = int.from_bytes(buf[0:8], "little")
        data = bytes(buf[16:80])
        key = data[0:8] + data[16:]       # the program never reads the ip (notifying)
        err = self._cache.get(key)
        if err is None:
            try:
                err = errno_of(self.original, data)
            except (ValueError, IndexError):   # cannot happen for a checked program:
                err = _errno.ENOSYS            # refused all the same
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[key] = err
        tally = self._fds.get(fd)
        if tally is not None:
            tally.add(int.from_bytes(data[0:4], "little", signed=True), err)
        try:
            fcntl.ioctl(fd, IOCTL_NOTIF_SEND, RESP.pack(nid, 0, -err, 0))
        except OSError:                   # ENOENT: it was killed while we answered
            pass


_names: dict[int, str] = {}


def syscall_name(nr: int) -> str:
    """x86_64 syscall `nr`'s name (libseccomp's table), or "syscall_NR"."""
    name = _names.get(nr)
    if name is None:
        try:
            import seccomp

            got = seccomp.resolve_syscall(seccomp.Arch.X86_64, nr)
            name = got.decode() if isinstance(got, bytes) else str(got)
        except (ImportError, ValueError, RuntimeError, TypeError):
            name = ""
        if not name or not name.isprintable() or name.startswith("UNKNOWN"):
            name = f"syscall_{nr}"
        _names[nr] = name
    return name
