"""The audit writer's JSON (audit/store._dumps, made without importing json) is JSON that
json.loads reads back to the same value."""

import json

import pytest

from corral.audit.store import _dumps


@pytest.mark.parametrize("value", [
    {"kind": "net", "host": "a\"b\\c\n\u00e9\u2028\x01", "port": 443, "bytes_in": 0},
    [1, -2, 2.5, 1e300, None, True, False, "", [], {}],
    {"nested": {"list": [{"x": 0.1}]}},
])
def test_dumps_round_trips(value):
    assert json.loads(_dumps(value)) == value


def test_other_values_become_strings():
    assert json.loads(_dumps({"t": (1, 2), "o": object.__name__, "n": float("nan")})) == {
        "t": [1, 2], "o": "object", "n": None}
