"""A live sandbox's network events reach the Result of the command that caused them, or,
when they come after it, the sandbox's events naming that command (runtime/netlog.py).

The proxy writes an allowed tunnel's event when it sees the tunnel close, and a command
that exits without closing its socket leaves that to the kernel: the close comes after the
command's exit. Real sandbox, real proxy, a real dnsmasq and HTTP server on 127.0.0.0/8."""

import time

import pytest
from conftest import net_events, tier_unavailable
from netfix import allow_policy

import corral

PY = "/usr/bin/python3"
TIERS = ("namespace", "gvisor")

#: inside: an allowed CONNECT tunnel that carries one request, then a denied CONNECT;
#: exits without closing either socket (the kernel closes them after the exit). HOLD > 0:
#: a child keeps the tunnel open that long after the command's exit.
CLIENT = """
import os, socket, sys, time
host, port = os.environ["http_proxy"].split("//")[1].rstrip("/").rsplit(":", 1)

def tunnel(target):
    s = socket.create_connection((host, int(port)))
    s.sendall(("CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target)).encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        more = s.recv(4096)
        if not more:
            break
        head += more
    return s, head.split(b" ")[1]

s, ok = tunnel("allowed.test:80")
s.sendall(b"GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n")
got = b""
while b"hello from" not in got:
    got += s.recv(4096)
d, no = tunnel("denied.test:80")
print(ok.decode(), no.decode(), flush=True)
hold = float(sys.argv[1])
if hold and os.fork() == 0:
    fd = os.open("/dev/null", os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    time.sleep(hold)
    os._exit(0)
os._exit(0)
"""


@pytest.fixture(scope="module", params=TIERS)
def tier(request):
    why = tier_unavailable(request.param, {"network": {"mode": "allow", "allow": ["x.test"]}})
    if why:
        pytest.skip(f"{request.param}: {why}")
    return request.param


def _decisions(events) -> list[tuple[str, int, str]]:
    return sorted((e["host"], e["port"], e["decision"]) for e in events if e["kind"] == "net")


def test_a_live_commands_result_has_the_event_of_its_last_connection(tier, dnsmasq, servers):
    sb = corral.Sandbox.create(allow_policy(tier, dnsmasq, ["allowed.test"]), timeout=300)
    try:
        for i in range(30):
            r = sb.commands.run([PY, "-c", CLIENT, "0"])
            assert r.exit_code == 0 and r.stdout.split() == ["200", "403"], r
            assert _decisions(net_events(r)) == [("allowed.test", 80, "allow"),
                                                 ("denied.test", 80, "deny")], (i, r.events)
        late = [e for e in sb.events if e.get("late")]
        assert late == [], late      # nothing came after its command's Result
    finally:
        sb.kill()


def test_an_event_after_the_result_goes_to_the_sandbox_naming_its_command(tier, dnsmasq,
                                                                           servers):
    sb = corral.Sandbox.create(allow_policy(tier, dnsmasq, ["allowed.test"]), timeout=300)
    try:
        # a child holds the tunnel open past the command's end and the wait for it
        h = sb.commands.run([PY, "-c", CLIENT, "2"], background=True)
        r = h.wait(60)
        assert r.exit_code == 0 and r.stdout.split() == ["200", "403"], r
        assert _decisions(net_events(r)) == [("denied.test", 80, "deny")], r.events
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e.get("late") for e in sb.events):
            time.sleep(0.05)
        late = [e for e in sb.events if e.get("late")]
        assert [(e["kind"], e["host"], e["decision"], e["command"], e["run"])
                for e in late] == [("net", "allowed.test", "allow", h.pid, h.run_id)], late
        # nor does it turn up in the next command's Result
        r2 = sb.commands.run(["/bin/true"])
        assert net_events(r2) == [], r2.events
    finally:
        sb.kill()


def test_the_service_streams_a_late_event_as_a_network_event():
    from corral.runtime.netlog import NetLog
    from corral.service.events import EventLog

    class Sb:
        events = [{"kind": "teardown", "message": "x"},
                  {"kind": "net", "host": "b.test", "late": True, "command": 7, "run": "r"}]
        _netlog = NetLog(events)

    Sb._netlog.take([("event", None, {"kind": "net", "host": "a.test"})])
    log = EventLog()
    log.pull(Sb())
    got = [(kind, d.get("host"), d.get("command")) for _, kind, d in log.since(0)]
    assert got == [("network", "a.test", None), ("sandbox", None, None),
                   ("network", "b.test", 7)]


