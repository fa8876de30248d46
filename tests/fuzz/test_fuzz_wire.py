"""The egress proxy's two parsers of what a sandbox sends: the ClientHello reader
(egress/tls.py) and the request-head state machine (egress/conn.py). Arbitrary bytes, cut
at arbitrary points, give the same answer as the whole input; the only exceptions are the
documented ones (TLSError, ProxyProtocolError); what is buffered is bounded."""

from __future__ import annotations

import ssl

from hypothesis import assume, example, given
from hypothesis import strategies as st
from strategies import IPV4, NAME, split_points

from corral.egress.conn import (
    NEED_DATA,
    PAUSED,
    Closed,
    ProxyConnection,
    ProxyProtocolError,
    RequestData,
)
from corral.egress.tls import MAX_HELLO, NEED_MORE, ClientHello, TLSError, parse_client_hello

# --- ClientHello -------------------------------------------------------------------------

_HELLOS: dict = {}


def real_hello(name: str | None) -> bytes:
    """The ClientHello OpenSSL sends for this server name (made once per name)."""
    if name not in _HELLOS:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        _HELLOS[name] = outgoing.read()
    return _HELLOS[name]


def rerecord(hello: bytes, cuts: list[int]) -> bytes:
    """The same handshake message carried in several TLS records, cut at `cuts`."""
    body = hello[5:]
    points = sorted({c % len(body) for c in cuts} - {0})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)])]
    return b"".join(b"\x16\x03\x01" + len(p).to_bytes(2, "big") + p for p in pieces)


def tls_answer(data: bytes):
    try:
        r = parse_client_hello(data)
    except TLSError:
        return "error"
    assert r is NEED_MORE or isinstance(r, ClientHello), r
    return r


HELLO_NAMES = st.one_of(st.none(), NAME.filter(lambda n: len(n) < 200))


@given(HELLO_NAMES, st.lists(st.integers(0, 1 << 16), max_size=6), st.binary(max_size=20))
def test_real_hello_in_any_records_gives_its_sni(name, cuts, trailing):
    data = rerecord(real_hello(name), cuts)
    r = parse_client_hello(data + trailing)
    assert isinstance(r, ClientHello) and r.sni == name and r.length == len(data)
    for i in (0, 1, 4, 5, len(data) // 2, len(data) - 1):
        assert parse_client_hello(data[:i]) is NEED_MORE


@given(HELLO_NAMES, st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)),
                             min_size=1, max_size=6),
       st.integers(0, 1 << 16))
def test_mutated_hello_prefixes_agree_with_the_whole(name, flips, cut):
    data = bytearray(real_hello(name))
    for at, value in flips:
        data[at % len(data)] = value
    whole = tls_answer(bytes(data))
    prefix = tls_answer(bytes(data[:cut % (len(data) + 1)]))
    if isinstance(whole, ClientHello):
        # everything the answer rests on is in its records: a shorter read waits for it
        assert prefix is NEED_MORE or prefix == whole
    elif whole == "error":
        assert prefix in (NEED_MORE, "error")
    if isinstance(prefix, ClientHello):
        assert whole == prefix


@given(st.binary(max_size=300))
@example(b"\x16\x03\x01\x00\x04\x01\xff\xff\xff")          # claims a 16 MiB hello
@example(b"\x16\x03\x01\x40\x01")                          # a record over 2**14
def test_arbitrary_bytes_give_need_more_hello_or_tls_error(data):
    tls_answer(data)
    tls_answer(b"\x16\x03\x01" + len(data).to_bytes(2, "big") + data)


def test_hello_size_is_capped():
    big = (MAX_HELLO + 1).to_bytes(3, "big")
    data = b"\x16\x03\x01\x00\x04\x01" + big
    try:
        parse_client_hello(data)
    except TLSError as e:
        assert "too large" in str(e)
    else:
        raise AssertionError("a ClientHello over MAX_HELLO was waited for")


# --- ProxyConnection ---------------------------------------------------------------------

