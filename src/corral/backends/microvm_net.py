"""network.mode = "allow" on the microvm tier: the guest's connections to the egress proxy,
relayed over a virtio-serial port, and nothing else.

The guest has no network device at all, allow or not: only its loopback. With allow, the
guest agent listens on 127.0.0.1:3128 inside (where HTTP_PROXY points, as on the namespace
tier) and carries each connection it accepts over the second virtio-serial port
("corral.net") as frames; here, on the host, each relayed connection is connected to the
sandbox's egress proxy, over a unix socket in the run directory (mode 0700, corral's
own), and to nothing else: the guest names no address, so there is no address to check.
DNS pinning, the allowlist, secrets and the events are the proxy's, as on every tier.

    relay = HostRelay(sock, proxy_path, on_violation)   # a thread, until sock closes
    listener = proxy_listener(proxy_path)               # handed to start_proxy()

Frames on the port, both ways: 1 byte type, 4 bytes big-endian length, then a 4-byte
connection id and data (length at most MAX_FRAME). Guest to host: A (a new connection:
ids count up from 1, each once), B (bytes), Z (the guest's side ended). Host to guest: B,
Z, R (the proxy reset the connection, or stopped taking its bytes: the guest closes it at
once with a reset, so that a client that keeps sending is cut as the proxy cut it). Parsed
strictly: another type, a length out of bounds, an id never opened, or an A out
of order ends the VM (on_violation), with a teardown event.

Why a relay and not QEMU's user networking (slirp) with restrict=on and a guestfwd: a
guestfwd to a chardev carries one connection at a time (its chardev is one byte stream),
and a guestfwd to a command needs QEMU to spawn a process per connection, which its
seccomp sandbox (spawn=deny) forbids; and slirp would give the guest a network device, a
DHCP server and an address, all of them attack surface in QEMU's own process that the
relay does without. The cost: one host thread per VM.

The relay never blocks on a send. Every socket is non-blocking and what a peer has not
taken yet waits in a bounded buffer:
- to the guest (one buffer for the port): past OUT_HIGH bytes the relay stops reading the
  proxy's sockets until the guest has taken some (the proxy sees a slow reader, as from a
  slow client); past OUT_MAX, which only a guest that keeps sending while it reads
  nothing can cause (each frame it sends may be answered), the guest has broken the
  protocol (on_violation).
- to the proxy (a buffer per connection): past CONN_HIGH bytes the relay stops reading
  the guest's port until the proxy has taken some (the port carries every connection:
  there is no other way to slow one sender down), and a connection the proxy takes
  nothing of for SEND_TIMEOUT is reset (R to the guest), its buffer dropped.
A guest that stops reading its port (a client inside that reads nothing makes the agent
stop) stalls its own connections, never the relay's thread: it still takes the guest's
frames and its stop, and no other VM shares it.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time

MAX_FRAME = 65536
#: connections open at once through one VM's relay (more: closed at once, Z to the guest;
#: the guest's side answers a 503 past 480, and the proxy past its own cap of 512)
MAX_CONNS = 512
#: how long the relay waits for the proxy to take a connection's bytes before it drops
#: the connection (R to the guest)
SEND_TIMEOUT = 30.0
#: bytes for the guest the relay holds before it stops reading the proxy's sockets, and
#: at most (past it, the guest broke the protocol)
OUT_HIGH = 256 << 10
OUT_MAX = 4 << 20
#: bytes for the proxy the relay holds per connection before it stops reading the port
CONN_HIGH = 256 << 10
PROXY_SOCKET = "egress.sock"

_IN, _OUT = select.POLLIN, select.POLLOUT


def proxy_listener(path: str) -> socket.socket:
    """A unix listener at `path` (in the run directory; an old one is replaced)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
        s.listen(128)
    except BaseException:
        s.close()
        raise
    return s