DENIED = """
import os, socket
host, port = os.environ["http_proxy"].split("//")[1].rstrip("/").rsplit(":", 1)
for _ in range(int(os.environ.get("N", "1"))):
    s = socket.create_connection((host, int(port)))
    s.sendall(b"CONNECT denied.test:80 HTTP/1.1\\r\\nHost: denied.test:80\\r\\n\\r\\n")
    assert s.recv(4096).split(b" ")[1] == b"403"
    s.close()
"""


def _missing(r) -> list[str]:
    return [e["message"] for e in r.events
            if e["kind"] == "teardown" and "not kept" in e["message"]]


def test_events_past_the_sandboxs_cap_are_said_missing_never_silently(tier, dnsmasq, servers,
                                                                       monkeypatch):
    """A live sandbox keeps at most netlog.MAX_EVENTS of its proxy's events that a
    command's Result (or the service's event stream) has yet to take (memory); past that
    a Result says how many of its command's were not kept, instead of showing none. What
    the Results took is trimmed, so the cap is no bound over the sandbox's life (before:
    past it, every later command lost its events). The cap lowered to 3 here."""
    from corral.runtime import netlog

    monkeypatch.setattr(netlog, "MAX_EVENTS", 3)
    sb = corral.Sandbox.create(allow_policy(tier, dnsmasq, ["allowed.test"]), timeout=300)
    try:
        r = sb.commands.run([PY, "-c", DENIED], env={"N": "5"})     # 3 kept, 2 not
        assert r.exit_code == 0, r
        assert len(net_events(r)) == 3 and len(_missing(r)) == 1, r.events
        assert _missing(r)[0].startswith("2 events"), r.events
        for i in range(3):               # 6 more, twice the cap: all in their Results
            r = sb.commands.run([PY, "-c", DENIED], env={"N": "2"})
            assert r.exit_code == 0, r
            assert len(net_events(r)) == 2 and _missing(r) == [], (i, r.events)
            assert len(sb._netlog.net) == 0, sb._netlog.net      # taken: trimmed
        assert sb._netlog.base == 9 and sb._netlog.dropped == 2
        r = sb.commands.run(["/bin/true"])                          # no network: nothing
        assert [e for e in r.events if e["kind"] in ("net", "teardown")] == [], r.events
    finally:
        sb.kill()


@pytest.mark.slow
def test_a_lagging_event_stream_is_told_what_it_missed(tier, dnsmasq, servers, monkeypatch):
    """The service's event stream is a reader of the proxy's events from the sandbox's
    start (Registry.create pulls once): the sandbox keeps them for it, at most the cap; past
    that the oldest go (no Result needs them), and its next read starts with a marker of how
    many it missed. The Results keep every event all the same."""
    from corral.runtime import netlog
    from corral.service.events import EventLog

    monkeypatch.setattr(netlog, "MAX_EVENTS", 3)
    sb = corral.Sandbox.create(allow_policy(tier, dnsmasq, ["allowed.test"]), timeout=300)
    try:
        log = EventLog()
        log.pull(sb)                     # a reader from here
        r = sb.commands.run([PY, "-c", DENIED], env={"N": "2"})
        assert len(net_events(r)) == 2, r.events
        log.pull(sb)                     # it keeps up: every event, no marker
        assert [k for _, k, e in log.since(0)] == ["network"] * 2
        for _ in range(4):               # 8 more while it does not read
            r = sb.commands.run([PY, "-c", DENIED], env={"N": "2"})
            assert len(net_events(r)) == 2 and _missing(r) == [], r.events
            assert len(sb._netlog.net) <= 3                       # memory: the cap
        log.pull(sb)
        got = [e for _, _, e in log.since(0)][2:]
        assert got[0]["kind"] == "teardown", got
        assert got[0]["message"].startswith("5 events of the egress proxy went before"), got
        assert [e["host"] for e in got[1:]] == ["denied.test"] * 3, got
        assert len(sb._netlog.net) == 0     # read by all: trimmed
    finally:
        sb.kill()
