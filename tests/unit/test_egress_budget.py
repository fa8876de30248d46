"""egress/budget.py, the per-domain byte and request budgets: tables over plain data, no
sockets, no event loop. The proxy's own budget tests (test_egress_proxy.py) drive the same
logic through real connections."""

from __future__ import annotations

import ast

import pytest

from corral.egress.budget import DIRECTIONS, Budgets, Usage
from corral.egress.config import Budget

# a step is ("take", key) -> what take_request returns, ("room", key, direction) -> what
# room returns, ("count", key, direction, n) -> None

TAKE_TABLE = [
    # no budget at all: every request passes, bytes are unlimited
    ("unlimited", Budget(), [
        (("take", "a.test"), None), (("take", "a.test"), None),
        (("count", "a.test", "bytes_in", 10**12), None),
        (("room", "a.test", "bytes_in"), None), (("room", "a.test", "bytes_out"), None),
        (("take", "a.test"), None)]),
    # requests: exactly the limit passes, the next is refused, again and again
    ("requests", Budget(requests=2), [
        (("take", "a.test"), None), (("take", "a.test"), None),
        (("take", "a.test"), "budget: requests"), (("take", "a.test"), "budget: requests")]),
    # a zero budget refuses the first request
    ("zero requests", Budget(requests=0), [(("take", "a.test"), "budget: requests")]),
    # keys are independent: one spent host leaves the next untouched (near miss: the
    # wildcard key "*.a.test" is not the host "a.test")
    ("keys", Budget(requests=1), [
        (("take", "a.test"), None), (("take", "a.test"), "budget: requests"),
        (("take", "*.a.test"), None), (("take", "b.test"), None),
        (("take", "*.a.test"), "budget: requests")]),
    # a host whose bytes are spent cannot be asked again, even with requests left
    ("bytes_out spent", Budget(bytes_out=10, requests=5), [
        (("take", "a.test"), None), (("count", "a.test", "bytes_out", 10), None),
        (("take", "a.test"), "budget: bytes_out")]),
    ("bytes_in spent", Budget(bytes_in=10), [
        (("take", "a.test"), None), (("count", "a.test", "bytes_in", 10), None),
        (("take", "a.test"), "budget: bytes_in"), (("take", "b.test"), None)]),
    # one byte short of the limit is not spent
    ("one byte left", Budget(bytes_in=10), [
        (("count", "a.test", "bytes_in", 9), None), (("room", "a.test", "bytes_in"), 1),
        (("take", "a.test"), None)]),
    # several spent: requests are named first, then bytes_out, then bytes_in
    ("order", Budget(bytes_out=1, bytes_in=1, requests=1), [
        (("take", "a.test"), None), (("count", "a.test", "bytes_out", 1), None),
        (("count", "a.test", "bytes_in", 1), None), (("take", "a.test"), "budget: requests")]),
    ("order, bytes", Budget(bytes_out=1, bytes_in=1), [
        (("count", "a.test", "bytes_in", 1), None), (("take", "a.test"), "budget: bytes_in"),
        (("count", "a.test", "bytes_out", 1), None),
        (("take", "a.test"), "budget: bytes_out")]),
]

ROOM_TABLE = [
    # unseen key: the whole limit
    ("fresh", Budget(bytes_out=100), [(("room", "a.test", "bytes_out"), 100)]),
    ("counted", Budget(bytes_out=100), [
        (("count", "a.test", "bytes_out", 40), None), (("room", "a.test", "bytes_out"), 60),
        (("count", "a.test", "bytes_out", 60), None), (("room", "a.test", "bytes_out"), 0)]),
    # the directions are separate budgets; a limit on one leaves the other unlimited
    ("directions", Budget(bytes_in=5), [
        (("count", "a.test", "bytes_out", 1000), None),
        (("room", "a.test", "bytes_in"), 5), (("room", "a.test", "bytes_out"), None)]),
    # past the limit (a caller that overshot) is no room, never negative room
    ("overshoot", Budget(bytes_in=5), [
        (("count", "a.test", "bytes_in", 7), None), (("room", "a.test", "bytes_in"), 0)]),
    # a zero budget has no room from the start
    ("zero", Budget(bytes_out=0), [(("room", "a.test", "bytes_out"), 0)]),
    # counting under one key takes no room from another
    ("keys", Budget(bytes_in=5), [
        (("count", "*.a.test", "bytes_in", 5), None), (("room", "a.test", "bytes_in"), 5),
        (("room", "*.a.test", "bytes_in"), 0)]),
]


