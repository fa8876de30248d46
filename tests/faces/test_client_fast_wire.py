"""The sync SDK's exec socket (corral/client/_fast.py) against a plain HTTP server on
loopback that answers what each test gives: the request goes in one TCP segment (one
wake-up of the service), and the answer is read as HTTP/1.1 says (a chunked body, an
interim 1xx answer, Connection: close, HTTP/1.0), a malformed one as httpx's
RemoteProtocolError."""

import os
import socket
import struct
import threading

import httpx
import pytest

from corral.client import _fast

#: struct tcp_info's tcpi_data_segs_in (linux/tcp.h; Linux 4.6 and later)
DATA_SEGS_IN = 152


class Peer:
    """A loopback server: each request read whole (headers, Content-Length body), its
    socket's data segments counted, answered with the next of `answers` (raw bytes);
    a connection is closed after an answer whose flag says so, or when they run out."""

    def __init__(self, answers: list[tuple[bytes, bool]]) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[bytes, int]] = []     # (the request, data segments)
        self.conns = 0
        self.lsn = socket.socket()
        self.lsn.bind(("127.0.0.1", 0))
        self.lsn.listen()
        self.port = self.lsn.getsockname()[1]
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self) -> None:
        while self.answers:
            c, _ = self.lsn.accept()
            self.conns += 1
            with c:
                while self.answers:
                    req = self._read(c)
                    if req is None:
                        break
                    info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                    segs = struct.unpack_from("<I", info, DATA_SEGS_IN)[0]
                    self.requests.append((req, segs))
                    answer, close = self.answers.pop(0)
                    c.sendall(answer)
                    if close:
                        break

    @staticmethod
    def _read(c) -> bytes | None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = c.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < n:
            body += c.recv(65536)
        return buf

    def route(self) -> _fast.Route:
        return _fast.Route("http", "127.0.0.1", self.port, "/api", "Bearer corral_x")

    def close(self) -> None:
        self.t.join(10)
        self.lsn.close()


def _idle(peer) -> list:
    return _fast._idle.get((os.getpid(), "http", "127.0.0.1", peer.port), [])


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_a_request_is_one_segment_and_its_connection_is_kept():
    peer = Peer([(_ok(b'{"n":1}'), False), (_ok(b'{"n":2}'), True)])
    try:
        route = peer.route()
        status, headers, raw = _fast.post_exec(route, "s b", {"argv": ["true"]}, 10)
        assert (status, raw, headers["content-length"]) == (200, b'{"n":1}', "7")
        assert len(_idle(peer)) == 1
        assert _fast.post_exec(route, "sb", {"cmd": "é"}, 10)[2] == b'{"n":2}'
        assert peer.conns == 1, "the second request went on the kept connection"
        (first, segs1), (second, segs2) = peer.requests
        # headers and body in one send: the service's loop wakes once a request
        assert segs1 == 1 and segs2 == 2, (segs1, segs2)
        assert first.startswith(b"POST /api/sandboxes/s%20b/exec HTTP/1.1\r\n")
        assert b"\r\nAuthorization: Bearer corral_x\r\n" in first
        assert b"\r\nHost: 127.0.0.1:%d\r\n" % peer.port in first
        assert first.endswith(b'\r\n\r\n{"argv":["true"]}')
        assert second.endswith('{"cmd":"é"}'.encode())
    finally:
        for c in _idle(peer):
            c.close()
        _idle(peer).clear()
        peer.close()


def test_a_chunked_answer_after_a_100_continue_and_connection_close():
    chunked = (b"HTTP/1.1 100 Continue\r\n\r\n"
               b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: close\r\n\r\n"
               b"5;x=y\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nTrailer: t\r\n\r\n")
    peer = Peer([(chunked, True)])
    try:
        status, headers, raw = _fast.post_exec(peer.route(), "sb", {"cmd": "true"}, 10)
        assert (status, raw) == (404, b'{"a": 1}')
        assert headers["connection"] == "close"
        assert _idle(peer) == [], "a connection the service closes is not kept"
    finally:
        peer.close()


def test_an_http_1_0_answer_without_a_length_runs_to_the_end():
    peer = Peer([(b"HTTP/1.0 500 Oops\r\nContent-Type: text/plain\r\n\r\nboom", True)])
    try:
        assert _fast.post_exec(peer.route(), "sb", {"cmd": "true"}, 10)[::2] == (500, b"boom")
        assert _idle(peer) == []
    finally:
        peer.close()


@pytest.mark.parametrize("answer", [
    b"SSH-2.0-OpenSSH_9\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 << 10) + b"\r\n\r\n",
])
def test_a_malformed_answer_is_a_remote_protocol_error(answer):
    peer = Peer([(answer, True)])
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            _fast.post_exec(peer.route(), "sb", {"cmd": "true"}, 10)
        assert _idle(peer) == []
    finally:
        peer.close()


def test_a_control_character_in_the_token_goes_through_httpx():
    from corral.client._common import sync_client

    with sync_client("http://127.0.0.1:9", {"Authorization": "Bearer a"}) as ok:
        assert _fast.route_of(ok) is not None
    with sync_client("http://127.0.0.1:9", {"Authorization": "Bearer a\tb"}) as tab:
        assert _fast.route_of(tab) is None
