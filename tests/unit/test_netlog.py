"""runtime/netlog.py's bookkeeping of a live sandbox's proxy events, without a sandbox
(tests/tiers/test_live_net_events.py has them with real sandboxes and a real proxy):
positions are absolute, what every taker took is trimmed, and the cap bounds what is
kept, never silently."""

from corral.runtime import netlog
from corral.runtime.netlog import NetLog


class Cmd:
    pid, run_id = 7, "r"


def _event(i: int) -> tuple:
    return ("event", None, {"kind": "net", "host": f"h{i}.test"})


def _hosts(events) -> list[str]:
    return [e.get("host", "-") for e in events]


def test_results_keep_every_event_past_the_cap_and_memory_stays_bounded(monkeypatch):
    monkeypatch.setattr(netlog, "MAX_EVENTS", 3)
    log, n = NetLog([]), 0
    for _ in range(10):                      # 20 events, a cap of 3, none lost
        c = Cmd()
        log.begin(c)
        log.take([_event(n), _event(n + 1)])
        assert _hosts(log.end(c)) == [f"h{n}.test", f"h{n + 1}.test"]
        assert log.net == [] and log.base == n + 2
        n += 2
    c = Cmd()                                # one command past the cap: said so
    log.begin(c)
    log.take([_event(i) for i in range(5)])
    assert len(log.net) == 3 and log.dropped == 2
    got = log.end(c)
    assert _hosts(got[:3]) == ["h0.test", "h1.test", "h2.test"]
    assert got[3]["kind"] == "teardown" and got[3]["message"].startswith("2 events"), got


def test_a_lagging_reader_gets_a_marker_and_results_come_first(monkeypatch):
    monkeypatch.setattr(netlog, "MAX_EVENTS", 3)
    log = NetLog([])
    assert log.read("stream") == []          # a reader from here on
    log.take([_event(0)])                    # no command: only the reader takes it
    c = Cmd()
    log.begin(c)
    log.take([_event(i) for i in range(1, 6)])
    # the oldest went (only the reader needed them) until the command's own first one
    assert log.base == 1 and log.dropped == 2 and len(log.net) == 3
    assert _hosts(log.end(c)) == ["h1.test", "h2.test", "h3.test", "-"]
    got = log.read("stream")
    assert got[0]["kind"] == "teardown" and got[0]["message"].startswith("1 events"), got
    assert _hosts(got[1:4]) == ["h1.test", "h2.test", "h3.test"]
    assert got[4]["kind"] == "teardown" and got[4]["message"].startswith("2 events"), got
    assert log.net == [] and log.read("stream") == []


def test_a_reader_that_reads_holds_what_it_has_not_read():
    log = NetLog([])
    log.read("stream")
    c = Cmd()
    log.begin(c)
    log.take([_event(0), _event(1)])
    assert _hosts(log.end(c)) == ["h0.test", "h1.test"]
    assert len(log.net) == 2                 # the stream has not read them
    assert _hosts(log.read("stream")) == ["h0.test", "h1.test"]
    assert log.net == [] and log.base == 2


def test_late_events_are_bounded_over_the_sandboxs_life(monkeypatch):
    monkeypatch.setattr(netlog, "MAX_EVENTS", 2)
    own: list[dict] = []
    log = NetLog(own)
    c = Cmd()
    log.begin(c)
    log.take([("open", 1, None), ("open", 2, None), ("open", 3, None)])
    log.end(c)                               # its connections' events come later
    log.take([("event", i, {"kind": "net", "host": "x.test"}) for i in (1, 2, 3)])
    assert [e.get("late") for e in own] == [True, True, None]
    assert own[2]["kind"] == "teardown" and "not kept" in own[2]["message"]
