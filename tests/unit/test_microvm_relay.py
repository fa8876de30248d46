"""The microvm tier's network relay (backends/microvm_net.py) at the unit level: the
guest's end of the relay port is one end of a socketpair this test holds, the egress
proxy a unix listener of the test's."""

import select
import socket
import struct

from corral.backends import microvm_net
from corral.backends.microvm_net import HostRelay


def _frame(kind: bytes, cid: int, data: bytes = b"") -> bytes:
    return kind + struct.pack(">II", 4 + len(data), cid) + data


def test_an_event_for_a_connection_with_nothing_to_read_does_not_stall_or_reset_it(
        tmp_path, monkeypatch):
    """A poll event can be stale (its connection closed and its fd number reused by a new
    one in the same batch): handled for a connection that has nothing to read, it must
    neither wait for data (up to SEND_TIMEOUT, stalling the guest's whole relay) nor reset
    the new connection."""
    monkeypatch.setattr(microvm_net, "SEND_TIMEOUT", 3.0)
    path = str(tmp_path / "egress.sock")
    proxy = microvm_net.proxy_listener(path)
    host, guest = socket.socketpair()
    violations = []
    relay = HostRelay(host, path, violations.append)
    upstream = None
    try:
        guest.sendall(_frame(b"A", 1))                  # the guest opens connection 1
        upstream, _ = proxy.accept()                    # and the relay connects to the proxy
        for _ in range(200):                            # the relay has registered it
            if 1 in relay.conns:
                break
            select.select([], [], [], 0.01)
        s = relay.conns[1]
        relay._from_proxy(s.fileno(), select.poll())    # a stale event: nothing to read
        assert 1 in relay.conns, "the connection was reset"
        guest.setblocking(False)
        try:
            got = guest.recv(100)
        except BlockingIOError:
            got = b""
        assert not got.startswith(b"R"), got             # no reset told to the guest
        upstream.sendall(b"hello")                      # and it still relays
        guest.setblocking(True)
        guest.settimeout(10)
        assert guest.recv(100) == _frame(b"B", 1, b"hello")
        assert violations == []
    finally:
        if upstream is not None:
            upstream.close()
        relay.close()
        guest.close()
        host.close()
        proxy.close()
