"""network.mode = "allow" on the microvm tier, with real QEMU guests (TCG here, restored
from the warm snapshot), the real egress proxy, a real dnsmasq and real HTTP(S) servers on
127.0.0.0/8 (netfix.py).

The shared suite (tests/tiers/test_network.py) runs its clients with curl on the host's
root; the microvm tier boots an image (never the host's root) and the suite's image has
python3 and no curl, so this is the microvm subset of that suite, with Python's urllib
inside: allowed and denied names, the deny reason, no DNS query for a denied name, the
events, HTTPS through CONNECT, a secret grant over HTTPS (the run's CA inside), the request
budget, and network none. And what is particular to this tier's path: the guest has no
network device, and a raw TCP connect, UDP, ICMP and DNS from it reach nothing on the host
(listeners of the test's own, the test's dnsmasq) but the proxy."""

import json
import select
import socket

import pytest
from conftest import net_events
from netfix import PRIV, SRV, TOKEN, free_port, grant_policy, queried

import corral

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

PY = "python3"


def allow(name, dns, hosts, **network):
    return {"isolation": "microvm", "image": name,
            "network": {"mode": "allow", "allow": hosts, "allow_private": [PRIV],
                        "nameservers": [f"127.0.0.1:{dns['port']}"], **network},
            "limits": {"timeout": "60s"}}


GET = """
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        r = urllib.request.urlopen(url, timeout=20)
        print(r.status, r.read().decode().strip())
    except urllib.error.HTTPError as e:
        print(e.code, e.headers.get("x-corral-reason"))
    except urllib.error.URLError as e:
        print("failed", type(e.reason).__name__)
"""

ESCAPE = """
import json, os, socket, sys
host_tcp, host_udp, dns_port, srv = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = {}
def tcp(addr):
    try:
        socket.create_connection(addr, timeout=3).close(); return "connected"
    except OSError as e:
        return type(e).__name__
out["tcp_host_loopback"] = tcp(("127.0.0.1", host_tcp))
out["tcp_srv"] = tcp((srv, 80))
out["tcp_slirp_host"] = tcp(("10.0.2.2", host_tcp))
def udp(addr, data):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(data, addr); return "sent"
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
out["udp_host_loopback"] = udp(("127.0.0.1", host_udp), b"escape")
out["udp_srv"] = udp((srv, host_udp), b"escape")
# a DNS query for a name the proxy never resolves, straight at the test's dnsmasq's port
q = bytes.fromhex("abcd01000001000000000000") + b"\\x06direct\\x04test\\x00\\x00\\x01\\x00\\x01"
out["dns_to_dnsmasq"] = udp(("127.0.0.1", dns_port), q)
out["dns_to_srv"] = udp((srv, 53), q)
out["udp_off_box"] = udp(("10.0.2.3", 53), q)
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    s.sendto(b"\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00", ("10.0.2.2", 0)); out["icmp_off_box"] = "sent"
except OSError as e:
    out["icmp_off_box"] = type(e).__name__
try:
    socket.getaddrinfo("allowed.test", 80); out["resolve"] = "resolved"
except OSError:
    out["resolve"] = "noresolve"
for name, args in (("icmp_dgram", (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)),
                   ("icmp_raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))):
    try:
        s = socket.socket(*args)
        s.sendto(b"\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00", (srv, 0)); out[name] = "sent"
    except OSError as e:
        out[name] = type(e).__name__
out["net"] = sorted(os.listdir("/sys/class/net"))
out["routes"] = open("/proc/net/route").read().splitlines()[1:]
out["proxy"] = os.environ.get("HTTP_PROXY")
print(json.dumps(out))
"""


