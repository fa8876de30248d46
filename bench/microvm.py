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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
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
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"accel": accel, "why": why, "seconds": out, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
