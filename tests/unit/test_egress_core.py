"""The sans-IO core of the egress proxy: tables with near misses, byte-at-a-time input, and
the fuzz invariant. No sockets here (socket.inet_aton is used as a reference parser only)."""

from __future__ import annotations

import random
import socket
import ssl
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network

import h11
import pytest

from corral.egress.config import Budget, NetConfig
from corral.egress.conn import (
    NEED_DATA,
    PAUSED,
    Closed,
    ConnectRequest,
    HttpRequest,
    ProxyConnection,
    ProxyProtocolError,
    RequestData,
    RequestEnd,
    deny_response,
    error_response,
    forward_request,
)
from corral.egress.decide import check_address, decide_target
from corral.egress.tls import NEED_MORE, ClientHello, TLSError, parse_client_hello
from corral.errors import PolicyError
from corral.policy.hosts import HostError, classify_ip, parse_host
from corral.policy.rules import parse_rule

# --- hosts ----------------------------------------------------------------------------

V4_LOOPBACK_SPELLINGS = ["127.0.0.1", "2130706433", "0177.0.0.1", "0x7f000001", "0x7f.1",
                         "127.1", "127.0.1", "0177.1", "0x7F.0.0.0x1", "017700000001",
                         "127.0.0.1.", "::ffff:127.0.0.1", "[::ffff:127.0.0.1]",
                         "::ffff:7f00:1", "[::ffff:7f00:1]", "0:0:0:0:0:ffff:7f00:1"]


@pytest.mark.parametrize("text", V4_LOOPBACK_SPELLINGS)
def test_every_spelling_of_127_0_0_1(text):
    assert parse_host(text) == IPv4Address("127.0.0.1")


@pytest.mark.parametrize("text,want", [
    ("[::1]", IPv6Address("::1")), ("::1", IPv6Address("::1")),
    ("0:0:0:0:0:0:0:1", IPv6Address("::1")),
    ("0", IPv4Address("0.0.0.0")), ("0x", IPv4Address("0.0.0.0")),
    ("4294967295", IPv4Address("255.255.255.255")), ("169.254.43518", IPv4Address("169.254.169.254")),
    ("0xa9.0xfe.0xa9.0xfe", IPv4Address("169.254.169.254")), ("10.1", IPv4Address("10.0.0.1")),
])
def test_ip_literals(text, want):
    assert parse_host(text) == want


@pytest.mark.parametrize("text,want", [
    ("ALLOWED.COM.", "allowed.com"), ("Allowed.Com", "allowed.com"),
    ("bücher.de", "xn--bcher-kva.de"), ("BÜCHER.de", "xn--bcher-kva.de"),
    ("xn--bcher-kva.de", "xn--bcher-kva.de"), ("XN--BCHER-KVA.DE.", "xn--bcher-kva.de"),
    ("evil\u3002com", "evil.com"), ("a_b.example.com", "a_b.example.com"),
    ("1.2.3.example", "1.2.3.example"), ("0x.example", "0x.example"),
    ("\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com", "example.com"),     # fullwidth
])
def test_names_are_canonical(text, want):
    assert parse_host(text) == want


@pytest.mark.parametrize("text", [
    "", ".", "..", "a..b", ".a", "x@evil", "user:pw@allowed.com", "allowed.com@evil.net",
    "a b", " allowed.com", "allowed.com ", "allowed.com\t", "a%2ecom", "evil.com/x",
    "evil.com\\x", "evil.com#x", "evil.com?x", "[::1", "fe80::1%eth0", "[fe80::1%25eth0]",
    "1.2.3.4.5", "256.1.1.1", "1.2.3.256", "08.1.1.1", "0x1g.1",
    "4294967296", "1.16777216", "-a.com", "a-.com", "a" * 64 + ".com", ("a." * 127) + "com",
    "stra\u00dfe.de", "xn--.com", "xn--zz-.com", "a\x00b.com", "example.123",
    "::ffff:127.0.0.1%lo", "[1::2::3]",
])
def test_bad_hosts_are_refused(text):
    with pytest.raises(HostError):
        parse_host(text)


