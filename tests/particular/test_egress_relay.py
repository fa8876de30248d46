"""The proxy's bulk relay (egress/relay.py `_Relay`): past THREAD_AFTER bytes a flow without
a byte budget goes on in a thread of its own. The real proxy process, real servers on
loopback, dnsmasq (netfix): every byte arrives and is counted, the thread ends with its
flow, and a cut (idle, SIGTERM) stops it without leaving it behind."""

import os
import signal
import socket
import subprocess
import time

import netfix
import pytest
from netfix import PRIV

from corral.egress.relay import THREAD_AFTER

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root (ports 80/443 on loopback), dnsmasq, curl")

BIG = 5 * THREAD_AFTER


@pytest.fixture(params=["ring", "splice"])
def proxy(request, tmp_path, dnsmasq, servers, monkeypatch):
    """Every test once with the relay threads splicing (the default) and once with their
    copy ring (CORRAL_EGRESS_RELAY_SPLICE=0, the bench's A/B)."""
    monkeypatch.setenv("CORRAL_EGRESS_RELAY_SPLICE", "1" if request.param == "splice" else "0")
    made = []

    def start(**cfg):
        cfg.setdefault("nameservers", [f"127.0.0.1:{dnsmasq['port']}"])
        cfg.setdefault("allow", ["allowed.test"])
        cfg.setdefault("allow_private", [PRIV])
        p = netfix.Proxy(cfg, tmp_path)
        made.append(p)
        return p

    yield start
    for p in made:
        p.stop()


def threads(p) -> int:
    return len(os.listdir(f"/proc/{p.proc.pid}/task"))


