"""policy/narrow.py: a batch job's own policy may narrow the batch's, never widen it."""

import pytest

from corral.policy import merge, policy_from_dict
from corral.policy.narrow import widening

BASE = {"isolation": "namespace", "limits": {"memory": "512M", "timeout": "60s"},
        "network": {"mode": "allow", "allow": ["a.test", "b.test"], "deny": ["x.a.test"]},
        "env": {"pass": ["HOME"]}}


def check(over):
    return widening(policy_from_dict(BASE), policy_from_dict(merge(BASE, over)))


@pytest.mark.parametrize("over", [
    {}, {"limits": {"memory": "64M", "timeout": "1s", "pids": 16}},
    {"isolation": "gvisor"}, {"network": {"mode": "none", "allow": [], "deny": []}},
    {"network": {"allow": ["a.test"]}}, {"network": {"deny": ["x.a.test", "y.test"]}},
    {"env": {"pass": [], "set": {"ANY": "thing"}}},
])
def test_narrowing_overrides_pass(over):
    assert check(over) is None


@pytest.mark.parametrize("over,key", [
    ({"limits": {"memory": "1G"}}, "limits.memory"),
    ({"limits": {"cpus": 2}}, "limits.cpus"),
    ({"isolation": "process"}, "isolation"),
    ({"isolation": "auto"}, "isolation"),
    ({"network": {"allow": ["a.test", "c.test"]}}, "network.allow"),
    ({"network": {"deny": []}}, "network.deny"),
    ({"network": {"allow_private": ["10.0.0.0/8"]}}, "network.allow_private"),
    ({"network": {"budget": {"requests": 10**6}}}, "network.budget.requests"),
    ({"env": {"pass": ["HOME", "PATH"]}}, "env.pass"),
    ({"filesystem": {"ro_binds": ["/usr/share"]}}, "filesystem.ro_binds"),
    ({"batch": {"reuse": True}}, "batch.reuse"),
])
def test_widening_overrides_name_the_key(over, key):
    found = check(over)
    assert found is not None and found[0] == key, found


def test_workspace_mode_only_narrower(tmp_path):
    base = {"filesystem": {"workspace": {"path": str(tmp_path), "mode": "review"}}}
    b = policy_from_dict(base)
    ro = policy_from_dict(merge(base, {"filesystem": {"workspace": {"path": str(tmp_path),
                                                                    "mode": "ro"}}}))
    rw = policy_from_dict(merge(base, {"filesystem": {"workspace": {"path": str(tmp_path),
                                                                    "mode": "rw"}}}))
    assert widening(b, ro) is None
    assert widening(b, rw)[0] == "filesystem.workspace.mode"
    assert widening(policy_from_dict({}), ro)[0] == "filesystem.workspace"


def test_a_network_none_batch_takes_no_network_job():
    assert widening(policy_from_dict({}), policy_from_dict(
        {"network": {"mode": "allow"}}))[0] == "network.mode"


@pytest.mark.parametrize("job,widens", [
    ("wasm", False), ("gvisor", True), ("microvm", True), ("namespace", True),
])
def test_a_wasm_batch_takes_no_native_tier(job, widens):
    """The wasm tier runs Python modules in a WASI runtime only: a job moving to any
    native tier (gvisor, microvm: ranked as strong or stronger) could run a shell, any
    binary and subprocesses, which the batch's tier never grants."""
    found = widening(policy_from_dict({"isolation": "wasm"}),
                     policy_from_dict({"isolation": job}))
    assert (found is not None and found[0] == "isolation") is widens, found