HOST_BASES = ["example.com", "example.com.", "a_b.example.com", "xn--bcher-kva.de",
              "bücher.de", "1.2.3.4", "0x7f.1", "127.1", "2130706433", "0", "[::1]", "::1",
              "::ffff:127.0.0.1", "localhost"]
#: "$" in a regex matches before a final newline: every grammar uses fullmatch
NEAR_MISS_TAILS = ["\n", "\r", "\r\n", "\t", "\x00", " ", "\x0b", "\x0c", "\u2028", "\x85"]


@pytest.mark.parametrize("tail", NEAR_MISS_TAILS, ids=repr)
def test_hosts_with_a_trailing_or_leading_control_character_are_refused(tail):
    for base in HOST_BASES:
        parse_host(base)                                   # the base itself is fine
        for text in (base + tail, tail + base, base + tail + tail):
            with pytest.raises(HostError):
                parse_host(text)
    with pytest.raises(HostError):
        parse_host("example.com." + tail)
    assert parse_host("example.com.") == "example.com"     # one trailing dot, as before
    with pytest.raises(HostError):
        parse_host("example.com..")


@pytest.mark.parametrize("tail", NEAR_MISS_TAILS, ids=repr)
def test_rule_grammar_near_misses(tail):
    from corral.policy.rules import _valid_port

    assert _valid_port("443") and not _valid_port("443" + tail)
    # inside a rule a control character is refused; around it, whitespace is trimmed as
    # before ("  pypi.org  " in a policy file) and the rest must still parse whole
    for text in ("example.com" + tail + ":443", "*.example.com" + tail + ":443",
                 "10.0.0.0/8" + tail + ":443", "[::1" + tail + "]:443"):
        with pytest.raises(PolicyError):
            parse_rule(text, "network.allow[0]")
    if not tail.strip():
        r = parse_rule("example.com:443" + tail, "network.allow[0]")
        assert (r.name, r.ports) == ("example.com", (443,))
    else:
        with pytest.raises(PolicyError):
            parse_rule("example.com" + tail, "network.allow[0]")


@pytest.mark.parametrize("tail", ["\n", "\r\n", "\x00", " "], ids=repr)
def test_grant_names_and_placeholders_near_misses(tail):
    from corral.egress.mitm import make_ca

    cert, key = make_ca("t")
    good = {"name": "GITHUB_TOKEN", "placeholder": "corral_GITHUB_TOKEN_" + "0" * 32,
            "value": "ghp_abcdefgh12345678", "hosts": ["example.com"],
            "expires_at": 2e9, "plain_http": False}
    NetConfig.from_dict({"secrets": [good], "ca_cert_pem": cert, "ca_key_pem": key})
    for key_ in ("name", "placeholder"):
        bad = {**good, key_: good[key_] + tail}
        with pytest.raises(PolicyError) as e:
            NetConfig.from_dict({"secrets": [bad], "ca_cert_pem": cert, "ca_key_pem": key})
        assert e.value.field == f"network.secrets[0].{key_}"


def test_ipv4_parser_agrees_with_inet_aton():
    rnd = random.Random(4)
    alphabet = "0123456789xX.abf"
    for _ in range(4000):
        s = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 14)))
        try:
            ref = IPv4Address(socket.inet_aton(s))
        except OSError:
            ref = None
        try:
            got = parse_host(s)
        except HostError:
            got = None
        if ref is not None:
            assert got == ref, s
        elif isinstance(got, IPv4Address):
            # we read more as addresses than glibc does, never less: only these extras
            assert s.endswith(".") or "0x." in s + "." or s.lower().endswith("0x") \
                or "0x" in s.lower(), s