def test_allow_reaches_the_proxy_and_nothing_else(vm_image, dnsmasq, servers):
    name = vm_image
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    try:
        with corral.Sandbox(allow(name, dnsmasq, ["allowed.test"])) as sb:
            r = sb.exec([PY, "-c", GET, "http://allowed.test/", "http://denied.test/",
                         "https://allowed.test/"])
            assert r.verdict == "ok", r
            ok, denied, https = r.stdout.splitlines()
            assert ok == f"200 hello from {SRV}", r.stdout
            assert https == "failed SSLCertVerificationError", r.stdout
            assert denied == '403 not in network.allow; ask for "denied.test"', r.stdout
            # https: the proxy's CONNECT tunnel, the test server's own certificate (not
            # trusted inside: the handshake fails past the proxy, which let it through)
            ev = net_events(r)
            assert [(e["host"], e["port"], e["decision"]) for e in ev] == [
                ("allowed.test", 80, "allow"), ("denied.test", 80, "deny"),
                ("allowed.test", 443, "allow")], ev
            assert ev[0]["bytes_in"] > 0 and ev[0]["bytes_out"] > 0, ev
            assert not queried(dnsmasq, "denied.test")
            # clients that ignore the proxy reach nothing on the host
            r = sb.exec([PY, "-c", ESCAPE, str(tcp.getsockname()[1]),
                         str(udp.getsockname()[1]), str(dnsmasq["port"]), SRV])
            assert r.verdict == "ok", r
            out = json.loads(r.stdout)
            assert out["net"] == ["lo"] and out["routes"] == [], out
            assert out["proxy"] == "http://127.0.0.1:3128", out
            # 127.0.0.0/8 is the guest's own loopback: nothing listens there but the relay
            assert out["tcp_host_loopback"] == out["tcp_srv"] == "ConnectionRefusedError", out
            # anywhere else: ENETUNREACH, no route at all
            assert out["tcp_slirp_host"] == out["udp_off_box"] == "OSError", out
            assert out["icmp_off_box"] in ("PermissionError", "OSError"), out
            assert out["resolve"] == "noresolve", out
            # datagrams to 127/8 go to the guest's own lo and die there (checked below)
            assert out["icmp_raw"] == "PermissionError", out
            assert out["icmp_dgram"] in ("PermissionError", "sent"), out
            assert net_events(r) == [], r.events
        # the host's side: nothing connected, nothing arrived, no query for direct.test
        with pytest.raises(BlockingIOError):
            tcp.accept()
        assert not select.select([udp], [], [], 0.2)[0]
        assert not queried(dnsmasq, "direct.test")
    finally:
        tcp.close()
        udp.close()


def test_budget_and_network_none(vm_image, dnsmasq, servers):
    name = vm_image
    with corral.Sandbox(allow(name, dnsmasq, ["allowed.test"],
                              budget={"requests": 2})) as sb:
        r = sb.exec([PY, "-c", GET, *["http://allowed.test/"] * 3])
        codes = [line.split()[0] for line in r.stdout.splitlines()]
        assert codes[:2] == ["200", "200"] and codes[2] != "200", r
        assert any("budget" in e["reason"] for e in net_events(r)), r.events
    port = free_port()
    r = corral.run([PY, "-c", "import os, socket\n"
                    "print(sorted(k for k in os.environ if 'proxy' in k.lower()))\n"
                    "try:\n socket.create_connection(('127.0.0.1', 3128), timeout=3)\n"
                    "except OSError as e: print(type(e).__name__)\n"],
                   {"isolation": "microvm", "image": name, "network": {"mode": "none"}})
    assert r.stdout.split("\n")[:2] == ["[]", "ConnectionRefusedError"], (r, port)


def test_a_secret_grant_is_injected_over_https(vm_image, world):
    name = vm_image
    policy = {**grant_policy("microvm", world), "image": name}
    code = ("import os, urllib.request as u\n"
            "print('env=' + os.environ['GITHUB_TOKEN'], os.environ['SSL_CERT_FILE'])\n"
            "print(open(os.environ['SSL_CERT_FILE']).read().count('BEGIN CERTIFICATE'))\n"
            "req = u.Request('https://granted.test/echo', headers={'Authorization': "
            "'Bearer ' + os.environ['GITHUB_TOKEN']})\n"
            "print(u.urlopen(req, timeout=20).read().decode())\n")
    r = corral.run([PY, "-c", code], policy)
    assert r.verdict == "ok", (r.stdout, r.stderr[-1500:], r.events)
    first, count, body = r.stdout.split("\n", 2)
    ph, ca = first.split("=", 1)[1].split()
    assert ph.startswith("corral_GITHUB_TOKEN_") and TOKEN not in ph, first
    assert ca == "/etc/corral-ca.pem" and int(count) >= 1, r.stdout
    seen = [rec for rec in world["log"] if rec["path"] == "/echo"][-1]
    assert ("authorization", f"Bearer {TOKEN}") in [(k.lower(), v) for k, v in seen["headers"]]
    assert ph in body and TOKEN not in body
    kinds = [(e["kind"], e.get("decision")) for e in r.events]
    assert ("secret", "inject") in kinds and ("net", "allow") in kinds, r.events
    assert TOKEN not in json.dumps(r.to_dict())
