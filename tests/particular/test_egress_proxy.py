"""The egress proxy with real parts: a real dnsmasq on loopback, real HTTP and HTTPS servers
on a random 127.x.y.0/24, the proxy as its own process, curl and urllib as clients.

Traffic goes only to 127.0.0.0/8, or to a network namespace a test creates (the metadata
test). Denials of non-loopback addresses are only tested where the refused address is
local (inside that namespace), so a broken proxy still sends nothing off the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import netfix
import pytest
from netfix import OTHER, PRIV, SRV, queried

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("dnsmasq")
                                or not shutil.which("curl"),
                                reason="needs root (ports 80/443 on loopback), dnsmasq, curl")

EVENT_KEYS = {"kind", "host", "port", "decision", "reason", "bytes_in", "bytes_out"}


class Proxy(netfix.Proxy):
    """The proxy process; its events are checked for the documented shape as they are read."""

    def events(self, wait_for: int = 0, timeout: float = 5.0) -> list[dict]:
        evs = super().events(wait_for, timeout)
        for e in evs:
            assert set(e) == EVENT_KEYS, e
            assert e["kind"] == "net" and e["decision"] in ("allow", "deny")
            assert isinstance(e["port"], int) and isinstance(e["bytes_in"], int)
            assert isinstance(e["bytes_out"], int) and isinstance(e["reason"], str)
        return evs


@pytest.fixture
def proxy(tmp_path, dnsmasq, servers):
    made: list[Proxy] = []

    def start(**cfg) -> Proxy:
        cfg.setdefault("nameservers", [f"127.0.0.1:{dnsmasq['port']}"])
        p = Proxy(cfg, tmp_path)
        made.append(p)
        return p

    yield start
    for p in made:
        p.stop()


def curl(proxy: Proxy, url: str, *args: str) -> tuple[int, dict, bytes]:
    r = subprocess.run(["curl", "-s", "-S", "-i", "--max-time", "10", "-x", proxy.url, *args, url],
                       capture_output=True, timeout=20, check=False)
    return parse_response(r.stdout)


def parse_response(raw: bytes) -> tuple[int, dict, bytes]:
    # skip "HTTP/1.1 200 Connection established" from curl's CONNECT and any 1xx
    while True:
        if not raw:
            return 0, {}, b""
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        if status == 200 and b"established" in lines[0].lower() or 100 <= status < 200:
            raw = body
            continue
        headers = {k.strip().lower().decode(): v.strip().decode()
                   for k, _, v in (x.partition(b":") for x in lines[1:])}
        return status, headers, body


def raw(proxy: Proxy, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            out += chunk
        return out


# --- tests ---------------------------------------------------------------------------------

def test_allowed_name_curl_and_urllib(proxy):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV])
    status, _, body = curl(p, "http://allowed.test/hello")
    assert (status, body) == (200, f"hello from {SRV}\n".encode())
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": p.url}))
    with opener.open("http://Allowed.Test./host", timeout=10) as r:
        assert r.status == 200
        assert r.read().lower().rstrip(b".") == b"allowed.test"
    status, _, body = curl(p, "http://allowed.test/chunked/100000")
    assert (status, body) == (200, b"y" * 100000)
    evs = p.events(3)
    assert [e["decision"] for e in evs] == ["allow"] * 3
    assert evs[0]["host"] == "allowed.test" and evs[0]["port"] == 80
    assert evs[0]["reason"] == 'network.allow[0] "allowed.test"'
    assert evs[2]["bytes_in"] > 100000 and evs[2]["bytes_out"] > 0


def test_https_through_connect(proxy, servers):
    p = proxy(allow=["allowed.test", "allowed.test:8443"], allow_private=[PRIV])
    for url in ("https://allowed.test/hello", "https://allowed.test:8443/hello"):
        status, _, body = curl(p, url, "--cacert", str(servers["cert"]))
        assert (status, body) == (200, f"hello from {SRV}\n".encode())
    ctx = ssl.create_default_context(cafile=str(servers["cert"]))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": p.url}),
                                         urllib.request.HTTPSHandler(context=ctx))
    with opener.open("https://allowed.test/hello", timeout=10) as r:
        assert r.read() == f"hello from {SRV}\n".encode()
    evs = p.events(3)
    assert [(e["decision"], e["port"]) for e in evs] == [("allow", 443), ("allow", 8443),
                                                         ("allow", 443)]
    assert all(e["bytes_in"] > 1000 for e in evs)


def test_denied_name_gets_403_and_no_dns_query(proxy, dnsmasq):
    p = proxy(allow=["allowed.test", "*.allowed.test"], deny=["bad.allowed.test"],
              allow_private=[PRIV])
    status, headers, body = curl(p, "http://denied.test/hello")
    assert status == 403
    assert headers["x-corral-reason"] == 'not in network.allow; ask for "denied.test"'
    assert body.count(b"\n") == 1 and b"denied.test" in body
    status, headers, _ = curl(p, "https://denied.test/", "-k")
    assert status == 403
    status, headers, _ = curl(p, "http://bad.allowed.test/")
    assert (status, headers["x-corral-reason"]) == (403, 'network.deny[0] "bad.allowed.test"')
    status, headers, _ = curl(p, "http://metadata.google.internal/computeMetadata/v1/")
    assert (status, headers["x-corral-reason"]) == (403, "metadata name")
    assert curl(p, "http://ok.allowed.test/hello")[0] == 200
    assert queried(dnsmasq, "ok.allowed.test")            # the log works ...
    for name in ("denied.test", "bad.allowed.test", "metadata.google.internal"):
        assert not queried(dnsmasq, name), name           # ... and holds no denied name
    evs = p.events(5)
    assert [(e["host"], e["decision"]) for e in evs] == [
        ("denied.test", "deny"), ("denied.test", "deny"), ("bad.allowed.test", "deny"),
        ("metadata.google.internal", "deny"), ("ok.allowed.test", "allow")]
    assert evs[1]["port"] == 443


def test_allowed_name_with_private_address_is_refused(proxy, servers):
    p = proxy(allow=["private.test"])
    status, headers, _ = curl(p, "http://private.test/hello")
    assert status == 403
    assert headers["x-corral-reason"] == (
        f'address {SRV} is loopback; ask for network.allow_private "{SRV}/32"')
    assert p.events(1)[0]["decision"] == "deny"


def spellings(ip: str) -> list[str]:
    """Every way to write an IPv4 address that some parser accepts."""
    a, b, c, d = (int(x) for x in ip.split("."))
    n = int.from_bytes(bytes((a, b, c, d)), "big")
    return [ip, f"0{a:o}.0{b:o}.0{c:o}.0{d:o}", f"{a:#x}.{b:#x}.{c:#x}.{d:#x}", str(n), f"{n:#x}",
            f"{a}.{b}.{c * 256 + d}", f"{a}.{b * 65536 + c * 256 + d}", f"[::ffff:{ip}]",
            f"[::ffff:{n >> 16:x}:{n & 0xffff:x}]", ip + "."]


@pytest.mark.parametrize("spelling", [*spellings(SRV), "[::1]", "0", "localhost"])
def test_ip_literals_refused_in_every_spelling(proxy, spelling):
    p = proxy(allow=["allowed.test"], allow_private=["127.0.0.0/8", "::1"])
    resp = raw(p, f"GET http://{spelling}/hello HTTP/1.1\r\nHost: {spelling}\r\n\r\n".encode())
    status, headers, _ = parse_response(resp)
    assert status == 403, resp
    assert headers["x-corral-reason"]
    resp = raw(p, f"CONNECT {spelling}:443 HTTP/1.1\r\nHost: {spelling}:443\r\n\r\n".encode())
    assert parse_response(resp)[0] == 403
    evs = p.events(2)
    canonical = {"[::1]": "::1", "0": "0.0.0.0", "localhost": "localhost"}.get(spelling, SRV)
    assert [e["host"] for e in evs] == [canonical, canonical]


def test_ip_literal_named_by_a_rule(proxy):
    p = proxy(allow=[f"{SRV}:80"], allow_private=[PRIV])
    for spelling in spellings(SRV):
        resp = raw(p, f"GET http://{spelling}/hello HTTP/1.1\r\nHost: {spelling}\r\n"
                      f"Connection: close\r\n\r\n".encode())
        assert parse_response(resp)[:1] == (200,), resp
    assert [e["host"] for e in p.events(10)] == [SRV] * 10


def test_connect_sni_must_match(proxy, servers):
    p = proxy(allow=["allowed.test", "allowed.test:8443"], allow_private=[PRIV])
    for port, sni in ((443, "evil.test"), (8443, "evil.test"), (443, None)):
        with socket.create_connection(("127.0.0.1", p.port), timeout=5) as s:
            s.sendall(f"CONNECT allowed.test:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            with pytest.raises((ssl.SSLError, OSError)):
                ctx.wrap_socket(s, server_hostname=sni).close()
    # plain bytes on 443 are not a tunnel
    resp = raw(p, b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n")
    assert resp == b"HTTP/1.1 200 Connection Established\r\n\r\n"
    evs = p.events(4)
    assert [e["reason"] for e in evs[:3]] == ["sni mismatch", "sni mismatch", "no sni"]
    assert evs[3]["reason"].startswith("tls:")
    assert all(e["decision"] == "deny" and e["bytes_out"] == 0 for e in evs)


def test_plain_tunnel_on_other_port(proxy, servers):
    p = proxy(allow=["allowed.test:8443", "allowed.test:80"], allow_private=[PRIV])
    resp = raw(p, b"CONNECT allowed.test:80 HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /hello HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
    assert resp.endswith(f"hello from {SRV}\n".encode())
    assert p.events(1)[0]["decision"] == "allow"


def test_host_header_mismatch(proxy):
    p = proxy(allow=["allowed.test", "denied.test"], allow_private=[PRIV])
    resp = raw(p, b"GET http://allowed.test/hello HTTP/1.1\r\nHost: denied.test\r\n\r\n")
    status, headers, _ = parse_response(resp)
    assert (status, headers["x-corral-reason"]) == (403, "host header mismatch")
    assert p.events(1) == [{"kind": "net", "host": "allowed.test", "port": 80, "decision": "deny",
                            "reason": "host header mismatch", "bytes_in": 0, "bytes_out": 0}]
    resp = raw(p, b"GET /hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
    status, headers, body = parse_response(resp)
    assert status == 400 and b"absolute URLs" in body


def test_budget_requests(proxy):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV], budget={"requests": 2})
    assert [curl(p, "http://allowed.test/hello")[0] for _ in range(3)] == [200, 200, 403]
    status, headers, _ = curl(p, "http://allowed.test/hello")
    assert (status, headers["x-corral-reason"]) == (403, "budget: requests")
    evs = p.events(4)
    assert [e["reason"] for e in evs[2:]] == ["budget: requests"] * 2


@pytest.mark.parametrize("path,limit", [("/bytes/300000", 100_000),          # through h11
                                        ("/chunked/300000", 100_000),
                                        ("/bytes/3000000", 1_500_000)])      # spliced
def test_budget_bytes_in(proxy, path, limit):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV],
              budget={"bytes_in": limit})
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", "-x", p.url,
                        f"http://allowed.test{path}"], capture_output=True, timeout=20, check=False)
    assert r.returncode != 0                     # the transfer was cut
    assert int(r.stdout) < limit
    [e] = p.events(1)
    assert (e["decision"], e["reason"]) == ("deny", "budget: bytes_in")
    assert e["bytes_in"] == limit
    assert curl(p, "http://allowed.test/hello")[1]["x-corral-reason"] == "budget: bytes_in"


def test_budget_bytes_in_tunnel(proxy, servers):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV],
              budget={"bytes_in": 200_000})
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "--cacert", str(servers["cert"]),
                        "-x", p.url, "https://allowed.test/bytes/1000000"],
                       capture_output=True, timeout=20, check=False)
    assert r.returncode != 0
    [e] = p.events(1)
    assert (e["decision"], e["reason"], e["bytes_in"]) == ("deny", "budget: bytes_in", 200_000)


def test_budget_bytes_out(proxy, servers):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV],
              budget={"bytes_out": 20_000})
    before = list(servers["http"].received)
    r = subprocess.run(["curl", "-s", "-x", p.url, "--data-binary", "@-",
                        "http://allowed.test/echo"], input=b"z" * 200_000,
                       capture_output=True, timeout=20, check=False)
    assert b"got 200000" not in r.stdout
    [e] = p.events(1)
    assert (e["decision"], e["reason"], e["bytes_out"]) == ("deny", "budget: bytes_out", 20_000)
    time.sleep(0.2)
    assert all(n < 20_000 for n in servers["http"].received[len(before):])


def test_resolves_once_and_connects_to_the_checked_address(proxy, servers):
    """A resolver that answers SRV first and OTHER afterwards: the proxy must ask once and
    connect to SRV (DNS rebinding between check and connect is impossible)."""
    import dns.message
    import dns.rrset

    counts: dict[tuple[str, str], int] = {}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    stop = threading.Event()

    def run():
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                data, addr = sock.recvfrom(4096)
            except TimeoutError:
                continue
            q = dns.message.from_wire(data)
            qname, qtype = q.question[0].name.to_text(), dns.rdatatype.to_text(q.question[0].rdtype)
            n = counts[(qname, qtype)] = counts.get((qname, qtype), 0) + 1
            r = dns.message.make_response(q)
            if qtype == "A":
                r.answer.append(dns.rrset.from_text(qname, 0, "IN", "A",
                                                    SRV if n == 1 else OTHER))
            sock.sendto(r.to_wire(), addr)

    import dns.rdatatype
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        p = proxy(allow=["pin.test"], allow_private=[PRIV],
                  nameservers=[f"127.0.0.1:{sock.getsockname()[1]}"])
        status, _, body = curl(p, "http://pin.test/hello")
        assert (status, body) == (200, f"hello from {SRV}\n".encode())
        assert counts[("pin.test.", "A")] == 1
        assert counts.get(("pin.test.", "AAAA"), 0) <= 1
    finally:
        stop.set()
        t.join()
        sock.close()


def test_slowloris_is_cut(proxy):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV], header_timeout=1.0)
    # the client would trickle for 20 s and wait 30 s: being cut well before that is the
    # 1 s header timeout, however slow the machine (bounds from the work, not the clock)
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        start = time.monotonic()
        s.sendall(b"GET http://allowed.test/hello HTTP/1.1\r\n")
        got = b""
        try:
            for _ in range(200):
                s.sendall(b"X")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = s.recv(4096)
        elapsed = time.monotonic() - start
    assert got.startswith(b"HTTP/1.1 408") or got == b""
    assert elapsed < 15
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:  # silent client
        start = time.monotonic()
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - start < 15


def test_idle_tunnel_is_cut(proxy):
    p = proxy(allow=["allowed.test:80"], allow_private=[PRIV], idle_timeout=1.0)
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        s.sendall(b"CONNECT allowed.test:80 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert s.recv(4096) == b""       # cut after 1 s idle, long before the 30 s wait
        assert 0.5 < time.monotonic() - start < 15
    assert p.events(1)[0]["decision"] == "allow"


def test_300_concurrent_connections(proxy):
    import asyncio

    p = proxy(allow=["allowed.test"], allow_private=[PRIV])

    async def one(i: int) -> bytes:
        r, w = await asyncio.open_connection("127.0.0.1", p.port)
        w.write(b"GET http://allowed.test/slow HTTP/1.1\r\nHost: allowed.test\r\n"
                b"Connection: close\r\n\r\n")
        data = await r.read()
        w.close()
        return data

    async def main():
        return await asyncio.gather(*(one(i) for i in range(320)))

    results = asyncio.run(main())
    assert all(r.startswith(b"HTTP/1.1 200") and r.endswith(b"slow") for r in results)
    evs = p.events(320)
    assert len(evs) == 320 and all(e["decision"] == "allow" for e in evs)


def test_connections_queued_while_the_proxy_is_stopped_are_all_served(proxy):
    """The listener stays registered with the proxy's loop and each wake-up accepts a batch
    (server.ACCEPT_BATCH): a backlog of more than one batch, every request already sent,
    is served whole once the proxy runs again; and the same target asked for over and
    over, allowed and denied, gets the same answer each time (the decisions it keeps)."""
    from corral.egress.server import ACCEPT_BATCH

    p = proxy(allow=["allowed.test"], allow_private=[PRIV])
    n = 2 * ACCEPT_BATCH + 20
    os.kill(p.proc.pid, signal.SIGSTOP)
    try:
        conns = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", p.port), timeout=30)
            host = b"allowed.test" if i % 2 == 0 else b"denied.test"
            s.sendall(b"GET http://" + host + b"/hello HTTP/1.1\r\nHost: " + host +
                      b"\r\nConnection: close\r\n\r\n")
            conns.append(s)
    finally:
        os.kill(p.proc.pid, signal.SIGCONT)
    for i, s in enumerate(conns):
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        s.close()
        assert got.startswith(b"HTTP/1.1 200" if i % 2 == 0 else b"HTTP/1.1 403"), (i, got)
    evs = p.events(n)
    assert sorted((e["host"], e["decision"]) for e in evs) == sorted(
        [("allowed.test", "allow")] * (n - n // 2) + [("denied.test", "deny")] * (n // 2))


def test_connection_cap(proxy):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV], max_connections=20)
    held = [socket.create_connection(("127.0.0.1", p.port), timeout=5) for _ in range(20)]
    try:
        time.sleep(0.2)
        resp = raw(p, b"GET http://allowed.test/hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        assert resp.startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert curl(p, "http://allowed.test/hello")[0] == 200


def test_a_low_fd_limit_lowers_the_cap_instead_of_stalling(tmp_path, dnsmasq, servers):
    """With fewer fds than its cap needs (6 a connection plus 256), the proxy lowers its cap
    to what fits and says so, so the connections past it get a 503 at once instead of
    sitting in the accept queue while accept() fails with EMFILE."""
    from corral.egress.server import connections_within, nofile_for

    assert connections_within(nofile_for(512)) == 512
    cfg = {"allow": ["allowed.test"], "allow_private": [PRIV],
           "nameservers": [f"127.0.0.1:{dnsmasq['port']}"]}
    p = Proxy(cfg, tmp_path, nofile=nofile_for(20))
    held = []
    try:
        held = [socket.create_connection(("127.0.0.1", p.port), timeout=5) for _ in range(20)]
        resp = raw(p, b"GET http://allowed.test/hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
    finally:
        for s in held:
            s.close()
        p.stop()
    assert resp.startswith(b"HTTP/1.1 503"), resp
    assert f"RLIMIT_NOFILE is {nofile_for(20)}: at most 20 connections at once (not 512)" \
        in p.stderr, p.stderr


def test_too_few_fds_for_one_connection_is_an_error(tmp_path):
    import resource

    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"allow": ["allowed.test"]}))
    r = subprocess.run([sys.executable, "-m", "corral.egress", "--config", str(cfg),
                        "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200)))
    assert r.returncode == 2
    assert "RLIMIT_NOFILE is 200, too low to serve a single connection; raise it to 3328" \
        in r.stderr, r.stderr


def test_hosts_file_parsed_strictly():
    from ipaddress import ip_address

    from corral.egress import hostsfile

    table = hostsfile.parse(b"""# comment