class HostRelay:
    """See the module's docstring. `on_violation(why)`: the guest broke the protocol."""

    def __init__(self, sock: socket.socket, proxy_path: str, on_violation) -> None:
        self.sock, self.proxy_path, self.on_violation = sock, proxy_path, on_violation
        sock.setblocking(False)
        self.conns: dict[int, socket.socket] = {}
        self.ends: dict[int, int] = {}     # 1: the guest's side ended, 2: the proxy's
        self.by_fd: dict[int, int] = {}
        #: bytes for the proxy not taken yet, by connection, and since when it took none
        self.pending: dict[int, bytearray] = {}
        self.since: dict[int, float] = {}
        self.out = bytearray()             # bytes for the guest not taken yet
        self.last = 0
        self.buf = bytearray()
        self.poller = select.poll()
        self.events: dict[int, int] = {}   # what each fd is registered for
        self.stop_r, self.stop_w = os.pipe()
        self.thread = threading.Thread(target=self._run, daemon=True, name="corral-mvm-net")
        self.thread.start()

    def close(self) -> None:
        try:
            os.write(self.stop_w, b"x")
        except OSError:
            pass
        self.thread.join(5)
        for fd in (self.stop_r, self.stop_w):
            os.close(fd)

    # -- what each fd waits for ------------------------------------------------------------

    def _want(self, fd: int, events: int) -> None:
        """Register fd for `events`; none: not at all (a hung-up peer's POLLHUP, which poll
        reports whatever was asked, must not wake a loop that will not act on it)."""
        had = self.events.get(fd, 0)
        if events == had:
            return
        if not events:
            self.poller.unregister(fd)
            del self.events[fd]
        elif had:
            self.poller.modify(fd, events)
            self.events[fd] = events
        else:
            self.poller.register(fd, events)
            self.events[fd] = events

    def _update(self) -> None:
        """The port: read unless a connection's proxy is behind; write while bytes wait.
        The proxy's sockets: read while the guest keeps up and it has not ended; write
        while bytes wait."""
        behind = any(len(p) > CONN_HIGH for p in self.pending.values())
        self._want(self.sock.fileno(), (0 if behind else _IN) | (_OUT if self.out else 0))
        reading = len(self.out) <= OUT_HIGH
        for cid, s in self.conns.items():
            ev = (_IN if reading and not self.ends[cid] & 2 else 0) | (
                _OUT if self.pending.get(cid) else 0)
            self._want(s.fileno(), ev)

    def _forget(self, s: socket.socket) -> None:
        fd = s.fileno()
        self.by_fd.pop(fd, None)
        if fd in self.events:
            self._want(fd, 0)
        s.close()

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        self._want(self.stop_r, _IN)
        self._update()
        try:
            while True:
                timeout = None
                if self.since:
                    timeout = max(0, min(self.since.values()) + SEND_TIMEOUT - time.monotonic())
                for fd, ev in self.poller.poll(None if timeout is None else timeout * 1000):
                    if fd == self.stop_r:
                        return
                    if fd == self.sock.fileno():
                        if ev & _OUT or ev & (select.POLLHUP | select.POLLERR) and self.out:
                            self._flush_out()
                        if ev & ~_OUT and self.events.get(fd, 0) & _IN:
                            try:
                                chunk = self.sock.recv(1 << 16)
                            except BlockingIOError:
                                continue
                            if not chunk:
                                return
                            self._from_guest(chunk, self.poller)
                    else:
                        cid = self.by_fd.get(fd)
                        if cid is None:
                            continue
                        if ev & ~_IN and self.pending.get(cid):   # a hung-up proxy: reset
                            self._to_proxy(cid)
                        if ev & ~_OUT and self.events.get(fd, 0) & _IN:
                            self._from_proxy(fd, self.poller)
                self._expire()
                self._update()
        except _Violation as e:
            self.on_violation(str(e))
        except OSError:
            pass    # the VM's end closed
        finally:
            for s in self.conns.values():
                s.close()
            self.conns.clear()

    def _expire(self) -> None:
        """Reset each connection whose proxy has taken none of its bytes for SEND_TIMEOUT."""
        now = time.monotonic()
        for cid in [c for c, t in self.since.items() if now - t >= SEND_TIMEOUT]:
            self._reset(cid, self.poller)

    # -- the guest's side --------------------------------------------------------------------

    def _send(self, kind: bytes, cid: int, data: bytes = b"") -> None:
        if len(self.out) + 9 + len(data) > OUT_MAX:
            self._flush_out()
        if len(self.out) + 9 + len(data) > OUT_MAX:
            raise _Violation(f"the guest took none of {len(self.out)} bytes of its network "
                             f"port while it kept sending")
        self.out += kind + struct.pack(">II", 4 + len(data), cid) + data
        self._flush_out()

    def _flush_out(self) -> None:
        while self.out:
            try:
                n = self.sock.send(self.out)
            except BlockingIOError:
                return
            del self.out[:n]

    def _from_guest(self, chunk: bytes, poller) -> None:
        self.buf += chunk
        while len(self.buf) >= 5:
            kind, n = bytes(self.buf[:1]), struct.unpack(">I", self.buf[1:5])[0]
            if kind not in (b"A", b"B", b"Z") or not 4 <= n <= MAX_FRAME:
                raise _Violation(f"bad network frame from the guest (type {kind!r}, "
                                 f"{n} bytes)")
            if len(self.buf) < 5 + n:
                return
            cid = struct.unpack(">I", self.buf[5:9])[0]
            data = bytes(self.buf[9:5 + n])
            del self.buf[:5 + n]
            if kind == b"A":
                if cid != self.last + 1 or data:
                    raise _Violation("the guest opened a relayed connection out of order")
                self.last = cid
                self._open(cid, poller)
            elif cid == 0 or cid > self.last:
                raise _Violation("the guest named a relayed connection it never opened")
            elif kind == b"Z":
                self._ended(cid, 1, poller)
            elif cid in self.conns and data:
                p = self.pending.setdefault(cid, bytearray())
                if not p:
                    self.since[cid] = time.monotonic()
                p += data
                self._to_proxy(cid)

    def _open(self, cid: int, poller) -> None:
        if len(self.conns) >= MAX_CONNS:
            self._send(b"Z", cid)
            return
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.proxy_path)   # a unix listener: at once, or refused
        except OSError:
            s.close()
            self._send(b"Z", cid)    # no proxy now (between one-shot commands)
            return
        s.setblocking(False)
        self.conns[cid], self.ends[cid], self.by_fd[s.fileno()] = s, 0, cid
        self._want(s.fileno(), _IN)

    # -- the proxy's side --------------------------------------------------------------------

    def _to_proxy(self, cid: int) -> None:
        """Send what the proxy has not taken of connection `cid` yet, as far as it takes;
        the rest waits (the loop writes again when it can, _expire gives up)."""
        p, s = self.pending.get(cid), self.conns.get(cid)
        if not p or s is None:
            return
        try:
            n = s.send(p)
        except BlockingIOError:
            return
        except OSError:     # the proxy closed it
            self._reset(cid, self.poller)
            return
        del p[:n]
        if p:
            self.since[cid] = time.monotonic()
            return
        del self.pending[cid], self.since[cid]
        if self.ends[cid] == 3:     # both sides had ended: it is done
            del self.conns[cid], self.ends[cid]
            self._forget(s)
        elif self.ends[cid] & 1:    # the guest's side had ended: now the proxy is told
            self._shut_wr(s)

    def _from_proxy(self, fd: int, poller) -> None:
        cid = self.by_fd.get(fd)
        if cid is None or len(self.out) > OUT_HIGH or self.ends[cid] & 2:
            return      # (the loop stops reading the proxy's sockets until the guest reads)
        s = self.conns[cid]
        try:
            # non-blocking: the event may be stale (its connection closed in this batch
            # and the fd number taken by a new one, with nothing to read)
            data = s.recv(MAX_FRAME - 4)
        except BlockingIOError:
            return
        except OSError:
            self._reset(cid, poller)
            return
        if data:
            self._send(b"B", cid, data)
        else:
            self._ended(cid, 2, poller, tell=True)

    def _reset(self, cid: int, poller) -> None:
        s = self.conns.pop(cid, None)
        self.ends.pop(cid, None)
        self.pending.pop(cid, None)
        self.since.pop(cid, None)
        if s is None:
            return
        self._forget(s)
        self._send(b"R", cid)

    def _ended(self, cid: int, side: int, poller, tell: bool = False) -> None:
        s = self.conns.get(cid)
        if s is None:
            return
        if tell:
            self._send(b"Z", cid)
        self.ends[cid] |= side
        if self.ends[cid] & 2 and s.fileno() in self.events:
            self._want(s.fileno(), _OUT if self.pending.get(cid) else 0)
        if self.ends[cid] == 3 and not self.pending.get(cid):
            self.pending.pop(cid, None)
            del self.conns[cid], self.ends[cid]
            self._forget(s)
        elif side == 1 and not self.pending.get(cid):
            self._shut_wr(s)

    @staticmethod
    def _shut_wr(s: socket.socket) -> None:
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _Violation(Exception):
    pass
