"""The microvm tier's start-up, labelled with its accelerator (TCG or KVM), beside the
namespace tier on the same image in one run.

    CORRAL_STATE_DIR=/var/cache/corral-test/state \\
        .venv/bin/python bench/microvm.py --image NAME [--runs N] [--json FILE]

  cold boot      a fresh QEMU booting the guest kernel and initramfs to the agent's ready
                 frame, then `true` run in it: open() + exec() with MicrovmBackend(warm=False)
  restore        a fresh QEMU restored from the warm template to first result: open() +
                 exec() with the default backend (the template made once beforehand)
  namespace      the same `true` on the namespace tier with the same image (open + exec)
  corral run     the whole `corral run --isolation microvm -- true` command (warm)

and of live sandboxes (`corral.Sandbox.create`), microvm beside namespace on the image:

  live create    Sandbox.create (a restore, for microvm) to the first command's result
  python3 pass   `/usr/bin/python3 -c pass` through sb.commands.run in a live sandbox
  idle memory    per idle live sandbox: for microvm, QEMU's proportional set size (PSS,
                 /proc/PID/smaps_rollup) and its cgroup's memory usage; for namespace, the
                 sandbox cgroup's memory usage (--idle N sandboxes at once, default 2)

Medians of N runs (default 3), alternating. On a shared, loaded machine the figures are
indicative; the accelerator is measured, not assumed (backends/microvm_assets.kvm_usable).
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
sys.path.insert(0, os.path.join(ROOT, "src"))
CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")


def timed_open_exec(policy, backend=None) -> float:
    import corral

    t = time.perf_counter()
    with corral.Sandbox(policy, backend=backend) as sb:
        r = sb.exec(["true"])
    assert r.verdict == "ok", r
    return time.perf_counter() - t


def _pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def live_rows(vm: dict, ns: dict, runs: int, idle: int) -> dict:
    import corral

    rows: dict[str, list[float]] = {"live create microvm": [], "live create namespace": [],
                                    "python3 pass microvm": [], "python3 pass namespace": []}
    for _ in range(runs):
        for name, pol in (("microvm", vm), ("namespace", ns)):
            t = time.perf_counter()
            sb = corral.Sandbox.create(pol, timeout=600)
            try:
                assert sb.commands.run(["true"]).verdict == "ok"
                rows[f"live create {name}"].append(time.perf_counter() - t)
                for _ in range(3):
                    t = time.perf_counter()
                    r = sb.commands.run(["/usr/bin/python3", "-c", "pass"])
                    rows[f"python3 pass {name}"].append(time.perf_counter() - t)
                    assert r.verdict == "ok", r
            finally:
                sb.kill()
    mem: dict[str, list[float]] = {"idle pss microvm": [], "idle cgroup microvm": [],
                                   "idle cgroup namespace": []}
    for name, pol in (("microvm", vm), ("namespace", ns)):
        sbs = [corral.Sandbox.create(pol, timeout=600) for _ in range(idle)]
        try:
            for sb in sbs:
                sb.commands.run(["true"])
            time.sleep(2)   # idle: nothing runs
            for sb in sbs:
                mem[f"idle cgroup {name}"].append(float(sb.get_info().usage["memory_bytes"]))
                if name == "microvm":
                    mem["idle pss microvm"].append(float(_pss(sb._live.proc.pid)))
        finally:
            for sb in sbs:
                sb.kill()
    return {**rows, **mem}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--idle", type=int, default=2)
    a = ap.parse_args()
    from corral.backends.microvm import MicrovmBackend, _accel

    accel, why = _accel()
    vm = {"isolation": "microvm", "image": a.image}
    ns = {"isolation": "namespace", "image": a.image}
    timed_open_exec(vm)   # makes the warm template if absent
    rows: dict[str, list[float]] = {"cold boot": [], "restore": [], "namespace": [],
                                    "corral run": []}
    for _ in range(a.runs):
        rows["cold boot"].append(timed_open_exec(vm, MicrovmBackend(warm=False)))
        rows["restore"].append(timed_open_exec(vm))
        rows["namespace"].append(timed_open_exec(ns))
        t = time.perf_counter()
        subprocess.run([CORRAL, "run", "--isolation", "microvm", "--image", a.image, "--",
                        "true"], check=True, capture_output=True)
        rows["corral run"].append(time.perf_counter() - t)
    out = {k: statistics.median(v) for k, v in rows.items()}
    label = accel.upper()
    print(f"microvm start-up ({label}: {why}); medians of {a.runs} runs, to first result")
    for k, v in out.items():
        print(f"  {k:<12} {v * 1000:8.0f} ms" + (f"   ({label})" if k != "namespace" else ""))
    print(f"  restore / namespace: {out['restore'] / out['namespace']:.1f}x; "
          f"cold boot / restore: {out['cold boot'] / out['restore']:.1f}x")
    live = live_rows(vm, ns, a.runs, a.idle)
    lout = {k: statistics.median(v) for k, v in live.items()}
    print(f"live sandboxes ({label} for microvm); medians")
    for k, v in lout.items():
        if k.startswith("idle"):
            print(f"  {k:<24} {v / (1 << 20):8.1f} MiB")
        else:
            print(f"  {k:<24} {v * 1000:8.0f} ms")
    print(f"  python3 pass microvm / namespace: "
          f"{lout['python3 pass microvm'] / lout['python3 pass namespace']:.1f}x; "
          f"live create microvm / namespace: "
          f"{lout['live create microvm'] / lout['live create namespace']:.1f}x")
    rows.update(live)
    out.update(lout)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"accel": accel, "why": why, "seconds": out, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
