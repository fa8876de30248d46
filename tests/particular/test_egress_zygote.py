"""Egress proxies forked from the zygote (egress/zygote.py, backends/host/zygote.py): real
live sandboxes on the namespace tier, the real proxy, real HTTP(S) servers on loopback and
dnsmasq (netfix). Each sandbox's proxy keeps its own rules, budgets and secrets though all
come from one process; a killed zygote or a killed proxy breaks no sandbox; nothing stays."""

import json
import os
import signal
import time

import pytest
from conftest import procs_of_uid
from netfix import GRANT_PRIV, PRIV, TOKEN

import corral
from corral.backends.host import zygote
from corral.egress.zygote import parse_request

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="live namespace sandboxes as root")


def net(dnsmasq, allow, **extra) -> dict:
    return {"network": {"mode": "allow", "allow": allow, "allow_private": [PRIV],
                        "nameservers": [f"127.0.0.1:{dnsmasq['port']}"], **extra},
            "limits": {"timeout": "30s"}}


def code(sb, url: str, events: list | None = None) -> str:
    r = sb.commands.run(f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' {url}")
    if events is not None:
        events += [e for e in r.events if e["kind"] == "net"]
    return r.stdout.strip()


def proxy_of(sb):
    return sb._live.proxy


def uid_of(sb) -> int:
    return sb._live.uid


def gone(uids) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(procs_of_uid(u) for u in uids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def ready():
    assert zygote.wait_ready(), "the zygote did not start"
    return zygote.zygote_pid()


def test_requests_are_strict():
    assert parse_request(b'{"uid": 5, "gid": 6}', 5) == (5, 6)
    for bad in (b'{"uid": 5}', b'{"uid": 5, "gid": 6, "x": 1}', b'{"uid": -1, "gid": 6}',
                b'{"uid": true, "gid": 6}', b'{"uid": "5", "gid": 6}', b"[5, 6]", b"nope",
                b'{"uid": 4294967296, "gid": 6}'):
        with pytest.raises(ValueError):
            parse_request(bad, 5)
    with pytest.raises(ValueError):
        parse_request(b'{"uid": 5, "gid": 6}', 4)            # the fixed fds are missing
    with pytest.raises(ValueError):
        parse_request(b'{"uid": 5, "gid": 6}', 5 + 17)       # too many cgroup fds


def test_rules_and_budgets_stay_per_sandbox(servers, dnsmasq, ready):
    a = corral.Sandbox.create(net(dnsmasq, ["allowed.test"], budget={"requests": 2}))
    b = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))
    c = corral.Sandbox.create(net(dnsmasq, ["other.example"]))
    sbs = [a, b, c]
    try:
        assert all(proxy_of(s).forked for s in sbs), "not forked from the zygote"
        assert len({proxy_of(s).pid for s in sbs}) == 3
        # c's proxy came from the same process as a's and b's, yet admits only its own rule
        assert code(c, "http://allowed.test/") == "403"
        ev_a, ev_b = [], []
        assert [code(a, "http://allowed.test/", ev_a) for _ in range(3)] == ["200", "200",
                                                                              "403"]
        # a's budget is spent; b's, on the same host, is untouched
        assert [code(b, "http://allowed.test/", ev_b) for _ in range(3)] == ["200"] * 3
        assert ev_a[-1]["decision"] == "deny" and "budget" in ev_a[-1]["reason"], ev_a
        assert len(ev_b) == 3 and all(e["decision"] == "allow" for e in ev_b), ev_b
        # each proxy runs as its own sandbox's uid
        for s in sbs:
            with open(f"/proc/{proxy_of(s).pid}/status") as f:
                uids = next(ln for ln in f if ln.startswith("Uid:")).split()[1:]
            assert set(map(int, uids)) == {uid_of(s)}
    finally:
        uids = [uid_of(s) for s in sbs]
        for s in sbs:
            s.kill()
    assert gone(uids), "a sandbox's processes outlived it"


def secret_pol(world, value: str) -> dict:
    return {"network": {"mode": "allow", "allow": ["granted.test"],
                        "allow_private": [GRANT_PRIV],
                        "nameservers": [f"127.0.0.1:{world['dns']}"],
                        "upstream_ca": str(world["test_ca"])},
            "secrets": {"GITHUB_TOKEN": {"value": value, "hosts": ["granted.test"]}},
            "limits": {"timeout": "30s"}}


def test_secrets_reach_only_their_own_sandbox(world, ready):
    other = TOKEN[::-1]
    a = corral.Sandbox.create(secret_pol(world, TOKEN))
    b = corral.Sandbox.create(secret_pol(world, other))
    try:
        assert proxy_of(a).forked and proxy_of(b).forked
        ph_a = a.commands.run("printf %s \"$GITHUB_TOKEN\"").stdout
        ph_b = b.commands.run("printf %s \"$GITHUB_TOKEN\"").stdout
        assert ph_a != ph_b and TOKEN not in ph_a + ph_b
        seen, events = [], {id(a): [], id(b): []}
        for sb, header in ((a, "$GITHUB_TOKEN"), (b, "$GITHUB_TOKEN"), (b, ph_a)):
            n = len(world["log"])
            r = sb.commands.run(f'curl -sS -m 10 -H "X-Token: {header}" '
                                f'https://granted.test/echo')
            assert r.exit_code == 0, r.stderr
            events[id(sb)] += r.events
            rec = [x for x in world["log"][n:] if x["path"] == "/echo"][-1]
            seen.append(dict((k.lower(), v) for k, v in rec["headers"])["x-token"])
        # each proxy swaps only its own placeholder: b sending a's placeholder sends just that
        assert seen == [TOKEN, other, ph_a]
        assert TOKEN not in json.dumps(events[id(b)]) and other not in json.dumps(events[id(a)])
        assert [e["decision"] for e in events[id(a)] if e["kind"] == "secret"] == ["inject"]
    finally:
        for s in (a, b):
            s.kill()