@pytest.mark.parametrize("addr,want", [
    ("8.8.8.8", "public"), ("1.1.1.1", "public"), ("2606:4700::1111", "public"),
    ("127.0.0.1", "loopback"), ("127.255.255.254", "loopback"), ("::1", "loopback"),
    ("10.0.0.1", "private"), ("172.16.0.1", "private"), ("172.31.255.255", "private"),
    ("172.32.0.1", "public"), ("192.168.1.1", "private"), ("fc00::1", "private"),
    ("fd12:3456::1", "private"), ("100.64.0.1", "cgnat"), ("100.127.255.255", "cgnat"),
    ("100.128.0.1", "public"), ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"),
    ("100.100.100.200", "metadata"), ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
    ("255.255.255.255", "broadcast"), ("240.0.0.1", "reserved"), ("198.18.0.1", "reserved"),
    ("192.0.2.1", "reserved"), ("203.0.113.9", "reserved"), ("2001:db8::1", "reserved"),
    ("::ffff:10.0.0.1", "private"), ("::ffff:169.254.169.254", "metadata"),
    ("64:ff9b::7f00:1", "loopback"), ("64:ff9b::a9fe:a9fe", "metadata"),
    ("64:ff9b::808:808", "public"), ("2002:7f00:1::", "loopback"), ("2002:a00:1::1", "private"),
    ("2002:808:808::1", "public"), ("::7f00:1", "loopback"), ("::10.0.0.1", "private"),
    ("2001::1", "reserved"), ("4000::1", "reserved"), ("64:ff9b:1::1", "private"),
])
def test_classify_ip(addr, want):
    assert classify_ip(ip_address(addr)) == want


# --- rules and config -------------------------------------------------------------------

CFG = NetConfig(
    allow=tuple(parse_rule(t, f"network.allow[{i}]") for i, t in enumerate([
        "allowed.com", "*.example.com", "github.com:22", "127.0.0.9:8080", "bücher.de",
        "10.1.0.0/16", "[::1]:8443", "api.test:8443"]))
    + (parse_rule("metadata.google.internal", "network.allow[8]"),),
    deny=(parse_rule("bad.example.com", "network.deny[0]"),
          parse_rule("10.1.2.0/24", "network.deny[1]")),
)


@pytest.mark.parametrize("host,port,allow", [
    ("allowed.com", 443, True), ("allowed.com", 80, True), ("ALLOWED.COM.", 443, True),
    ("allowed.com", 8080, False), ("allowed.com", 22, False),
    ("allowed.com.evil.net", 443, False), ("evilallowed.com", 443, False),
    ("allowed.co", 443, False), ("x.allowed.com", 443, False), ("allowed.com@evil.net", 80, False),
    ("x@allowed.com", 443, False), ("user:pw@allowed.com", 443, False),
    ("example.com", 443, False), ("a.example.com", 443, True), ("a.b.example.com", 80, True),
    ("badexample.com", 443, False), ("example.com.evil", 443, False),
    ("bad.example.com", 443, False), ("x.bad.example.com", 443, True),
    ("github.com", 22, True), ("github.com", 443, False), ("GitHub.com.", 22, True),
    ("bücher.de", 443, True), ("xn--bcher-kva.de", 443, True), ("BÜCHER.DE", 80, True),
    ("bucher.de", 443, False),
    ("127.0.0.9", 8080, True), ("0177.0.0.9", 8080, True), ("2130706441", 8080, True),
    ("::ffff:127.0.0.9", 8080, True), ("127.0.0.9", 80, False), ("127.0.0.1", 8080, False),
    ("2130706433", 80, False), ("0x7f000001", 80, False), ("127.1", 80, False),
    ("[::1]", 8443, True), ("::1", 8443, True), ("::1", 443, False),
    ("10.1.3.4", 443, True), ("10.1.2.4", 443, False), ("10.2.0.1", 443, False),
    ("metadata.google.internal", 80, False), ("METADATA.GOOGLE.INTERNAL.", 80, False),
    ("api.test", 8443, True), ("api.test", 443, False), ("api.test", 0, False),
    ("api.test", 65536, False), ("", 443, False),
])
def test_decide_target(host, port, allow):
    assert decide_target(CFG, host, port).allow is allow


