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


@pytest.mark.parametrize("value", [
    {"receipt": 1, "body": {"argv": ["printf", "\u00e9\"\\\x7f\x01"], "usage": {
        "wall_s": 0.048836, "cpu_s": None, "memory_peak_bytes": 3379200}, "signal": None,
        "egress": {"allowed": 0, "denied": 2}, "ok": True}, "key": "ed25519:AAAA",
     "signature": "x/y+=="},
    {"n": float("nan"), "t": (1, 2)},      # what json cannot write as _dumps does
    {"o": object()},
])
def test_a_nodes_receipt_is_stored_as_dumps_writes_it(value):
    """A batch node's receipt, stored by the C encoder (store._receipt_json), is the text
    store._dumps gives: the store's receipt column reads the same whichever wrote it."""
    from corral.audit.store import _receipt_json

    assert _receipt_json(value) == _dumps(value)


def test_the_receipt_shortcuts_are_what_they_stand_for():
    """receipt.body's shortcuts (the sha of no egress, the policy's sha kept per text) give
    what hashing gives."""
    from corral.audit import receipt as rc

    assert rc.NO_EGRESS == rc.sha(rc.canonical([]))
    kw = dict(run_id="r-1", started=1.0, ended=2.0, tier="namespace", image_digest="host",
              argv=["true"], stdin=b"", stdout=b"", stderr=b"", changes=None,
              verdict="ok", exit_code=0, signal=None, usage={}, actor="user:x")
    net = {"kind": "net", "decision": "deny", "host": "example.com"}
    for toml in ("a = 1\n", "b = 2\n", "a = 1\n"):
        b = rc.body(policy_toml=toml, events=[net], **kw)
        assert b["policy_sha256"] == rc.sha(toml.encode())
        assert b["egress_sha256"] == rc.sha(rc.canonical([net]))
        assert rc.body(policy_toml=toml, events=[{"kind": "audit"}], **kw)[
            "egress_sha256"] == rc.NO_EGRESS
    assert rc.canonical({"b": [1, "\u00e9"], "a": None}) == json.dumps(
        {"b": [1, "\u00e9"], "a": None}, sort_keys=True, separators=(",", ":"),
        ensure_ascii=True).encode()


def test_a_plans_found_ops_are_a_new_list_each_time():
    """Plan.find keeps what it found per type: each call still returns a list of its own,
    in the plan's order, subclasses included."""
    from corral.plan import Op, Rlimit
    from corral.policy import Policy
    from corral.runtime.sandbox import Sandbox

    plan = Sandbox(Policy()).plan
    first = plan.find(Rlimit)
    assert first and first == [op for op in plan.ops if isinstance(op, Rlimit)]
    first.clear()
    assert plan.find(Rlimit) == [op for op in plan.ops if isinstance(op, Rlimit)]
    assert plan.find(Op) == list(plan.ops)
    assert plan.replace() == plan and hash(plan.replace()) == hash(plan)
