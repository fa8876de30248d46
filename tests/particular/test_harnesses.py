"""The reliability harnesses of issue 23 (bench/concurrency.py, bench/soak.py) run, small,
in the suite, so that one that no longer runs (an import, a renamed API, a leak count that
no longer reads) fails here and not on the day its figures are wanted
(docs/reliability.md). Real sandboxes, real proxies,
a real local resolver (dnsmasq) for network allow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import ROOT, tier_unavailable

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the harnesses run as root"),
    pytest.mark.skipif(not shutil.which("dnsmasq"), reason="network allow needs dnsmasq"),
    pytest.mark.skipif(tier_unavailable("namespace") is not None,
                       reason=f"namespace tier: {tier_unavailable('namespace')}"),
]

PY = os.path.join(ROOT, ".venv", "bin", "python")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_concurrency_harness_runs_small_and_finds_nothing_left(tmp_path):
    """bench/concurrency.py with 3 sandboxes for 3 s, network none then allow (each
    sandbox with its egress proxy): every command ran without error, latency and memory
    per sandbox are reported, and its leak counts found nothing left."""
    out = tmp_path / "conc.json"
    r = subprocess.run([PY, "bench/concurrency.py", "--n", "3", "--seconds", "3",
                        "--modes", "none,allow", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "no errors, nothing left" in r.stdout
    got = {x["mode"]: x for x in json.loads(out.read_text())["results"]}
    assert set(got) == {"none", "allow"}
    for mode, x in got.items():
        assert x["n"] == 3 and x["errors"] == 0 and not x["grew"], (mode, x)
        assert x["commands"] >= 6, (mode, x)          # about one a second each
        assert 0 < x["p50_ms"] <= x["p99_ms"] <= x["max_ms"], (mode, x)
        assert x["pss_per_sandbox_mb"] > 0, (mode, x)
        # the counts were read: the rows of what a sandbox makes are there
        assert {"run dirs", "proxies (not the zygote)", "sandbox-uid processes",
                "supervisor fds"} <= set(x["after"]), x["after"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_soak_harness_runs_small_and_finds_nothing_left(tmp_path):
    """bench/soak.py --runs 16 on the namespace tier: every kind of the mix (true, python,
    a fork, a timeout, an oom, network allow, a secret grant, review mode) twice, each
    Result as expected, and its leak counts found nothing left."""
    out = tmp_path / "soak.json"
    r = subprocess.run([PY, "bench/soak.py", "--runs", "16", "--tier", "namespace",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=280)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    (x,) = json.loads(out.read_text())["results"]
    assert x["tier"] == "namespace" and x["runs"] == 16, x
    assert x["errors"] == 0 and not x["grew"] and x["dropped"] == {}, x
    assert set(x["kinds"]) >= {"true", "python", "fork", "timeout", "oom", "net", "secret",
                               "review"}, x["kinds"]
    # the counts were read: the rows of what a run makes are there (judged by "grew")
    assert {"run dirs", "proxies (not the zygote)", "sandbox-uid processes",
            "supervisor fds"} <= set(x["after"]), x["after"]