def test_decide_target_canonical_host_and_reason():
    d = decide_target(CFG, "0177.0.0.1", 80)
    assert (d.allow, d.host, d.ip) == (False, "127.0.0.1", IPv4Address("127.0.0.1"))
    assert d.reason == 'ip literal not in network.allow; ask for "127.0.0.1:80"'
    d = decide_target(CFG, "Bad.Example.Com.", 443)
    assert (d.allow, d.host, d.reason) == (False, "bad.example.com",
                                           'network.deny[0] "bad.example.com"')
    d = decide_target(CFG, "new.org", 8443)
    assert d.reason == 'not in network.allow; ask for "new.org:8443"'
    assert decide_target(CFG, "metadata.google.internal", 80).reason == "metadata name"


def test_deny_without_port_covers_every_port():
    cfg = NetConfig(allow=(parse_rule("*.github.com:22", "a"), parse_rule("*.github.com", "a")),
                    deny=(parse_rule("uploads.github.com", "d"),))
    assert not decide_target(cfg, "uploads.github.com", 22).allow
    assert not decide_target(cfg, "uploads.github.com", 443).allow
    assert decide_target(cfg, "api.github.com", 22).allow


@pytest.mark.parametrize("addr,allow_private,allow", [
    ("8.8.8.8", (), True), ("127.0.0.2", (), False), ("127.0.0.2", ("127.0.0.0/8",), True),
    ("::ffff:127.0.0.2", ("127.0.0.0/8",), True), ("10.0.0.1", ("127.0.0.0/8",), False),
    ("169.254.169.254", ("10.0.0.0/8",), False), ("169.254.169.254", ("169.254.169.254",), True),
    ("fd00:ec2::254", (), False), ("64:ff9b::a00:1", ("10.0.0.0/8",), True),
    ("100.64.1.1", (), False), ("::1", ("127.0.0.0/8",), False), ("::1", ("::1",), True),
])
def test_check_address(addr, allow_private, allow):
    cfg = NetConfig.from_dict({"allow_private": list(allow_private)})
    assert check_address(cfg, ip_address(addr)).allow is allow


def test_check_address_reason_names_the_fix():
    d = check_address(NetConfig(), ip_address("10.0.0.1"))
    assert d.reason == 'address 10.0.0.1 is private; ask for network.allow_private "10.0.0.1/32"'
    assert check_address(CFG, ip_address("10.1.2.3"), 443).reason == 'network.deny[1] "10.1.2.0/24"'


@pytest.mark.parametrize("text,message", [
    ("*.example.com:44x", '"*.example.com:44x" is not host[:port]; write "*.example.com:443"'),
    ("example.com:0", '"example.com:0" is not host[:port]; write "example.com:443"'),
    ("example.com:65536", '"example.com:65536" is not host[:port]; write "example.com:443"'),
    ("https://pypi.org/simple", '"https://pypi.org/simple" is a URL, not host[:port]; write "pypi.org"'),
    ("*example.com", ('"*example.com": only a leading "*." is allowed; write "*.example.com" '
                      '(subdomains) and "example.com" (the domain itself)')),
    ("a.*.com", None), ("*", None), ("10.0.0.1/8", '"10.0.0.1/8" has host bits set; write "10.0.0.0/8"'),
    ("x@evil.com", None), ("exa mple.com", None), ("", None), ("*.1.2.3.4", None),
])
def test_parse_rule_errors_name_field_and_fix(text, message):
    with pytest.raises(PolicyError) as e:
        parse_rule(text, "network.allow[2]")
    assert e.value.field == "network.allow[2]"
    assert str(e.value).startswith("network.allow[2]: ")
    assert "\n" not in str(e.value)
    if message:
        assert e.value.message == message


