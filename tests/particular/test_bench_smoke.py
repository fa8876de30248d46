"""Every script of bench/ that no other test runs, run once with its smallest arguments, as
a user runs it (a subprocess from the repository root): it exits 0 and prints its table's
header. A bench that no longer runs (an import, a renamed API, a changed Result) fails
here, not on the day its figures are wanted. Figures are not judged: the machine is
shared and the runs are few. Tested elsewhere: bench/soak.py and bench/concurrency.py
(test_harnesses.py), bench/fuzz/ (tests/fuzz/test_fuzz_atheris.py), bench/report.py's
summary (tests/faces/test_usability.py); bench/all.py here, on a copy of the tree (it
rewrites docs/benchmarks.md and the README). The modules the scripts import (leaks,
peers, network_clients, _interleave, _serve) run through them.

The two scripts that mostly wait (idle.py and serve_idle.py, each past
runtime/live.ENTRANT_KEEP_S) start with the module and are collected last, so that their
waits overlap the others' runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from conftest import ROOT, tier_unavailable
from vmfix import microvm_unusable

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the benches run as root"),
    pytest.mark.skipif(tier_unavailable("namespace") is not None,
                       reason=f"namespace tier: {tier_unavailable('namespace')}"),
]

PY = os.path.join(ROOT, ".venv", "bin", "python")
SRC = os.path.join(ROOT, "src")     # the "before" tree of the A/B scripts: this one (A/A)
BENCH_VENV_PY = os.path.join(ROOT, "bench", ".venv", "bin", "python")


def _env(state: str | None = None) -> dict:
    """The environment a user runs a bench with: the suite's own settings left out (a
    module fixture may have set CORRAL_STATE_DIR), the state directory given if any."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_STATE_DIR"}
    if state:
        env["CORRAL_STATE_DIR"] = state
    return env


def _check(p: subprocess.CompletedProcess | tuple, header: str) -> None:
    rc, out, err = (p.returncode, p.stdout, p.stderr) if not isinstance(p, tuple) else p
    assert rc == 0, f"exit {rc}\n{out[-3000:]}\n{err[-3000:]}"
    assert re.search(header, out, re.M), f"no {header!r} in:\n{out[-3000:]}"


def _run(args: list[str], env: dict | None = None, timeout: float = 240):
    return subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env or _env())


def _have(module: str, python: str = PY) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def _gvisor() -> bool:
    return tier_unavailable("gvisor") is None


# (script and arguments, a regular expression of its table's header or summary line)
PLAIN = [
    (["bench/audit.py", "--runs", "2"], r"^corral\.run /bin/true, median of 2: off .* on "),
    (["bench/audit_cli.py", "--rounds", "2"], r"^corral run -- /bin/true, 2 paired rounds"),
    (["bench/batch.py", "--quick", "--jobs", "6", "--rounds", "1"],
     r"^6 jobs of /usr/bin/python3 -c pass, 2 at once"),
    (["bench/batch_cpu.py", "--jobs", "4", "--pairs", "1"], r"^this median of 1: own "),
    (["bench/cli_breakdown.py", "--runs", "2"], r"^  stage +median ms +min ms$"),
    (["bench/files.py", "--runs", "2", "--size", "1"], r"^1 MB, 2 runs, median ms"),
    (["bench/flood.py", "--runs", "1"],
     r"^/usr/bin/head -c 1G /dev/zero with limits\.output = 1M, median of 1"),
    (["bench/imports.py", "--runs", "1", "--top", "3"], r"^ cumul ms +self ms depth +module$"),
    (["bench/live_ab.py", "--baseline", SRC, "--runs", "3"], r"^median ms +baseline +this$"),
    (["bench/live_net_ab.py", "--baseline", SRC, "--runs", "3"],
     r"^ +baseline ms +miss +this ms +miss$"),
    (["bench/memory.py", "--quick", "--counts", "1"],
     r"^goal one more idle namespace sandbox <= 10 MB"),
    (["bench/network.py", "--runs", "1", "--requests", "5", "--storm", "10"],
     r"^  variant +median MB/s"),
    (["bench/network_cgroup.py", "--rounds", "1"], r"^direct \(curl on the host\)"),
    (["bench/oneshot.py", "--pairs", "3"], r"^  corral\.run, per step: wall ms p50 / p99"),
    (["bench/relay_ceiling.py", "--runs", "1"], r"^  variant +MB/s +min +max +x direct"),
    (["bench/review_stages.py", "review", "3"], r"^  slowest runs:$"),
    (["bench/serve_files.py", "--mib", "1", "--rounds", "1"],
     r"^download 1 MiB, median of 1: corral serve"),
    (["bench/service.py", "--runs", "2"], r"^ +median ms +p95 ms +goal$"),
    (["bench/service_interleaved.py", "--before", SRC, "--runs", "3"],
     r"^interleaved call by call, 3 calls"),
    (["bench/service_lean.py", "--runs", "2"], r"^ +median ms +p25 ms +/inproc"),
    (["bench/service_paired.py", "--before", SRC, "--rounds", "1", "--runs", "2"],
     r"^  after/before, round by round"),
    (["bench/service_speed.py", "--runs", "2", "--skip", "concurrent"],
     r"^ +http ms +in-proc ms"),
    (["bench/startup.py", "--runs", "2", "--no-runsc"], r"^  variant +median ms +p95 ms"),
    (["bench/syscalls.py", "--runs", "2"], r"^allowed +unobserved"),
    (["bench/tail_stages.py", "--rounds", "3"], r"^  slowest true runs"),
    (["bench/throughput.py", "--seconds", "0.3", "--rounds", "1", "--parallel", "1,2"],
     r"^  contender +P=1 +P=2$"),
]


