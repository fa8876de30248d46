"""network.mode = "allow" as only the gvisor tier does it, with real parts: real runsc, the
real proxy, a real dnsmasq and real HTTP(S) servers on loopback /24s of the tests' own, real
clients inside (curl, ip, Python sockets).

The sandbox's netstack gets one veth whose far end, in a namespace of corral's own, holds
only the proxy's listener (backends/gvisor_net.py). What is particular here, and so not in
the shared suite (tests/tiers/test_network.py, which runs the allowlist, denials, budgets,
secret grants and explain's claims on every tier, gvisor included): the veth's shape seen
from inside (two links, one /30 address, netlink refusing changes), a network namespace
per exec bound in the run dir and gone after it, and the sweep that unmounts a binding a
killed supervisor left. The only traffic is on 127.0.0.0/8 and inside those namespaces."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import mountinfo, net_events, procs_mentioning, procs_of_uid, sh
from netfix import SRV, allow_policy, queried

import corral
from corral.backends.gvisor import find_runsc
from corral.backends.gvisor_net import PROXY_ADDR, SANDBOX_ADDR
from corral.linux import limits, rundir

PY = "/usr/bin/python3"
pytestmark = [
    pytest.mark.skipif(find_runsc() is None, reason="runsc (gVisor) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the gvisor tier needs root"),
]


def policy(dns, allow, **network):
    return allow_policy("gvisor", dns, allow, **network)


def procs_where(pred):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if pred(pid):
                    found.append(int(pid))
            except OSError:
                pass
    return found


def procs_in_netns(inode):
    return procs_where(lambda pid: os.stat(f"/proc/{pid}/ns/net").st_ino == inode)


def nsfs_mounts_below(path):
    return [m for m in mountinfo() if f" {path}/" in m and " - nsfs " in m]


def cgroups_of(run_id):
    left = []
    for _, parent in limits.detect().parents:
        if os.path.isdir(parent):
            left += [n for n in os.listdir(parent) if n.split("-")[0] == run_id]
    return left


# -- nothing but the proxy ------------------------------------------------------------------

def test_only_the_proxy_listener_is_reachable(dnsmasq, servers):
    probe = textwrap.dedent(f"""
        import errno, json, os, socket
        out = {{}}
        def tcp(name, addr):
            try:
                socket.create_connection(addr, timeout=3).close(); out[name] = "connected"
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e))
        tcp("server", ("{SRV}", 80))            # the test server, directly
        tcp("server443", ("{SRV}", 443))
        tcp("loopback80", ("127.0.0.1", 80))    # the host's loopback is not this one
        tcp("loopback3128", ("127.0.0.1", 3128))
        tcp("dns_tcp", ("127.0.0.1", {dnsmasq['port']}))
        tcp("proxy", ("{PROXY_ADDR}", 3128))    # the one thing there is
        tcp("proxy_other_port", ("{PROXY_ADDR}", 22))
        tcp("outside", ("192.0.2.1", 80))
        # a DNS query straight to dnsmasq, to the proxy's address, and off the /30
        q = bytes.fromhex("abcd01000001000000000000") + b"\\x0aleak-probe\\x04test\\x00\\x00\\x01\\x00\\x01"
        for name, addr in (("udp_dnsmasq", ("127.0.0.1", {dnsmasq['port']})),
                           ("udp_proxy", ("{PROXY_ADDR}", 53)), ("udp_server", ("{SRV}", 53))):
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.settimeout(2)
            try:
                u.sendto(q, addr); u.recvfrom(512); out[name] = "answered"
            except socket.timeout:
                out[name] = "timeout"
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e))
        try:
            socket.getaddrinfo("resolve-probe.test", 80); out["resolve"] = "resolved"
        except OSError:
            out["resolve"] = "failed"
        for name, args in (("raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                           ("raw_udp", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)),
                           ("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0x0300))):
            try:
                socket.socket(*args).close(); out[name] = "opened"
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e))
        out["ifaces"] = sorted(os.listdir("/sys/class/net"))
        out["dev"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev") if ":" in l)
        print(json.dumps(out))
    """)
    pol = policy(dnsmasq, ["allowed.test"])
    r = corral.run([PY, "-c", probe], policy=pol)
    assert r.verdict == "ok", r
    out = json.loads(r.stdout)
    assert out.pop("proxy") == "connected"
    assert out.pop("outside") in ("ENETUNREACH", "EHOSTUNREACH"), out  # no route off the /30
    # the test servers and dnsmasq are on the host's 127.0.0.0/8, which inside is the
    # sandbox's own loopback, with nothing listening
    for name in ("server", "server443", "loopback80", "loopback3128", "dns_tcp",
                 "proxy_other_port"):
        assert out.pop(name) == "ECONNREFUSED", (name, out)
    for name in ("udp_dnsmasq", "udp_proxy", "udp_server"):
        assert out.pop(name) in ("timeout", "ECONNREFUSED"), (name, out)
    assert out.pop("resolve") == "failed"
    assert not queried(dnsmasq, "leak-probe.test") and not queried(dnsmasq, "resolve-probe.test")
    for name in ("raw", "raw_udp", "packet"):              # no CAP_NET_RAW inside
        assert out.pop(name) in ("EPERM", "EACCES", "EAFNOSUPPORT", "EPROTONOSUPPORT"), out
    assert out.pop("ifaces") == ["eth0", "lo"] and out.pop("dev") == ["eth0", "lo"], out
    assert out == {}, out  # every probe was checked
    # a client that ignores the proxy fails; netlink shows gVisor's own links and refuses
    # any change (a route via the proxy's address, a second address)
    r = sh(f"curl -sS --noproxy '*' -m 5 http://{SRV}/ 2>&1; echo; ip -o link | cut -d: -f2; "
           f"ip -4 -o addr show eth0 | cut -d' ' -f7; "
           f"ip route add default via {PROXY_ADDR} 2>&1; ip addr add 10.9.9.9/24 dev eth0 2>&1; "
           "ip route", pol)
    lines = [x.strip() for x in r.stdout.splitlines() if x.strip()]
    assert "hello" not in r.stdout and "Failed to connect" in lines[0], r.stdout
    assert sorted(lines[1:3]) == ["eth0", "lo"] and lines[3] == f"{SANDBOX_ADDR}/30", r.stdout
    assert sum(x.startswith("RTNETLINK answers: ") and x.endswith(
        ("Permission denied", "Operation not permitted")) for x in lines) == 2, r.stdout
    assert not any(x.startswith("default") for x in lines), r.stdout
    assert not net_events(r)


# -- nothing left behind --------------------------------------------------------------------

def test_each_exec_has_its_own_namespaces_and_nothing_is_left(dnsmasq, servers):
    seen = {}
    with corral.Sandbox(policy(dnsmasq, ["allowed.test"])) as sb:
        live = sb._live
        run_dir, uid = live.dir.path, live.uid

        def during(data):
            if b"ready" in data and "ino" not in seen:
                path = os.path.join(run_dir, f"netns-{live.execs}")
                seen["ino"] = os.stat(path).st_ino
                # held open to the end: a namespace freed at once gives its inode number
                # to the next one made, and the two inodes would compare equal
                held.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                seen["mounted"] = nsfs_mounts_below(run_dir)
                seen["in_ns"] = procs_in_netns(seen["ino"])
                seen["uid_procs"] = procs_of_uid(uid)

        inodes, held = [], []
        for _ in range(2):
            seen.clear()
            cmd = "curl -sS -m 10 http://allowed.test/; echo ready; sleep 0.5"
            r = sb.exec(["/bin/sh", "-c", cmd], on_stdout=during)
            assert f"hello from {SRV}" in r.stdout and r.verdict == "ok", r
            assert len(seen["mounted"]) == 1 and seen["in_ns"], seen  # the Sentry is in it
            assert len(seen["uid_procs"]) >= 2, seen  # the gofer and the proxy, as the run uid
            inodes.append(seen["ino"])
            # after the exec: no binding, no process in that netns or as the run's uid,
            # no cgroup, no runsc state
            assert nsfs_mounts_below(run_dir) == []
            assert procs_in_netns(seen["ino"]) == [] and procs_of_uid(uid) == []
            assert procs_mentioning(run_dir) == []
            assert os.listdir(os.path.join(run_dir, "runsc")) == []
            assert not [n for n in os.listdir(run_dir) if n.startswith("netns-")]
            assert cgroups_of(os.path.basename(run_dir)) == []
        assert inodes[0] != inodes[1]
        for fd in held:
            os.close(fd)
    assert not os.path.exists(run_dir)
    assert not [m for m in mountinfo() if run_dir in m]


def test_a_killed_run_leaves_nothing(dnsmasq, servers):
    """The wall clock kills the run (a daemon included) while a download is in flight."""
    seen = {}
    with corral.Sandbox(policy(dnsmasq, ["allowed.test"])) as sb:
        run_dir, uid = sb._live.dir.path, sb._live.uid

        def during(data):
            if b"ready" in data and "ino" not in seen:
                seen["ino"] = os.stat(os.path.join(run_dir, "netns-1")).st_ino

        r = sb.exec(["/bin/sh", "-c", "(setsid sleep 300 &); echo ready; "
                                      "curl -sS -m 30 -o /dev/null http://allowed.test/slow; "
                                      "sleep 300"], on_stdout=during, timeout=2)
        assert r.verdict == "timeout", r
        assert any(e["kind"] == "net" and e["host"] == "allowed.test" for e in r.events), r
        assert nsfs_mounts_below(run_dir) == [] and procs_in_netns(seen["ino"]) == []
        assert procs_of_uid(uid) == [] and procs_mentioning(run_dir) == []
        assert cgroups_of(os.path.basename(run_dir)) == []
        assert os.listdir(os.path.join(run_dir, "runsc")) == []
    assert not os.path.exists(run_dir)


VICTIM = """
import corral, json, sys
sb = corral.Sandbox(json.loads(sys.argv[1]))
sb.open()
print(sb._live.dir.path, sb._live.uid, flush=True)
sb.exec(["/bin/sh", "-c", "curl -sS -m 10 http://allowed.test/ >/dev/null; (setsid sleep 300 &); sleep 300"])
"""


def _dead_victim(dnsmasq):
    """A supervisor (VICTIM) with a live gvisor sandbox, SIGKILLed; its run dir's lock
    held here, as a live supervisor holds it, so that no other process's sweep (the suites
    of other checkouts start corral meanwhile) removes the run while the test looks at
    it. (p, run_dir, uid, netns inode, lock fd), or None when another sweep took the run
    first (the lock waited for it)."""
    p = subprocess.Popen([sys.executable, "-c", VICTIM,
                          json.dumps(policy(dnsmasq, ["allowed.test"]))],
                         stdout=subprocess.PIPE, text=True)
    run_dir, uid = p.stdout.readline().split()
    uid = int(uid)
    netns = os.path.join(run_dir, "netns-1")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (
            nsfs_mounts_below(run_dir) and len(procs_mentioning(run_dir)) >= 3
            and procs_in_netns(os.stat(netns).st_ino if os.path.exists(netns) else -1)):
        time.sleep(0.05)
    ino = os.stat(netns).st_ino
    assert procs_in_netns(ino), "the Sentry should be in the sandbox's netns"
    assert procs_mentioning("corral.egress.boot"), "the proxy should run"
    lock = os.open(os.path.join(run_dir, "lock"), os.O_WRONLY | os.O_CLOEXEC)
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    fcntl.flock(lock, fcntl.LOCK_EX)      # free once the supervisor is gone, or a sweep is
    if os.path.isdir(run_dir):
        return p, run_dir, uid, ino, lock
    os.close(lock)                        # another process's sweep removed it: again
    limits.RunCgroup.sweep_stale(lambda r: r.split("-")[0] == os.path.basename(run_dir))
    return None


def test_supervisor_death_leaves_nothing_running_and_the_sweep_unmounts_the_netns(
        dnsmasq, servers):
    for _ in range(3):
        got = _dead_victim(dnsmasq)
        if got is not None:
            break
    else:
        raise AssertionError("other processes' sweeps took the dead run three times")
    p, run_dir, uid, ino, lock = got
    try:
        deadline = time.monotonic() + 5
        while (procs_mentioning(run_dir) or procs_of_uid(uid) or procs_in_netns(ino)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        # parent-death signals ended runsc, its gofer and Sentry, and the proxy
        assert procs_mentioning(run_dir) == [] and procs_of_uid(uid) == []
        assert procs_in_netns(ino) == []
        # only the binding keeps the sandbox's netns now; the next start's sweep removes it
        assert len(nsfs_mounts_below(run_dir)) == 1
    finally:
        os.close(lock)
    run_id = os.path.basename(run_dir)
    swept = rundir.sweep_stale()
    if run_id not in swept:  # a concurrent corral start's sweep took it first: its end
        deadline = time.monotonic() + 30
        while os.path.exists(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        limits.RunCgroup.sweep_stale(lambda r: r.split("-")[0] == run_id)
    assert not os.path.exists(run_dir)
    assert not [m for m in mountinfo() if run_dir in m]
    assert cgroups_of(run_id) == []