def test_rule_forms():
    r = parse_rule("[fd00::/8]:443", "f")
    assert (r.kind, r.net, r.ports) == ("net", ip_network("fd00::/8"), (443,))
    r = parse_rule("::1", "f")
    assert (r.kind, r.net, r.ports) == ("net", ip_network("::1/128"), None)
    r = parse_rule("*.Example.COM.", "f")
    assert (r.kind, r.name) == ("suffix", "example.com")
    assert parse_rule(" pypi.org ", "f").name == "pypi.org"


def test_config_json_round_trip_and_unknown_keys():
    cfg = NetConfig.from_dict({
        "allow": ["pypi.org", "*.pythonhosted.org", "github.com:22"], "deny": ["x.pypi.org"],
        "allow_private": ["127.0.0.0/8", "::1"], "nameservers": ["127.0.0.1:5353", "::1"],
        "budget": {"bytes_out": 10, "bytes_in": None, "requests": 3}, "idle_timeout": 5})
    assert cfg.nameservers == (("127.0.0.1", 5353), ("::1", 53))
    assert cfg.budget == Budget(bytes_out=10, bytes_in=None, requests=3)
    assert NetConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(PolicyError, match=r"network\.alow: unknown key"):
        NetConfig.from_dict({"alow": []})
    with pytest.raises(PolicyError, match=r"network\.budget\.bytes: unknown key"):
        NetConfig.from_dict({"budget": {"bytes": 1}})
    with pytest.raises(PolicyError, match=r"network\.allow\[1\]"):
        NetConfig.from_dict({"allow": ["ok.com", "bad host"]})
    with pytest.raises(PolicyError, match=r"network\.nameservers\[0\]"):
        NetConfig.from_dict({"nameservers": ["dns.google"]})
    assert NetConfig() == NetConfig.from_json("{}")      # defaults: nothing allowed


# --- TLS ClientHello ---------------------------------------------------------------------

def client_hello(server_hostname: str | None) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_client_hello_sni_whole_and_byte_by_byte():
    data = client_hello("allowed.test")
    hello = parse_client_hello(data)
    assert hello == ClientHello(sni="allowed.test", ech=False, length=len(data))
    for i in range(len(data)):
        assert parse_client_hello(data[:i]) is NEED_MORE
    assert parse_client_hello(data + b"\x17\x03\x03trailing").sni == "allowed.test"


def test_client_hello_without_sni_and_split_records():
    assert parse_client_hello(client_hello("127.0.0.1")).sni is None   # IPs are not sent
    data = client_hello("split.test")
    body = data[5:]
    records = b"".join(b"\x16\x03\x01" + len(body[i:i + 7]).to_bytes(2, "big") + body[i:i + 7]
                       for i in range(0, len(body), 7))
    assert parse_client_hello(records).sni == "split.test"
    for i in range(0, len(records), 13):
        assert parse_client_hello(records[:i]) is NEED_MORE


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\n\r\n", b"\x17\x03\x03\x00\x05hello", b"\x16\x03\x01\x00\x00",
    b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", b"\x16\x02\x01\x00\x04\x01\x00\x00\x00",
    b"\x16\x03\x01\x00\x04\x01\xff\xff\xff",
])
def test_client_hello_malformed(data):
    with pytest.raises(TLSError):
        parse_client_hello(data)


def test_client_hello_fuzz_invariant():
    rnd = random.Random(7)
    base = client_hello("fuzz.example.com")
    for _ in range(3000):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 6)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        if rnd.random() < 0.3:
            b = b[:rnd.randrange(len(b))]
        try:
            r = parse_client_hello(bytes(b))
        except TLSError:
            continue
        assert r is NEED_MORE or isinstance(r, ClientHello)


# --- ProxyConnection -----------------------------------------------------------------------

def events_of(data: bytes, chunk: int | None = None) -> list:
    """Feed data (whole, or in chunks) and collect events until NEED_DATA or PAUSED."""
    conn = ProxyConnection()
    out: list = []
    pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
    for p in pieces:
        conn.receive_data(p)
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA or ev is PAUSED:
                break
            out.append(ev)
            if isinstance(ev, Closed):
                return out
    return out


