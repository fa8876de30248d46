"""`corral probe`: the whole catalogue on every tier available here (through the CLI, as a
user runs it), and the probe's own machinery on real sandboxes: a leak is scored as a
leak, a failed control is never "contained", filters, usage errors, reports."""

import json
import os
import subprocess

import pytest
from conftest import CORRAL

from corral.probe import available_tiers
from corral.probe.canaries import Canaries
from corral.probe.cases import CATEGORIES, Case, load_cases
from corral.probe.runner import Runner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the probe's tiers need root here")

TIERS, _ = available_tiers()
KEYS = {"id", "category", "tier", "expected", "contained", "reason"}


def probe(*args, timeout=900):
    return subprocess.run([CORRAL, "probe", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def full():
    """One run of the whole catalogue on every tier available here."""
    p = probe("--json")
    return p, json.loads(p.stdout)


@pytest.mark.timeout(900)
@pytest.mark.slow   # the whole catalogue on every tier: minutes
def test_every_claim_holds_on_every_tier_here(full):
    p, doc = full
    broken = [f"{c['tier']} {c['id']}: {c['status']}: {c['reason']}"
              for c in doc["cases"] if c["expected"] and c["status"] != "contained"
              and c["status"] not in ("refused", "unsupported")]
    assert broken == [], "\n".join(broken)
    assert p.returncode == 0, p.stderr


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_catalogue_shape_and_coverage(full):
    _, doc = full
    ids = {c["id"] for c in doc["cases"]}
    assert len(ids) >= 60
    assert {c["category"] for c in doc["cases"]} == set(CATEGORIES)
    assert {c["tier"] for c in doc["cases"]} == set(TIERS)
    assert len(doc["cases"]) == len(ids) * len(TIERS)  # every case on every tier, once
    for c in doc["cases"]:
        assert KEYS <= set(c)
        assert isinstance(c["expected"], bool) and c["contained"] in (True, False, None)
        assert c["reason"] and isinstance(c["reason"], str)
        if c["contained"] is None:
            assert c["status"] in ("refused", "unsupported", "invalid", "inconclusive")
    # the namespace tier claims (almost) everything: most cells there must be claimed
    ns = [c for c in doc["cases"] if c["tier"] == "namespace"]
    assert sum(c["expected"] for c in ns) >= 0.8 * len(ns)


def _case(**kw) -> Case:
    base = dict(id="t.case", category="fs-secrets", description="test", claims=("host_fs_hidden",),
                code='read_file(FAKE_HOME + "/.ssh/id_ed25519")', control="host",
                contained="no token anywhere")
    base.update(kw)
    return Case(**base)


@pytest.fixture(scope="module")
def runner():
    cn = Canaries().plant()
    yield Runner(cn)
    cn.remove()


def test_a_leak_is_scored_as_a_leak(runner):
    """The fake home bound into the sandbox on purpose: the scorer must see the token."""
    leaky = _case(policy={"filesystem": {"ro_binds": ["{FAKE_HOME}"]}})
    cell = runner.cell(leaky, "namespace")
    assert cell.expected is True  # the tier still claims host_fs_hidden for its own root
    assert (cell.status, cell.contained) == ("not-contained", False), cell.reason
    assert cell.reason.startswith("READ: canary reached stdout")
    assert cell.failing


def test_write_and_sink_are_detected(runner):
    ws = _case(policy={"filesystem": {"workspace": {"path": "{HOST_DIR}", "mode": "rw"}}},
               code='open("/workspace/planted", "w").write("x"); out("DENIED", "nothing")',
               control={"policy": {}})
    cell = runner.cell(ws, "namespace")
    assert cell.contained is False and cell.reason.startswith("WRITE: host file shared/planted")
    obs = runner.run_host('send_sink("x " + DATA); out("DENIED", "no")')
    assert runner.evidence(obs) == "READ: canary reached the TCP/UDP sink"


def test_a_failed_control_is_invalid_never_contained(runner):
    broken = _case(code='read_file(FAKE_HOME + "/.ssh/no-such-key")')
    cell = runner.cell(broken, "namespace")
    assert (cell.status, cell.contained) == ("invalid", None)
    assert "positive control did not succeed" in cell.reason and cell.failing
    unsupported = _case(code='out("UNSUPPORTED", "this host has no such thing")')
    cell = runner.cell(unsupported, "namespace")
    assert (cell.status, cell.contained, cell.failing) == ("unsupported", None, False)


def test_no_probe_line_is_inconclusive(runner):
    silent = _case(code="pass", control={"code": 'read_file(FAKE_HOME + "/.netrc")',
                                         "where": "host"})
    cell = runner.cell(silent, "namespace")
    assert (cell.status, cell.contained) == ("inconclusive", None) and cell.failing


def test_a_refused_policy_counts_only_for_the_field_the_case_names(runner):
    """REFUSED_BY: corral refusing the case's policy on that field is containment (after a
    control that works); a refusal on another field is a broken case, never contained."""
    link = _case(policy={"filesystem": {"workspace": {"path": "{PROBE_ROOT}/workspace/sub"}}},
                 code='read_file(".ssh/id_ed25519")', refused_by="filesystem.workspace.path",
                 control={"where": "host", "code":
                          'read_file(PROBE_ROOT + "/workspace/sub/.ssh/id_ed25519")'})
    cell = runner.cell(link, "namespace")
    assert (cell.status, cell.contained, cell.expected) == ("contained", True, True), cell.reason
    assert "symbolic link" in cell.reason
    other = _case(policy={"filesystem": {"ro_binds": ["{PROBE_ROOT}/workspace/sub"]}},
                  code='read_file(".ssh/id_ed25519")', refused_by="filesystem.workspace.path")
    cell = runner.cell(other, "namespace")
    assert (cell.status, cell.contained) == ("invalid", None), cell.reason


def test_safety_gate_scores_not_run_without_running(runner):
    gated = _case(code='open(MARKER, "w")', safety=("no_such_property",))
    cell = runner.cell(gated, "namespace")
    assert (cell.status, cell.contained) == ("not-run", False)
    assert not os.path.exists(runner.cn.marker)


def test_category_filter_report_and_json_shape(tmp_path):
    rep = tmp_path / "m.md"
    p = probe("--json", "--category", "kernel", "--isolation", "namespace", "--report",
              str(rep))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    kernel = [c.id for c in load_cases() if c.category == "kernel"]
    assert sorted(c["id"] for c in doc["cases"]) == sorted(kernel)
    assert {c["category"] for c in doc["cases"]} == {"kernel"}
    text = rep.read_text()
    assert "| case | namespace |" in text and all(f"`{i}`" in text for i in kernel)
    html = tmp_path / "m.html"
    p = probe("--case", "fs.ssh-key", "--isolation", "namespace", "--report", str(html))
    assert p.returncode == 0 and "fs.ssh-key" in html.read_text()
    assert "<table>" in html.read_text()
    assert "namespace: 1/1 claimed cases contained, 0 broken" in p.stdout


@pytest.mark.parametrize("args", [["--isolation", "nosuch"], ["--category", "nosuch"],
                                  ["--bogus"], ["--report", "x.txt"], ["--isolation"],
                                  ["--case", "no.such-case"]])
def test_usage_errors_exit_2(args):
    p = probe(*args)
    assert p.returncode == 2 and p.stderr.startswith("corral: ") and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1