def run(b: Budgets, step: tuple):
    match step:
        case ("take", key):
            return b.take_request(key)
        case ("room", key, direction):
            return b.room(key, direction)
        case ("count", key, direction, n):
            return b.count(key, direction, n)
    raise AssertionError(f"bad step {step!r}")


@pytest.mark.parametrize("name,budget,steps", TAKE_TABLE + ROOM_TABLE,
                         ids=[f"take-{t[0]}" for t in TAKE_TABLE] +
                             [f"room-{t[0]}" for t in ROOM_TABLE])
def test_budget_table(name, budget, steps):
    b = Budgets(budget)
    for i, (step, want) in enumerate(steps):
        assert run(b, step) == want, f"{name}: step {i} {step}"


def test_a_refused_request_takes_nothing():
    b = Budgets(Budget(requests=3, bytes_in=10))
    assert b.take_request("a.test") is None
    b.count("a.test", "bytes_in", 10)
    for _ in range(5):
        assert b.take_request("a.test") == "budget: bytes_in"
    assert b.usage("a.test") == Usage(bytes_out=0, bytes_in=10, requests=1)


def test_usage_is_a_copy_and_zero_for_an_unseen_key():
    b = Budgets(Budget())
    assert b.usage("never.test") == Usage()
    b.count("a.test", "bytes_out", 3)
    u = b.usage("a.test")
    u.bytes_out = 999                   # changing the copy changes nothing
    assert b.usage("a.test") == Usage(bytes_out=3)


@pytest.mark.parametrize("direction", ["requests", "bytes", "BYTES_IN", "bytes_in ", ""])
def test_only_the_two_byte_directions(direction):
    b = Budgets(Budget(bytes_in=1, bytes_out=1, requests=1))
    with pytest.raises(ValueError, match="direction"):
        b.room("a.test", direction)
    with pytest.raises(ValueError, match="direction"):
        b.count("a.test", direction, 1)
    assert b.usage("a.test") == Usage()
    assert set(DIRECTIONS) == {"bytes_in", "bytes_out"}


def test_a_negative_count_is_refused():
    b = Budgets(Budget(bytes_in=10))
    with pytest.raises(ValueError, match="negative"):
        b.count("a.test", "bytes_in", -5)
    assert b.room("a.test", "bytes_in") == 10


def test_budget_module_does_no_io():
    """budget.py is pure: it imports no socket, event loop, process or clock module, and
    nothing of the proxy's I/O layer."""
    import corral.egress.budget as mod

    with open(mod.__file__) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(("." * node.level) + (node.module or ""))
    banned = {"socket", "asyncio", "ssl", "select", "selectors", "subprocess", "time",
              "os", ".server", ".relay", ".forward", ".terminate"}
    assert not names & banned, sorted(names & banned)


def test_refund_gives_back_what_was_set_aside():
    b = Budgets(Budget(bytes_in=100))
    b.count("a.test", "bytes_in", 60)          # a relay thread's grant, counted ahead
    assert b.room("a.test", "bytes_in") == 40
    b.refund("a.test", "bytes_in", 25)         # it moved 35 of the 60
    assert b.room("a.test", "bytes_in") == 65 and b.usage("a.test").bytes_in == 35
    b.refund("a.test", "bytes_in", 1000)       # never below zero
    assert b.usage("a.test").bytes_in == 0
    with pytest.raises(ValueError):
        b.refund("a.test", "bytes_in", -1)
    with pytest.raises(ValueError):
        b.refund("a.test", "requests", 1)
