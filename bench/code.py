"""run_code("1+1") round trip in a warm context, side by side with a local Jupyter kernel.

    .venv/bin/python bench/code.py [--quick] [--runs N] [--json FILE]

Contenders, each timed on the same cell, `1+1`, N times (default 300, --quick 50) after 20
warm-up cells, in rounds that alternate them (default 3, --quick 1):

  run_code namespace   sb.run_code("1+1") in a warm python context of a namespace sandbox
                       (corral's runner over Sandbox.exec with a stdin pipe)
  run_code gvisor      the same on the gvisor tier (skipped where runsc cannot run)
  run_code live        the same in a live namespace sandbox (Sandbox.create): the runner
                       is a stream command of the sandbox (a real SIGINT, per-cell caps)
  ipykernel live       a live namespace sandbox whose python3 is bench/.venv's (mounted
                       read-only at its own path): a real IPython kernel inside, reached
                       through corral's bridge (guest/kernel.py) over the same frames
  jupyter (local)      a local ipykernel (bench/.venv: jupyter_client + ipykernel from
                       requirements/bench.lock) driven by jupyter_client's
                       BlockingKernelClient: execute, then wait for execute_reply and the
                       kernel's return to idle on iopub (what a notebook waits for);
                       no sandbox at all

The figure is the median per contender (over all rounds' samples) and its ratio to the
local Jupyter kernel. Goal (issue 16): run_code median <= 1 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH_PY = os.path.join(HERE, ".venv", "bin", "python")
GOAL_MS = 1.0
CELL = "1+1"


def time_run_code(tier: str, runs: int, warm: int = 20, live: bool = False,
                  kernel: bool = False) -> list[float] | str:
    import corral

    policy = {"isolation": tier, "limits": {"cpu_time": "1h"}}
    if kernel:
        venv = os.path.join(HERE, ".venv")
        if not os.access(BENCH_PY, os.X_OK):
            return "bench/.venv is missing (see jupyter (local))"
        policy.update(filesystem={"workspace": {"path": venv, "mode": "ro",
                                                "mount_at": "same"}},
                      env={"set": {"PATH": f"{venv}/bin:/usr/bin:/bin"}})
    box = corral.Sandbox.create(policy, timeout=3600) if live else corral.Sandbox(policy)
    with box as sb:
        ctx = sb.create_context("python", engine="ipykernel" if kernel else "runner")
        for _ in range(warm):
            assert sb.run_code(CELL, context=ctx).text == "2"
        out = []
        for _ in range(runs):
            t = time.perf_counter()
            ex = sb.run_code(CELL, context=ctx)
            out.append((time.perf_counter() - t) * 1000)
            assert ex.text == "2"
        return out


def jupyter_child(runs: int, warm: int) -> None:
    """In bench/.venv: a local ipykernel's round trips, as JSON on stdout."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def once() -> float:
            t = time.perf_counter()
            msg_id = kc.execute(CELL)
            text = None
            while True:           # the result, then the kernel idle again for this request
                m = kc.get_iopub_msg(timeout=30)
                if m["parent_header"].get("msg_id") != msg_id:
                    continue
                if m["msg_type"] == "execute_result":
                    text = m["content"]["data"]["text/plain"]
                if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                    break
            kc.get_shell_msg(timeout=30)       # the execute_reply
            ms = (time.perf_counter() - t) * 1000
            assert text == "2", text
            return ms

        for _ in range(warm):
            once()
        print(json.dumps([once() for _ in range(runs)]))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def time_jupyter(runs: int, warm: int = 20) -> list[float] | str:
    if not os.access(BENCH_PY, os.X_OK):
        return "bench/.venv is missing: python -m venv bench/.venv && bench/.venv/bin/pip " \
               "install --require-hashes --only-binary=:all: -r requirements/bench.lock"
    p = subprocess.run([BENCH_PY, os.path.abspath(__file__), "--jupyter-child", str(runs),
                        str(warm)], check=False, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        return "jupyter kernel failed: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--json")
    ap.add_argument("--jupyter-child", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.jupyter_child:
        jupyter_child(*a.jupyter_child)
        return 0
    sys.path.insert(0, os.path.join(ROOT, "src"))
    runs = a.runs or (50 if a.quick else 300)
    rounds = a.rounds or (1 if a.quick else 3)
    from corral.errors import CorralError

    contenders = {
        "run_code namespace": lambda: time_run_code("namespace", runs),
        "run_code gvisor": lambda: time_run_code("gvisor", runs),
        "run_code live": lambda: time_run_code("namespace", runs, live=True),
        "ipykernel live": lambda: time_run_code("namespace", runs, live=True, kernel=True),
        "jupyter (local)": lambda: time_jupyter(runs),
    }
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    skipped: dict[str, str] = {}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name in skipped:
                continue
            try:
                got = contenders[name]()
            except CorralError as e:
                got = str(e)
            if isinstance(got, str):
                skipped[name] = got
            else:
                samples[name] += got
    jup = statistics.median(samples["jupyter (local)"]) if samples["jupyter (local)"] else None
    rows = []
    print(f"run_code({CELL!r}) round trip, {runs} runs x {rounds} rounds "
          f"(goal: run_code median <= {GOAL_MS:g} ms)")
    print(f"  {'contender':<20} {'median ms':>10} {'p90 ms':>8} {'vs jupyter':>11}")
    for name in names:
        if name in skipped:
            print(f"  {name:<20} skipped: {skipped[name]}")
            rows.append({"contender": name, "skipped": skipped[name]})
            continue
        xs = sorted(samples[name])
        med, p90 = statistics.median(xs), xs[int(len(xs) * 0.9) - 1]
        ratio = f"{med / jup:.2f}x" if jup else "-"
        print(f"  {name:<20} {med:>10.3f} {p90:>8.3f} {ratio:>11}")
        rows.append({"contender": name, "median_ms": med, "p90_ms": p90,
                     "ratio_to_jupyter": med / jup if jup else None, "samples_ms": xs})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cell": CELL, "runs": runs, "rounds": rounds, "goal_ms": GOAL_MS,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