def test_a_killed_zygote_falls_back_and_is_replaced(servers, dnsmasq, ready):
    first = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))
    try:
        assert proxy_of(first).forked
        os.kill(ready, signal.SIGKILL)
        time.sleep(0.2)
        # the running sandbox never depended on it
        assert code(first, "http://allowed.test/") == "200"
        fresh = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))
        try:
            assert not proxy_of(fresh).forked, "a dead zygote served a proxy"
            assert code(fresh, "http://allowed.test/") == "200"
            notes = [e for e in fresh.events if e["kind"] == "notice"]
            assert len(notes) == 1 and "zygote" in notes[0]["message"], fresh.events
        finally:
            fresh.kill()
        assert zygote.wait_ready() and zygote.zygote_pid() not in (None, ready)
        again = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))
        try:
            assert proxy_of(again).forked
            assert code(again, "http://allowed.test/") == "200"
        finally:
            again.kill()
    finally:
        first.kill()


def test_a_killed_proxy_leaves_its_siblings_and_the_zygote_alone(servers, dnsmasq, ready):
    a = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))
    b = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))
    try:
        os.kill(proxy_of(a).pid, signal.SIGKILL)
        assert code(a, "http://allowed.test/") != "200"       # its own proxy is gone
        assert code(b, "http://allowed.test/") == "200"
        assert zygote.zygote_pid() == ready
        c = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))
        try:
            assert proxy_of(c).forked and code(c, "http://allowed.test/") == "200"
        finally:
            c.kill()
    finally:
        a.kill()
        b.kill()


def test_nothing_is_left_at_close(servers, dnsmasq, ready):
    sbs = [corral.Sandbox.create(net(dnsmasq, ["allowed.test"])) for _ in range(3)]
    pids = [proxy_of(s).pid for s in sbs]
    uids = [uid_of(s) for s in sbs]
    assert all(code(s, "http://allowed.test/") == "200" for s in sbs)
    for s in sbs:
        s.kill()
    assert gone(uids)
    for pid in pids:                    # reaped too: no zombie of ours
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def fds_of(pid: int) -> list[str]:
    return sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))


def test_the_zygote_and_its_spare_hold_nothing_of_a_sandbox(servers, dnsmasq, ready):
    sbs = [corral.Sandbox.create(net(dnsmasq, ["allowed.test"])) for _ in range(2)]
    try:
        assert all(proxy_of(s).forked for s in sbs)
        spare = zygote._zygote.spare
        assert spare is not None and spare not in [proxy_of(s).pid for s in sbs]
        # no listener, config memfd, event pipe or cgroup.procs fd of any sandbox: the
        # zygote keeps its two sockets (to the supervisor, to the spare), the spare its one
        # the spare is forked and warmed up behind the last request (at idle priority):
        # look again for a few seconds while it may still be in its warm-up's event loop
        for pid, sockets in ((ready, 2), (spare, 1)):
            deadline = time.monotonic() + 10
            while True:
                got = fds_of(pid)
                if (got.count("/dev/null") == 3
                        and all(f == "/dev/null" or f.startswith("socket:") for f in got)
                        and len([f for f in got if f.startswith("socket:")]) == sockets):
                    break
                assert time.monotonic() < deadline, (pid, got)
                time.sleep(0.05)
    finally:
        for s in sbs:
            s.kill()


def test_a_stuck_zygote_is_replaced(servers, dnsmasq, ready):
    os.kill(ready, signal.SIGSTOP)
    try:
        sb = corral.Sandbox.create(net(dnsmasq, ["allowed.test"]))   # waits REPLY_TIMEOUT_S
    finally:
        try:
            os.kill(ready, signal.SIGCONT)
        except ProcessLookupError:
            pass
    try:
        assert not proxy_of(sb).forked
        assert code(sb, "http://allowed.test/") == "200"
        notes = [e["message"] for e in sb.events if e["kind"] == "notice"]
        assert notes and "did not answer" in notes[0] and "killed" in notes[0], notes
    finally:
        sb.kill()
    with pytest.raises(ChildProcessError):
        os.waitpid(ready, os.WNOHANG)         # the stuck one was killed and reaped
    assert zygote.wait_ready() and zygote.zygote_pid() != ready


def test_the_warm_up_runs_the_allowed_paths_without_a_network():
    """The template (and each spare) runs allowed plain-HTTP requests and CONNECT tunnels
    through a proxy of its own, so that a new sandbox's first request finds their pages
    copied and their bytecode quickened: every one must come back answered. Run in a network
    namespace of its own with no interface up (not even loopback): the warm-up uses
    socketpairs only, and a connect or a DNS query would fail there."""
    import subprocess
    import sys

    from corral.egress.zygote import SPARE_ROUNDS, WARM_ROUNDS

    code = ("import corral.egress.boot as b; b.preload(grants=False)\n"
            "import corral.egress.zygote as z\n"
            f"print(z.warm(), z.warm(rounds={SPARE_ROUNDS}), z.warm(request=False))")
    r = subprocess.run(["unshare", "--net", sys.executable, "-I", "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(2 * WARM_ROUNDS), str(2 * SPARE_ROUNDS), "0"], r