def conn_answer(pieces: list[bytes], max_header_bytes: int = 16384):
    """Events of the pieces fed in turn (RequestData merged), and the error's status."""
    conn = ProxyConnection(max_header_bytes)
    out: list = []
    try:
        for p in pieces:
            conn.receive_data(p)
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA or ev is PAUSED:
                    break
                if isinstance(ev, RequestData) and out and isinstance(out[-1], RequestData):
                    out[-1] = RequestData(out[-1].data + ev.data)
                elif not (isinstance(ev, RequestData) and not ev.data):
                    out.append(ev)
                if isinstance(ev, Closed):
                    return out, None
    except ProxyProtocolError as e:
        assert str(e) and str(e).isprintable() and e.status in (400, 403, 431), e
        return out, e.status
    return out, None


HOSTS = st.one_of(NAME, IPV4.map(str), st.sampled_from(["[::1]", "localhost", "a_b.test"]))
HEADER = st.tuples(st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding",
                                    b"X-A", b"Connection", b"Expect", b"host"]),
                   st.one_of(st.sampled_from([b"chunked", b"0", b"5", b"close",
                                              b"100-continue", b"identity, chunked"]),
                             st.binary(max_size=12)))


@st.composite
def requests(draw) -> bytes:
    host = draw(HOSTS)
    port = draw(st.one_of(st.none(), st.integers(0, 70000)))
    auth = host + ("" if port is None else f":{port}")
    kind = draw(st.sampled_from(["connect", "get", "post", "origin", "https"]))
    if kind == "connect":
        line = f"CONNECT {auth} HTTP/1.1"
    else:
        method = "POST" if kind == "post" else "GET"
        scheme = "https" if kind == "https" else "http"
        target = "/x" if kind == "origin" else f"{scheme}://{auth}{draw(st.sampled_from(['', '/', '/a?b', '/#f', '?q']))}"
        line = f"{method} {target} HTTP/1.{draw(st.sampled_from('01'))}"
    head = [line.encode()]
    if draw(st.booleans()):
        head.append(b"Host: " + auth.encode())
    head += [k + b": " + v for k, v in draw(st.lists(HEADER, max_size=4))]
    body = draw(st.sampled_from([b"", b"hello", b"5\r\nhello\r\n0\r\n\r\n"]))
    data = b"\r\n".join(head) + b"\r\n\r\n" + body
    return data * draw(st.sampled_from([1, 1, 2]))          # pipelined


@given(st.one_of(requests(), st.binary(max_size=200)), st.data())
@example(b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", None)
def test_request_heads_split_anywhere_give_the_same_answer(data, draw):
    assume(data)                             # b"" alone is the client closing
    whole = conn_answer([data])
    pieces = draw.draw(split_points(data)) if draw is not None else [data]
    assert conn_answer(pieces) == whole
    assert conn_answer([data[i:i + 1] for i in range(len(data))]) == whole
    # and the client closing after it (b"": the end of the stream)
    assert conn_answer([*pieces, b""]) == conn_answer([data, b""])


@given(requests(), st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(0, 255)),
                            min_size=1, max_size=4), st.data())
def test_mutated_requests_give_events_or_protocol_error(data, flips, draw):
    b = bytearray(data)
    for at, value in flips:
        b[at % len(b)] = value
    whole = conn_answer([bytes(b)])
    pieces = draw.draw(split_points(bytes(b)))
    assert conn_answer(pieces) == whole
    assert conn_answer([*pieces, b""]) == conn_answer([bytes(b), b""])


@given(st.integers(1, 8), st.sampled_from([b"X-A: " + b"a" * 1000 + b"\r\n", b"a" * 997]))
def test_a_head_that_never_ends_is_refused_at_the_bound(kb, filler):
    conn = ProxyConnection(max_header_bytes=2048)
    conn.receive_data(b"GET http://a.test/ HTTP/1.1\r\n")
    for _ in range(kb * 16):
        conn.receive_data(filler)
        try:
            assert conn.next_event() is NEED_DATA
        except ProxyProtocolError as e:
            assert e.status in (400, 431)
            return
        assert len(conn._h11._receive_buffer) <= 2048 + len(filler) + 64
    raise AssertionError("16 KiB of head per KiB of bound, and still waiting")