127.0.0.1\tlocalhost   # the usual
::1 localhost ip6-localhost
10.0.0.7 Build.Internal. build
10.0.0.8 build
::ffff:10.0.0.9 mapped.test
fe80::1%eth0 zoned.test
127.1 short.test
10.0.0.300 bad.test
10.0.0.5 ok.test bad@name
10.0.0.6 1.2.3.4
10.0.0.4 caf\xc3\xa9.test
10.0.0.3
notanaddress name.test
""")
    a = ip_address
    assert table == {"localhost": (a("127.0.0.1"), a("::1")), "ip6-localhost": (a("::1"),),
                     "build.internal": (a("10.0.0.7"),),
                     "build": (a("10.0.0.7"), a("10.0.0.8")),
                     "mapped.test": (a("10.0.0.9"),)}
    with pytest.raises(ValueError):
        hostsfile.parse(b"#" * (hostsfile.MAX_BYTES + 1))


def test_names_in_the_hosts_file_resolve_before_dns(proxy, dnsmasq, servers, tmp_path):
    """The proxy reads its hosts file (the host's /etc/hosts in a sandbox) once at start and
    resolves names there before DNS: a name the file maps is never asked of the resolver,
    and what it maps to still needs allow_private."""
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{SRV} fromfile.test allowed.test\n")
    cfg = {"allow": ["fromfile.test", "allowed.test"],
           "nameservers": [f"127.0.0.1:{dnsmasq['port']}"]}
    p = Proxy({**cfg, "allow_private": [PRIV]}, tmp_path, hosts=hosts)
    q = Proxy(cfg, tmp_path, hosts=hosts)
    try:
        status, _, body = curl(p, "http://fromfile.test/host")
        refused = curl(q, "http://fromfile.test/")
    finally:
        p.stop()
        q.stop()
    assert (status, body) == (200, b"fromfile.test"), (status, body)
    assert refused[0] == 403 and f"address {SRV} is loopback" in refused[1]["x-corral-reason"]
    assert not queried(dnsmasq, "fromfile.test")


def test_an_oversized_hosts_file_is_not_used(dnsmasq, servers, tmp_path):
    from corral.egress import hostsfile

    hosts = tmp_path / "hosts"
    hosts.write_text(f"{SRV} toobig.test\n" + "#" * hostsfile.MAX_BYTES)
    p = Proxy({"allow": ["toobig.test"], "allow_private": [PRIV],
               "nameservers": [f"127.0.0.1:{dnsmasq['port']}"]}, tmp_path, hosts=hosts)
    try:
        status = curl(p, "http://toobig.test/")[0]
    finally:
        p.stop()
    assert status == 502 and queried(dnsmasq, "toobig.test")
    assert f"{hosts} not used: larger than {hostsfile.MAX_BYTES} bytes" in p.stderr


def test_listen_fd_events_fd_and_exit(dnsmasq, servers):
    """The supervisor's way: inherited listening socket, config on a pipe, events on a pipe;
    the proxy exits when the events pipe's reader goes away, and on SIGTERM."""
    for how in ("close-events", "sigterm"):
        proc, port, events = start_with_fds({
            "allow": ["allowed.test"], "allow_private": [PRIV],
            "nameservers": [f"127.0.0.1:{dnsmasq['port']}"]})
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET http://allowed.test/hello HTTP/1.1\r\nHost: allowed.test\r\n"
                          b"Connection: close\r\n\r\n")
                assert s.recv(65536).startswith(b"HTTP/1.1 200")
            assert json.loads(events.readline())["decision"] == "allow"
            if how == "sigterm":
                proc.send_signal(signal.SIGTERM)
            else:
                events.close()
            assert proc.wait(5) == 0
        finally:
            events.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()


