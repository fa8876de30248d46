"""Observing refused syscalls ([audit] syscalls / learn mode: linux/seccomp_notify.py):
what it costs a command, side by side in one run.

    .venv/bin/python bench/syscalls.py [--quick] [--runs N] [--json FILE]

Two live sandboxes of the namespace tier, one observing, one not, and paired runs of one
command in each, alternating which goes first (a load spike hits both alike):

  allowed       a loop of N_ALLOWED allowed syscalls (getppid through ctypes' syscall(),
                no libc cache): the kernel allows them in the filter itself, the observer
                never sees them; the ratio observed/unobserved should be ~1.0
  refused       a loop of N_REFUSED refused ones (keyctl: EPERM): each stops in the kernel
                and waits for the observer's answer (a thread of this process), so this
                is what observation costs a refused call
  create        Sandbox.create() to its first command done (`true`), observing or not

Printed: the median of each, per call (allowed, refused) in microseconds, and the median
of the paired ratios observed/unobserved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import corral

PY = "/usr/bin/python3"
N_ALLOWED = 200_000
N_REFUSED = 20_000
LOOP = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
nr, n = int(sys.argv[1]), int(sys.argv[2])
f = libc.syscall
t = time.perf_counter()
for _ in range(n):
    f(nr, 0, 0, 0)
print(time.perf_counter() - t)
"""


def _loop(sb, nr: int, n: int) -> float:
    r = sb.exec([PY, "-c", LOOP, str(nr), str(n)], timeout=600)
    if r.verdict != "ok":
        raise SystemExit(f"the loop failed: {r.verdict} {r.stderr[-500:]}")
    return float(r.stdout.strip())


def _create(observe: bool) -> float:
    t = time.perf_counter()
    sb = corral.Sandbox.create({"audit": {"syscalls": observe}}, timeout=60)
    try:
        sb.exec(["true"])
        return time.perf_counter() - t
    finally:
        sb.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = a.runs or (5 if a.quick else 15)
    n_allowed = N_ALLOWED // (4 if a.quick else 1)
    n_refused = N_REFUSED // (4 if a.quick else 1)
    sbs = {obs: corral.Sandbox.create({"audit": {"syscalls": obs}}, timeout=3600)
           for obs in (False, True)}
    got: dict[str, dict[bool, list[float]]] = {k: {False: [], True: []}
                                               for k in ("allowed", "refused", "create")}
    ratios: dict[str, list[float]] = {k: [] for k in got}
    try:
        for obs in (False, True):                    # warm-up, dropped
            _loop(sbs[obs], 110, 1000)
            _loop(sbs[obs], 250, 100)
        for i in range(runs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for name, nr, n in (("allowed", 110, n_allowed), ("refused", 250, n_refused)):
                pair = {}
                for obs in order:
                    pair[obs] = _loop(sbs[obs], nr, n) / n * 1e6
                    got[name][obs].append(pair[obs])
                ratios[name].append(pair[True] / pair[False])
            pair = {}
            for obs in order:
                pair[obs] = _create(obs) * 1e3
                got["create"][obs].append(pair[obs])
            ratios["create"].append(pair[True] / pair[False])
    finally:
        for sb in sbs.values():
            sb.kill()
    out = {}
    unit = {"allowed": "us/call", "refused": "us/call", "create": "ms"}
    for name in got:
        off, on = statistics.median(got[name][False]), statistics.median(got[name][True])
        ratio = statistics.median(ratios[name])
        out[name] = {"unobserved": off, "observed": on, "ratio": ratio, "unit": unit[name]}
        print(f"{name:8} unobserved {off:9.3f} {unit[name]:8} observed {on:9.3f} "
              f"{unit[name]:8} ratio (median of {runs} pairs) {ratio:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
