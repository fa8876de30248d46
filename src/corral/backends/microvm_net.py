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
relay does without. The cost: one host thread per VM, and a guest that stops reading a
connection's bytes stalls the relay for all of its connections (its own only).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading

MAX_FRAME = 65536
#: connections open at once through one VM's relay (more: closed at once, Z to the guest;
#: the guest's side answers a 503 past 480, and the proxy past its own cap of 512)
MAX_CONNS = 512
#: how long the relay waits for the proxy to take bytes before it drops the connection
SEND_TIMEOUT = 30.0
PROXY_SOCKET = "egress.sock"


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
        self.conns: dict[int, socket.socket] = {}
        self.ends: dict[int, int] = {}     # 1: the guest's side ended, 2: the proxy's
        self.by_fd: dict[int, int] = {}
        self.last = 0
        self.buf = bytearray()
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

    def _send(self, kind: bytes, cid: int, data: bytes = b"") -> None:
        self.sock.sendall(kind + struct.pack(">II", 4 + len(data), cid) + data)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.stop_r, select.POLLIN)
        try:
            while True:
                for fd, _ in poller.poll():
                    if fd == self.stop_r:
                        return
                    if fd == self.sock.fileno():
                        chunk = self.sock.recv(1 << 16)
                        if not chunk:
                            return
                        self._from_guest(chunk, poller)
                    else:
                        self._from_proxy(fd, poller)
        except _Violation as e:
            self.on_violation(str(e))
        except OSError:
            pass    # the VM's end closed
        finally:
            for s in self.conns.values():
                s.close()
            self.conns.clear()

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
            elif cid in self.conns:
                s = self.conns[cid]
                try:
                    s.sendall(data)
                except OSError:     # the proxy closed it, or took nothing for 30 s
                    self._reset(cid, poller)

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
        s.settimeout(SEND_TIMEOUT)
        self.conns[cid], self.ends[cid], self.by_fd[s.fileno()] = s, 0, cid
        poller.register(s.fileno(), select.POLLIN)

    def _from_proxy(self, fd: int, poller) -> None:
        cid = self.by_fd.get(fd)
        if cid is None:
            return
        s = self.conns[cid]
        try:
            # the event may be stale: its connection closed in this batch and the fd number
            # taken by a new one; a socket with a timeout would wait for data (SEND_TIMEOUT)
            ready = select.poll()     # poll, not select: the fd may be past FD_SETSIZE
            ready.register(s, select.POLLIN)
            if not ready.poll(0):
                return
            data = s.recv(MAX_FRAME - 4)
        except OSError:
            self._reset(cid, poller)
            return
        if data:
            self._send(b"B", cid, data)
        else:
            poller.unregister(fd)
            self._ended(cid, 2, poller, tell=True)

    def _reset(self, cid: int, poller) -> None:
        s = self.conns.pop(cid, None)
        self.ends.pop(cid, None)
        if s is None:
            return
        self.by_fd.pop(s.fileno(), None)
        try:
            poller.unregister(s.fileno())
        except KeyError:
            pass
        s.close()
        self._send(b"R", cid)

    def _ended(self, cid: int, side: int, poller, tell: bool = False) -> None:
        s = self.conns.get(cid)
        if s is None:
            return
        if tell:
            self._send(b"Z", cid)
        self.ends[cid] |= side
        if self.ends[cid] == 3:
            fd = s.fileno()
            if fd in self.by_fd:
                del self.by_fd[fd]
                try:
                    poller.unregister(fd)
                except KeyError:
                    pass
            s.close()
            del self.conns[cid], self.ends[cid]
        elif side == 1:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass


class _Violation(Exception):
    pass
