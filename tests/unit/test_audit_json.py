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


def test_the_spool_form_of_a_policy_prints_its_toml(tmp_path):
    """What `corral run` writes for its policy (audit/record.py: no TOML, no digest on the
    run's path) is printed at ingest to the same text dump_toml gives: the default policy,
    a workspace, secrets (a literal's value never in the line), env, network, limits."""
    from corral.audit.record import dumps, policy_form
    from corral.policy import Policy, dump_toml, policy_from_dict
    from corral.policy.dump import dump_form

    assert policy_form(Policy()) == {}
    assert dump_form(json.loads(dumps(policy_form(Policy())))) == dump_toml(Policy())
    p = policy_from_dict({
        "filesystem": {"workspace": {"path": str(tmp_path), "mode": "review"},
                       "ro_binds": [str(tmp_path)]},
        "env": {"pass": ["LANG"], "set": {"A": "1 \"é\"", "B": "\x7f"}},
        "network": {"mode": "allow", "allow": ["*.example.com:443"],
                    "nameservers": ["127.0.0.1"]},
        "limits": {"memory": "300m", "timeout": "1500ms", "cpu_time": 0.30000000000000004},
        "secrets": {"T": {"from": "env:T", "hosts": ["api.example.com"], "ttl": "2m"},
                    "L": {"value": "hunter2-literal", "hosts": ["x.example.com"]}}})
    line = dumps(policy_form(p))
    assert "hunter2-literal" not in line
    assert dump_form(json.loads(line)) == dump_toml(p)


@pytest.mark.parametrize("form", [
    {"values": {"isolation": 1e999}, "secrets": []}, {"values": [], "secrets": 3},
    {"values": {}, "secrets": []}, {"nonsense": True}])
def test_a_form_that_cannot_be_printed_keeps_the_run_and_says_so(form):
    from corral.audit.spool import _policy_of_form

    rec = {"policy": "", "policy_digest": "", "events": [], "policy_form": form,
           "version": "x"}
    _policy_of_form(rec)
    assert rec["policy"] == "" and "policy_form" not in rec
    assert rec["events"][0]["kind"] == "audit" and "could not be printed" in \
        rec["events"][0]["message"]