METADATA_HELPER = textwrap.dedent('''
    import json, socket, subprocess, sys, threading, time, http.server, urllib.request
    import dns.message, dns.rrset

    def sh(*a):
        subprocess.run(a, check=True)

    sh("ip", "link", "set", "lo", "up")
    sh("ip", "addr", "add", "169.254.169.254/32", "dev", "lo")
    sh("ip", "addr", "add", "93.184.216.34/32", "dev", "lo")     # a "public" address, local here
    hits = []

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            hits.append((self.server.server_address[0], self.path))
            body = b"secret-token" if self.server.server_address[0].startswith("169") else b"pub"
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)

    for addr in ("169.254.169.254", "93.184.216.34"):
        s = http.server.ThreadingHTTPServer((addr, 80), H)
        threading.Thread(target=s.serve_forever, daemon=True).start()

    dns_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns_sock.bind(("127.0.0.1", 53))
    answers = {"meta.test.": "169.254.169.254", "pub.test.": "93.184.216.34"}
    def dns_loop():
        while True:
            data, addr = dns_sock.recvfrom(4096)
            q = dns.message.from_wire(data); r = dns.message.make_response(q)
            name = q.question[0].name.to_text()
            if q.question[0].rdtype == 1 and name in answers:
                r.answer.append(dns.rrset.from_text(name, 0, "IN", "A", answers[name]))
            dns_sock.sendto(r.to_wire(), addr)
    threading.Thread(target=dns_loop, daemon=True).start()

    cfg = {"allow": ["meta.test", "pub.test", "metadata.google.internal"],
           "nameservers": ["127.0.0.1:53"]}
    open(sys.argv[1], "w").write(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "corral.egress", "--config", sys.argv[1],
                             "--listen", "127.0.0.1:3128", "--events", sys.argv[2]],
                            stderr=subprocess.PIPE, text=True)
    proc.stderr.readline()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(
        {"http": "http://127.0.0.1:3128"}))
    out = {}
    for url in ("http://169.254.169.254/latest/meta-data/", "http://2852039166/latest/",
                "http://[::ffff:169.254.169.254]/", "http://meta.test/latest/meta-data/",
                "http://metadata.google.internal/computeMetadata/v1/", "http://pub.test/"):
        try:
            with opener.open(url, timeout=5) as r:
                out[url] = [r.status, r.read().decode()]
        except urllib.error.HTTPError as e:
            out[url] = [e.code, e.headers.get("X-Corral-Reason")]
    proc.terminate(); proc.wait(5)
    out["hits"] = hits
    print(json.dumps(out))
''')


