"""Who owns the other end of a TCP connection on this host's loopback: the process tier's
proxy admits only the sandbox's uid (NetConfig.peer_uid).

`PeerLookup.uid(sock)` asks the kernel for exactly one socket (sock_diag, NETLINK_SOCK_DIAG,
an inet_diag request without NLM_F_DUMP: a hash lookup by the address pair), so it costs
the same with ten connections open or ten thousand. The older way, a scan of /proc/net/tcp,
reads every TCP socket of the namespace per accepted connection: during a storm of a few
thousand connections each accept took milliseconds, the accept queue backed up and the
proxy stopped answering at all. The scan stays as the fallback for a kernel without
inet_diag (CONFIG_INET_DIAG off), where it is the only way.

A row's uid is the socket's owner: its creator, or whom root fchown()ed it to. While this
end is open, no other socket can hold the same address pair, so the socket found is this
connection's other end.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
_NLMSGHDR = struct.Struct("=IHHII")
#: struct inet_diag_req_v2 without its sockid; the sockid's ports and addresses are
#: big-endian, its interface and cookie host order
_REQ = struct.Struct("=BBBBI")
#: struct inet_diag_msg up to idiag_uid: family, state, timer, retrans, sockid (48 bytes),
#: expires, rqueue, wqueue, uid
_MSG = struct.Struct("=BBBB48sIIII")


class PeerLookup:
    """One netlink socket per proxy, opened on first use (blocking: the kernel answers an
    exact lookup within the sendmsg, so the recv never waits)."""

    def __init__(self) -> None:
        self._nl: socket.socket | None = None
        self._diag = True          # False once the kernel said it has no inet_diag
        self._seq = 0

    def uid(self, client: socket.socket) -> int | None:
        """The uid owning the socket at the other end of `client` (an accepted IPv4 TCP
        connection), or None if there is no such socket here (it closed, or lives in another
        network namespace). OSError if the kernel could not be asked."""
        if client.family != socket.AF_INET:
            return None
        here, there = client.getsockname(), client.getpeername()
        if self._diag:
            try:
                return self._ask(there, here)
            except OSError as e:
                if e.errno not in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT, errno.EOPNOTSUPP):
                    raise
                self._diag = False
        return proc_net_tcp_uid(here, there)

    def _ask(self, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
        """The owner of the TCP socket bound to `local` and connected to `remote`."""
        if self._nl is None:
            self._nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                     NETLINK_SOCK_DIAG)
            self._nl.settimeout(2.0)
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        sockid = (struct.pack("!HH", local[1], remote[1])
                  + socket.inet_aton(local[0]) + bytes(12)
                  + socket.inet_aton(remote[0]) + bytes(12)
                  + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE))
        body = _REQ.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        self._nl.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                                     NLM_F_REQUEST, self._seq, 0) + body)
        while True:
            data = self._nl.recv(8192)
            if len(data) < _NLMSGHDR.size:
                raise OSError(errno.EPROTO, "short sock_diag reply")
            length, kind, _, seq, _ = _NLMSGHDR.unpack_from(data)
            if seq != self._seq:
                continue                     # a late answer to an earlier question
            payload = data[_NLMSGHDR.size:length]
            if kind == NLMSG_ERROR:
                err = -struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else errno.EPROTO
                if err == errno.ENOENT:
                    return None
                raise OSError(err, os.strerror(err), "sock_diag")
            if kind != SOCK_DIAG_BY_FAMILY or len(payload) < _MSG.size:
                raise OSError(errno.EPROTO, "unexpected sock_diag reply")
            family, *_, got_id, _, _, _, uid = _MSG.unpack_from(payload)
            if got_id[:4] != sockid[:4] or _addrs(family, got_id) != (
                    socket.inet_aton(local[0]), socket.inet_aton(remote[0])):
                return None                  # not the socket we asked for
            return uid

    def close(self) -> None:
        if self._nl is not None:
            self._nl.close()
            self._nl = None


def _addrs(family: int, sockid: bytes) -> tuple[bytes, bytes]:
    """A reply's (source, destination) as IPv4 addresses: a dual-stack socket connected to
    an IPv4 address reports them IPv4-mapped (::ffff:a.b.c.d)."""
    src, dst = sockid[4:20], sockid[20:36]
    if family == socket.AF_INET6:
        mapped = bytes(10) + b"\xff\xff"
        if src[:12] != mapped or dst[:12] != mapped:
            return b"", b""
        return src[12:], dst[12:]
    return src[:4], dst[:4]


def proc_net_tcp_uid(here: tuple[str, int], there: tuple[str, int]) -> int | None:
    """The fallback: the row of /proc/net/tcp (and tcp6, for an IPv4-mapped dual-stack
    client) whose local address is our peer and whose remote address is us."""

    def v4(addr) -> str:
        return f"{struct.unpack('<I', socket.inet_aton(addr[0]))[0]:08X}:{addr[1]:04X}"

    def v6(addr) -> str:
        words = struct.unpack("<4I", socket.inet_pton(socket.AF_INET6, "::ffff:" + addr[0]))
        return "".join(f"{w:08X}" for w in words) + f":{addr[1]:04X}"

    for table, fmt in (("/proc/net/tcp", v4), ("/proc/net/tcp6", v6)):
        want = (fmt(there), fmt(here))
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if (cols[1], cols[2]) == want:
                        return int(cols[7])
        except FileNotFoundError:
            continue
    return None


def peer_uid(client: socket.socket) -> int | None:
    """`PeerLookup().uid(client)` with a socket of its own (for a single question)."""
    lookup = PeerLookup()
    try:
        return lookup.uid(client)
    finally:
        lookup.close()


__all__ = ["PeerLookup", "peer_uid", "proc_net_tcp_uid"]