def until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def paused_get(p, n: int) -> tuple[socket.socket, bytes]:
    """A GET for BIG bytes with a small receive buffer, of which n are read, then paused."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.settimeout(10)
    s.connect(("127.0.0.1", p.port))
    s.sendall(f"GET http://allowed.test/bytes/{BIG} HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
              .encode())
    got = b""
    while len(got) < n:
        got += s.recv(1 << 20)
    return s, got


def body_of(raw: bytes) -> bytes:
    return raw.partition(b"\r\n\r\n")[2]


def test_a_bulk_download_moves_to_a_thread_and_every_byte_is_counted(proxy):
    p = proxy()
    s, got = paused_get(p, 2 * THREAD_AFTER)
    try:
        # the flow is past THREAD_AFTER and blocked on our full window: a relay thread
        assert until(lambda: threads(p) == 2), "no relay thread"
        while len(body_of(got)) < BIG:
            chunk = s.recv(1 << 20)
            assert chunk, "cut short"
            got += chunk
    finally:
        s.close()
    assert body_of(got) == b"x" * BIG
    ev = p.events(1)[-1]
    head = len(got) - BIG
    assert ev["decision"] == "allow" and BIG < ev["bytes_in"] <= BIG + head + 4096, ev
    assert until(lambda: threads(p) == 1), "the relay thread outlived its flow"


def test_a_bulk_download_arrives_byte_for_byte_whatever_the_reader_does(proxy):
    # random bytes of a length that is no multiple of anything, read in odd sizes with
    # pauses: the thread's ring fills, wraps and drains part-way, over and over
    from netfix import random_bytes

    n = 3 * THREAD_AFTER + 4 * (4 << 20) + 12345
    p = proxy()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.settimeout(10)
    s.connect(("127.0.0.1", p.port))
    s.sendall(f"GET http://allowed.test/random/{n} HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
              .encode())
    got = bytearray()
    sizes = [1, 4093, 65536, 777, 1 << 20, 12345]
    i = 0
    head = -1
    try:
        while head < 0 or len(got) - head < n:
            chunk = s.recv(sizes[i % len(sizes)])
            assert chunk, "cut short"
            got += chunk
            if head < 0 and b"\r\n\r\n" in got:
                head = got.index(b"\r\n\r\n") + 4
            i += 1
            if i % 200 == 0:
                time.sleep(0.05)             # the window closes; the thread's write blocks
    finally:
        s.close()
    body = bytes(got[head:])
    assert len(body) == n
    assert body == random_bytes(n), "the relay reordered, dropped or repeated bytes"
    ev = p.events(1)[-1]
    assert ev["decision"] == "allow" and n < ev["bytes_in"] <= n + 4096, ev


def test_a_bulk_tunnel_is_whole(proxy, servers):
    p = proxy()
    r = subprocess.run(["curl", "-sS", "--max-time", "30", "-x", p.url, "--cacert",
                        str(servers["cert"]), "-o", "-", f"https://allowed.test/bytes/{BIG}"],
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"x" * BIG
    ev = p.events(1)[-1]
    assert ev["decision"] == "allow" and ev["bytes_in"] > BIG, ev   # TLS adds its records


def test_an_idle_cut_stops_the_relay_thread(proxy):
    p = proxy(idle_timeout=1.0)
    s, _ = paused_get(p, 2 * THREAD_AFTER)
    try:
        assert until(lambda: threads(p) == 2), "no relay thread"
        # nothing moves while we do not read: the idle sweep cuts the connection, the
        # thread is told to stop and is waited for before the sockets close
        assert until(lambda: threads(p) == 1, 15), "the relay thread was left running"
        s.settimeout(10)
        try:
            while s.recv(1 << 20):
                pass
        except (ConnectionResetError, TimeoutError):
            pass
    finally:
        s.close()
    assert p.proc.poll() is None                      # the proxy itself is fine
    assert p.events(1)[-1]["decision"] == "allow"


def test_sigterm_mid_transfer_ends_the_proxy_cleanly(proxy):
    p = proxy()
    s, got = paused_get(p, 2 * THREAD_AFTER)
    try:
        assert until(lambda: threads(p) == 2), "no relay thread"
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(10) == 0
    finally:
        s.close()
    ev = p.events(1)[-1]
    assert 2 * THREAD_AFTER <= ev["bytes_in"] < BIG, ev   # the flow's event, partial


def test_a_budget_is_kept_to_the_byte_with_relay_threads(proxy):
    # room for the first GET and part of the second: the second moves to a thread on a
    # grant of a quarter of what is left, then back to the loop, which cuts it exactly
    limit = BIG + BIG // 2
    p = proxy(budget={"bytes_in": limit})
    s, got = paused_get(p, 2 * THREAD_AFTER)
    seen = set()
    try:
        while len(body_of(got)) < BIG:
            seen.add(threads(p))
            chunk = s.recv(1 << 20)
            assert chunk
            got += chunk
    finally:
        s.close()
    assert body_of(got) == b"x" * BIG
    assert 2 in seen, "the budgeted flow never used a relay thread"
    first = p.events(1)[-1]["bytes_in"]
    s, got = paused_get(p, 1)
    try:
        s.settimeout(10)
        while chunk := s.recv(1 << 20):
            got += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        s.close()
    ev = p.events(2)[-1]
    assert ev["decision"] == "deny" and ev["reason"] == "budget: bytes_in", ev
    assert first + ev["bytes_in"] == limit            # not a byte past it, none left unused
    assert len(body_of(got)) <= ev["bytes_in"] < BIG     # the head is rewritten: body only


def test_the_relay_threads_get_pids_of_their_own():
    from corral.backends.host.proxy import RELAY_TASKS, with_relay_tasks
    from corral.egress.relay import MAX_RELAY_THREADS
    from corral.plan import build_plan
    from corral.runtime.sandbox import coerce_policy

    assert RELAY_TASKS == MAX_RELAY_THREADS   # host/proxy.py keeps asyncio off the run path
    allow = build_plan(coerce_policy({"network": {"mode": "allow", "allow": ["a.test"]}}), {})
    none = build_plan(coerce_policy({}), {})
    assert with_relay_tasks(allow)(64) == 64 + RELAY_TASKS
    assert with_relay_tasks(allow, lambda n: n + 3)(64) == 67 + RELAY_TASKS
    assert with_relay_tasks(none)(64) == 64