def tr(data: bytes) -> list:
    """h11's test_io habit: the same events whole, byte by byte, and with trailing data."""
    whole = events_of(data)
    assert _merge(events_of(data, 1)) == _merge(whole)
    return whole


def _merge(evs: list) -> list:
    out: list = []
    for ev in evs:
        if isinstance(ev, RequestData) and out and isinstance(out[-1], RequestData):
            out[-1] = RequestData(out[-1].data + ev.data)
        else:
            out.append(ev)
    return out


def test_connect_request():
    evs = tr(b"CONNECT Allowed.Test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
    assert evs == [ConnectRequest("Allowed.Test", 443, ((b"host", b"allowed.test:443"),))]
    evs = tr(b"CONNECT [::1]:8443 HTTP/1.0\r\n\r\n")
    assert evs == [ConnectRequest("::1", 8443, ())]


def test_connect_with_trailing_tunnel_data():
    conn = ProxyConnection()
    conn.receive_data(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n\x16\x03\x01")
    assert isinstance(conn.next_event(), ConnectRequest)
    assert conn.next_event() is PAUSED
    conn.receive_data(b"\x00\x05")
    assert conn.tunnel_data() == b"\x16\x03\x01\x00\x05"
    assert conn.tunnel_data() == b""


def test_http_request_with_body_and_keep_alive():
    req = (b"POST http://allowed.test:8080/up?x=1 HTTP/1.1\r\nHost: allowed.test:8080\r\n"
           b"Content-Length: 5\r\nProxy-Connection: keep-alive\r\n\r\nhello")
    evs = tr(req)
    assert isinstance(evs[0], HttpRequest)
    assert (evs[0].method, evs[0].host, evs[0].port, evs[0].path) == (
        b"POST", "allowed.test", 8080, b"/up?x=1")
    assert _merge(evs[1:]) == [RequestData(b"hello"), RequestEnd()]
    conn = ProxyConnection()
    conn.receive_data(req + b"GET http://allowed.test:8080/2 HTTP/1.1\r\nHost: allowed.test:8080\r\n\r\n")
    while not isinstance(conn.next_event(), RequestEnd):
        pass
    assert conn.next_event() is PAUSED
    conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
    conn.send(h11.EndOfMessage())
    assert conn.keep_alive
    ev = conn.next_event()
    assert isinstance(ev, HttpRequest) and ev.path == b"/2"


def test_forward_request_is_origin_form_without_hop_by_hop():
    [req, *_] = events_of(b"GET http://allowed.test/a HTTP/1.1\r\nHost: ALLOWED.test\r\n"
                          b"Proxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Foo\r\n"
                          b"X-Foo: 1\r\nX-Bar: 2\r\n\r\n")
    out = forward_request(req)
    assert out.target == b"/a"
    names = [k for k, _ in out.headers]
    assert names == [b"host", b"x-bar", b"connection"]
    assert dict(out.headers)[b"host"] == b"ALLOWED.test"


@pytest.mark.parametrize("data,status,message", [
    (b"GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "use the proxy with absolute URLs"),
    (b"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "use CONNECT"),
    (b"GET ftp://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "only http://"),
    (b"GET http://allowed.test@evil.net/ HTTP/1.1\r\nHost: evil.net\r\n\r\n", 400, "userinfo"),
    (b"GET http://u:p@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "userinfo"),
    (b"GET http://allowed.test/ HTTP/1.1\r\nHost: evil.net\r\n\r\n", 403, "host header mismatch"),
    (b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test:81\r\n\r\n", 403,
     "host header mismatch"),
    (b"GET http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 403,
     "host header mismatch"),
    (b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.net\r\n\r\n", 400, ""),
    (b"CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "host:port"),
    (b"CONNECT allowed.test:99999 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "port"),
    (b"CONNECT ::1:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "brackets"),
    (b"CONNECT a.test:443 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 400, "body"),
    (b"GARBAGE\r\n\r\n", 400, "bad request"),
    (b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431, ""),
])
def test_protocol_errors(data, status, message):
    with pytest.raises(ProxyProtocolError) as e:
        events_of(data)
    assert e.value.status == status
    assert message in e.value.message
    with pytest.raises(ProxyProtocolError):
        events_of(data, 1)


def test_host_header_near_misses_that_match():
    for host in (b"allowed.test", b"ALLOWED.TEST.", b"allowed.test:80"):
        [req] = events_of(b"GET http://allowed.test/ HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")[:1]
        assert req.host == "allowed.test"
    [req, *_] = events_of(b"GET http://[::1]:8080/ HTTP/1.1\r\nHost: [0::1]:8080\r\n\r\n")
    assert (req.host, req.port) == ("::1", 8080)


def test_host_header_mismatch_carries_target():
    with pytest.raises(ProxyProtocolError) as e:
        events_of(b"GET http://Allowed.test/ HTTP/1.1\r\nHost: evil.net\r\n\r\n")
    assert (e.value.host, e.value.port) == ("Allowed.test", 80)


def test_closed_between_requests():
    conn = ProxyConnection()
    conn.receive_data(b"")
    assert isinstance(conn.next_event(), Closed)


def test_error_responses():
    r = deny_response('not in network.allow; ask for "x.test"')
    head, body = r.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b'\r\nX-Corral-Reason: not in network.allow; ask for "x.test"' in head
    assert body.count(b"\n") == 1 and body.endswith(b"\n")
    assert b"Content-Length: %d" % len(body) in head
    for status in (400, 502, 504):
        assert error_response(status, "x").startswith(b"HTTP/1.1 %d " % status)
    assert b"\r\nX-Corral-Reason: a?b\r\n" in error_response(502, "a\r\nb")[:200].replace(b"??", b"?")


def test_fuzz_invariant():
    """Any input gives events, NEED_DATA/PAUSED, or ProxyProtocolError: never another error."""
    rnd = random.Random(1234)
    seeds = [b"GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
             b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n",
             (b"POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
              b"\r\n5\r\nhello\r\n0\r\n\r\n")]
    for i in range(3000):
        if i % 3 == 0:
            data = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 200)))
        else:
            b = bytearray(rnd.choice(seeds))
            for _ in range(rnd.randint(1, 8)):
                op = rnd.random()
                pos = rnd.randrange(len(b) + 1)
                if op < 0.4 and b:
                    b[min(pos, len(b) - 1)] = rnd.choice(b"@:[]%/\\ \r\n\x00\xff.0x9aZ#?")
                elif op < 0.7:
                    b[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 5)))
                else:
                    del b[pos:pos + rnd.randint(1, 5)]
            data = bytes(b)
        chunk = rnd.choice([None, 1, 7])
        try:
            evs = events_of(data, chunk)
        except ProxyProtocolError:
            continue
        for ev in evs:
            assert isinstance(ev, (ConnectRequest, HttpRequest, RequestData, RequestEnd, Closed))
            if isinstance(ev, (ConnectRequest, HttpRequest)):
                decide_target(CFG, ev.host, ev.port)      # never raises either


def test_parse_host_and_parse_rule_fuzz_invariant():
    """Any text gives a canonical host or HostError; any rule text a Rule or PolicyError."""
    rnd = random.Random(99)
    alphabet = "aZ09.-_*:/@%[]\\ \t\u00df\u3002\uff0e\u00fc\u0301\u200dxn--0x" + "\U0001f600\ud7ff"
    for _ in range(4000):
        s = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30)))
        try:
            h = parse_host(s)
        except HostError:
            pass
        else:
            assert isinstance(h, (str, IPv4Address, IPv6Address))
            if isinstance(h, str):
                assert h.isascii() and h == h.lower() and not h.endswith(".")
                assert parse_host(h) == h                   # canonical is a fixed point
        try:
            parse_rule(s, "network.allow[0]")
        except PolicyError as e:
            assert "\n" not in str(e)
        decide_target(CFG, s, rnd.choice([0, 80, 443, 70000]))