@pytest.fixture(scope="module")
def waiting():
    """idle.py and serve_idle.py, started at once: {name: Popen}; each test collects its
    own. Both are killed at the end if a test did not."""
    procs = {
        "idle": subprocess.Popen([PY, "bench/idle.py", "--n", "2", "--first", "1",
                                  "--modes", "allow"], cwd=ROOT, env=_env(), text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        "serve_idle": subprocess.Popen([PY, "bench/serve_idle.py", "none", "1"], cwd=ROOT,
                                       env=_env(), text=True, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE),
    }
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.communicate()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args,header", PLAIN, ids=[a[0].split("/")[1] for a, _ in PLAIN])
def test_bench_runs_small(args, header, waiting):
    _check(_run(args), header)


@pytest.mark.timeout(300)
def test_live_bench():
    """gVisor's rows when this host has runsc, else the namespace tier's alone."""
    tiers = "namespace,gvisor" if _gvisor() else "namespace"
    _check(_run(["bench/live.py", "--runs", "3", "--tiers", tiers]),
           r"^live sandboxes \(.*\), 3 runs each")


@pytest.mark.timeout(300)
def test_compare_bench():
    """The peers (npm packages) left out; runsc's rows only where it runs."""
    args = ["bench/compare.py", "--quick", "--runs", "1", "--no-peers"]
    _check(_run(args + ([] if _gvisor() else ["--no-runsc"])), r"^  contender +median +p95")


@pytest.mark.timeout(300)
def test_code_bench():
    """Its rows for an ipykernel say why where bench/.venv is missing; gVisor's are timed."""
    if not _gvisor():
        pytest.skip(f"its run_code gvisor row needs the tier: {tier_unavailable('gvisor')}")
    _check(_run(["bench/code.py", "--runs", "5", "--rounds", "1"]),
           r"^  contender +median ms +p90 ms +vs jupyter")


@pytest.mark.timeout(300)
def test_e2b_sdk_bench():
    if not _have("e2b_code_interpreter"):
        pytest.skip("needs the e2b SDK in .venv (requirements/dev.lock)")
    _check(_run(["bench/e2b_sdk.py", "--runs", "1"]), r"^  run_code: e2b / native = ")


@pytest.mark.timeout(300)
def test_wasm_bench(wasm_state):
    _check(_run(["bench/wasm.py", "--runs", "2"], _env(wasm_state)), r"^print\(1\): wasm ")


@pytest.mark.timeout(300)
def test_images_bench(mini_image):
    """Its startup section on the suite's image (install downloads wheels from PyPI, and
    build is test_images_run's two-builds test)."""
    state, name, _ = mini_image
    _check(_run(["bench/images.py", "--only", "startup", "--image", name, "--runs", "2"],
                _env(state)), r"^startup /bin/true +host ")


@pytest.mark.timeout(300)
def test_microvm_bench(mini_image):
    why = microvm_unusable()
    if why:
        pytest.skip(why)
    state, name, _ = mini_image
    _check(_run(["bench/microvm.py", "--image", name, "--runs", "1", "--idle", "1"],
                _env(state)), r"^  python3 pass microvm / namespace: ")


@pytest.mark.timeout(300)
def test_all_bench_on_a_copy_of_the_tree(tmp_path):
    """bench/all.py --only flood --quick --no-peers in a copy of bench/, docs/ and the
    README (src, tests and the venvs linked): it runs the section, then report.py writes
    the copy's docs/benchmarks.md and README block."""
    if not os.access(BENCH_VENV_PY, os.X_OK):
        pytest.skip("needs bench/.venv (scripts/setup.sh)")
    root = tmp_path / "tree"
    shutil.copytree(os.path.join(ROOT, "bench"), root / "bench", symlinks=True,
                    ignore=shutil.ignore_patterns(".venv", ".peers", "out", "__pycache__"))
    shutil.copytree(os.path.join(ROOT, "docs"), root / "docs")
    shutil.copy(os.path.join(ROOT, "README.md"), root / "README.md")
    for name in ("src", "tests", ".venv", "pyproject.toml", "requirements", ".git"):
        os.symlink(os.path.join(ROOT, name), root / name)
    os.symlink(os.path.join(ROOT, "bench", ".venv"), root / "bench" / ".venv")
    before = (root / "docs" / "benchmarks.md").read_text()
    p = subprocess.run([PY, "bench/all.py", "--only", "flood", "--quick", "--no-peers"],
                       cwd=root, capture_output=True, text=True, timeout=240, env=_env())
    _check(p, r"^=== report: bench/report\.py")
    assert (root / "bench" / "out" / "flood.json").exists()
    assert (root / "docs" / "benchmarks.md").read_text() != before


@pytest.mark.timeout(300)
def test_idle_bench(waiting):
    out, err = waiting["idle"].communicate(timeout=240)
    _check((waiting["idle"].returncode, out, err), r"^goal idle live sandbox, network allow")


@pytest.mark.timeout(300)
def test_serve_idle_bench(waiting):
    out, err = waiting["serve_idle"].communicate(timeout=240)
    _check((waiting["serve_idle"].returncode, out, err), r'^\{"mode": "none", "n": 1, ')
