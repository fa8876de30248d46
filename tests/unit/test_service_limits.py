"""The service's limits and config, pure: token buckets on a clock the test moves, rates
as written, the concurrency and sandbox counts, the config file's checks, and how a
ceiling's secrets get the server's sources."""

import pytest

from corral.errors import UsageError
from corral.service import config
from corral.service.limits import (
    Concurrency,
    Limited,
    Quota,
    RateLimiter,
    format_rate,
    parse_rate,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_bucket_gives_its_burst_then_its_rate():
    clock = Clock()
    r = RateLimiter(clock)
    for _ in range(5):
        r.admit("a", 2.0, 5)
    with pytest.raises(Limited) as e:
        r.admit("a", 2.0, 5)
    assert e.value.field == "rate" and e.value.retry_after == 1      # 0.5 s, rounded up
    r.admit("b", 2.0, 5)                                               # another bucket
    clock.t += 0.5                                                     # one request back
    r.admit("a", 2.0, 5)
    with pytest.raises(Limited):
        r.admit("a", 2.0, 5)
    clock.t += 3600                                                    # never above burst
    for _ in range(5):
        r.admit("a", 2.0, 5)
    with pytest.raises(Limited):
        r.admit("a", 2.0, 5)


def test_retry_after_is_the_wait_for_one_request():
    clock = Clock()
    r = RateLimiter(clock)
    r.admit("a", 1 / 60, 1)           # 1/min
    with pytest.raises(Limited) as e:
        r.admit("a", 1 / 60, 1)
    assert e.value.retry_after == 60
    clock.t += 45
    with pytest.raises(Limited) as e:
        r.admit("a", 1 / 60, 1)
    assert e.value.retry_after == 15


def test_no_rate_is_no_limit():
    r = RateLimiter(Clock())
    for _ in range(10000):
        r.admit("a", None, None)


@pytest.mark.parametrize("text,rate", [("20/s", 20.0), ("600/min", 10.0), ("3600/h", 1.0),
                                       ("1/m", 1 / 60), ("2.5/sec", 2.5), (5, 5.0),
                                       ("7", 7.0)])
def test_rates_as_written(text, rate):
    assert parse_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize("text", ["fast", "0/s", "-1/s", "5/week", "nan", "inf/s", True,
                                  "1e9/s"])
def test_bad_rates(text):
    with pytest.raises(UsageError) as e:
        parse_rate(text)
    assert e.value.field == "--rate"


def test_format_rate():
    assert [format_rate(x) for x in (20.0, 1 / 60, 1 / 3600, 0.3)] == ["20/s", "1/min",
                                                                      "1/h", "18/min"]


def test_concurrency_counts_per_token():
    c = Concurrency()
    with c.slot("a", 2), c.slot("a", 2):
        with pytest.raises(Limited) as e:
            c.enter("a", 2)
        assert e.value.field == "max_concurrent"
        with c.slot("b", 1):
            pass
    assert c.running("a") == 0


def test_quota_counts_the_creates_under_way():
    q, live = Quota(), []
    with q.reserve("a", 2, lambda: len(live)):
        with q.reserve("a", 2, lambda: len(live)):
            with pytest.raises(Limited) as e:          # two being made: no third
                q.reserve("a", 2, lambda: len(live)).__enter__()
            assert e.value.field == "max_sandboxes"
            live.append(1)
        live.append(2)
    with pytest.raises(Limited):                       # two made
        q.reserve("a", 2, lambda: len(live)).__enter__()
    with q.reserve("a", None, lambda: len(live)):      # no limit
        pass


def test_quota_bounds_every_tokens_together():
    """The server's bound counts every token's live sandboxes and creates under way,
    whatever each token's own max_sandboxes (None: no limit of its own)."""
    live: list[str] = []
    q = Quota(2, lambda: len(live))
    with q.reserve("a", None, lambda: live.count("a")):
        assert q.making == 1
        live.append("b")
        with pytest.raises(Limited) as e:       # one live, one being made: no third
            q.reserve("c", None, lambda: live.count("c")).__enter__()
        assert e.value.field == "max_sandboxes" and "every token" in e.value.message
        live.append("a")
    assert q.making == 0
    with pytest.raises(Limited):                # two live
        q.reserve("c", 5, lambda: live.count("c")).__enter__()
    live.remove("b")                            # one ends: its place is free again
    with q.reserve("c", 5, lambda: live.count("c")):
        pass


def test_a_config(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRAL_TEST_GH", "value-never-read-here")
    f = tmp_path / "npm.token"
    f.write_text("x")
    c = config.from_dict({
        "server": {"host": "0.0.0.0", "port": 9000, "state_dir": "state", "mcp": True},
        "limits": {"rate": "10/s", "burst": 20, "max_sandboxes": 4},
        "secrets": {"GH": "env:CORRAL_TEST_GH", "NPM": {"from": f"file:{f}"}}},
        str(tmp_path / "serve.toml"))
    assert (c.host, c.port, c.mcp) == ("0.0.0.0", 9000, True)
    assert c.state_dir == str(tmp_path / "state")
    assert c.limits == {"rate": 10.0, "burst": 20, "max_sandboxes": 4}
    assert c.secrets == {"GH": "env:CORRAL_TEST_GH", "NPM": f"file:{f}"}


def test_with_sources():
    ceiling = {"network": {"mode": "allow"}, "secrets": {
        "GH": {"hosts": ["api.github.com"]},
        "OWN": {"from": "env:X", "hosts": ["a.example.com"]},
        "UNSET": {"hosts": ["b.example.com"]}}}
    got = config.with_sources(ceiling, {"GH": "env:GH_TOKEN", "OWN": "env:Y"})
    assert got["secrets"] == {"GH": {"hosts": ["api.github.com"], "from": "env:GH_TOKEN"},
                              "OWN": {"from": "env:X", "hosts": ["a.example.com"]}}
    assert ceiling["secrets"]["GH"] == {"hosts": ["api.github.com"]}    # not changed
    checked = config.with_sources(ceiling, None)
    assert checked["secrets"]["UNSET"]["from"] == config.PLACEHOLDER_SOURCE
    assert config.with_sources({"limits": {}}, {"GH": "env:A"}) == {"limits": {}}