@pytest.mark.skipif(not shutil.which("unshare") or not shutil.which("ip"),
                    reason="needs unshare and ip")
def test_metadata_refused_in_a_private_netns(tmp_path):
    """169.254.169.254 is a local address inside a network namespace made for this test, so
    a broken proxy would reach the fake metadata server there, never a real one."""
    helper = tmp_path / "helper.py"
    helper.write_text(METADATA_HELPER)
    r = subprocess.run(["unshare", "--net", "--", sys.executable, str(helper),
                        str(tmp_path / "cfg.json"), str(tmp_path / "ev.jsonl")],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["http://169.254.169.254/latest/meta-data/"][0] == 403
    assert out["http://2852039166/latest/"][0] == 403
    assert out["http://[::ffff:169.254.169.254]/"][0] == 403
    assert out["http://meta.test/latest/meta-data/"] == [
        403, ('address 169.254.169.254 is metadata; ask for network.allow_private '
              '"169.254.169.254/32"')]
    assert out["http://metadata.google.internal/computeMetadata/v1/"] == [403, "metadata name"]
    assert out["http://pub.test/"] == [200, "pub"]           # public: no allow_private needed
    assert out["hits"] == [["93.184.216.34", "/"]]


def test_wildcard_subdomains_share_one_budget(proxy):
    p = proxy(allow=["*.allowed.test"], allow_private=[PRIV], budget={"requests": 2})
    codes = [curl(p, f"http://s{i}.allowed.test/hello")[0] for i in range(3)]
    assert codes == [200, 200, 403]
    assert [e["host"] for e in p.events(3)] == [f"s{i}.allowed.test" for i in range(3)]


def test_large_post_head_and_keep_alive(proxy, servers):
    p = proxy(allow=["allowed.test"], allow_private=[PRIV])
    r = subprocess.run(["curl", "-s", "-x", p.url, "--data-binary", "@-",
                        "http://allowed.test/echo"], input=b"z" * 3_000_000,
                       capture_output=True, timeout=20, check=False)
    assert r.stdout == b"got 3000000\n"                    # curl sends Expect: 100-continue
    r = subprocess.run(["curl", "-s", "-x", p.url, "http://allowed.test/bytes/3000000"],
                       capture_output=True, timeout=20, check=False)   # spliced body
    assert r.stdout == b"x" * 3_000_000
    status, headers, body = curl(p, "http://allowed.test/bytes/5000", "-I")
    assert (status, headers["content-length"], body) == (200, "5000", b"")
    with socket.create_connection(("127.0.0.1", p.port), timeout=5) as s:  # two on one
        req = b"GET http://allowed.test/hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
        replies = []
        for _ in range(2):
            s.sendall(req)
            got = b""
            while not got.endswith(f"hello from {SRV}\n".encode()):
                got += s.recv(65536)
            replies.append(got)
        first, second = replies
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
    assert [e["decision"] for e in p.events(5)] == ["allow"] * 5


def start_with_fds(cfg: dict, preexec: list[str] | None = None):
    """The supervisor's launch: config on a pipe, inherited listening socket, events pipe."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    cfg_r, cfg_w = os.pipe()
    ev_r, ev_w = os.pipe()
    os.write(cfg_w, json.dumps(cfg).encode())
    os.close(cfg_w)
    proc = subprocess.Popen(
        [*(preexec or []), sys.executable, "-m", "corral.egress", "--config-fd", str(cfg_r),
         "--listen-fd", str(lsock.fileno()), "--events-fd", str(ev_w)],
        pass_fds=(cfg_r, ev_w, lsock.fileno()), stderr=subprocess.DEVNULL)
    os.close(cfg_r)
    os.close(ev_w)
    port = lsock.getsockname()[1]
    lsock.close()
    return proc, port, os.fdopen(ev_r, "rb")


def test_sigterm_ends_open_tunnels_with_their_events(dnsmasq, servers):
    proc, port, events = start_with_fds({
        "allow": ["allowed.test"], "allow_private": [PRIV],
        "nameservers": [f"127.0.0.1:{dnsmasq['port']}"]})
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"CONNECT allowed.test:80 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
            got = b""
            while not got.endswith(f"hello from {SRV}\n".encode()):
                got += s.recv(4096)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(5) == 0
            assert s.recv(4096) == b""
        e = json.loads(events.readline())
        assert (e["decision"], e["port"]) == ("allow", 80)
        assert e["bytes_in"] == len(got) and e["bytes_out"] > 0
    finally:
        events.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv")
def test_runs_unprivileged(dnsmasq, servers):
    """The proxy needs no privilege: as nobody, with only the fds it is given."""
    proc, port, events = start_with_fds(
        {"allow": ["allowed.test"], "allow_private": [PRIV],
         "nameservers": [f"127.0.0.1:{dnsmasq['port']}"]},
        preexec=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET http://allowed.test/hello HTTP/1.1\r\nHost: allowed.test\r\n"
                      b"Connection: close\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
        assert json.loads(events.readline())["decision"] == "allow"
    finally:
        events.close()
        proc.terminate()
        proc.wait(5)


def test_boot_preloads_tls_termination_only_for_grants():
    """The proxy loads cryptography (~9 MB a proxy) only when its config has grants; it
    peeks at the config without moving the offset the proxy reads it from."""
    from corral.backends.host.launch import config_fd
    from corral.egress import boot

    for cfg, want in (({"allow": ["a.test"]}, False),
                      ({"allow": ["a.test"], "secrets": [{"name": "X"}]}, True)):
        fd = config_fd(json.dumps(cfg))
        try:
            assert boot.has_grants(["--config-fd", str(fd), "--listen-fd", "3"]) is want
            assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        finally:
            os.close(fd)
    assert boot.has_grants(["--config-fd", "999999"]) is True   # unreadable: load it all
    code = ("import sys, corral.egress.boot as b; b.preload(False); "
            "print('cryptography' in sys.modules)")
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                       check=True)
    assert r.stdout.strip() == "False"
