"""What the audit store costs a run: corral.run with and without recording, side by side.

    .venv/bin/python bench/audit.py [--runs N] [--json FILE]

Variants, round robin in one process (a fresh order every round, the first rounds
discarded), each `corral.run(["/bin/true"])` on the namespace tier:

  off     CORRAL_AUDIT=0: no record at all
  off2    the same again: off2 - off is this machine's noise floor at the moment (an A/A
          comparison); a difference on - off within it is no measured cost
  on      recorded (a background thread writes it to SQLite; the run does not wait)

The goal (issue 21): on - off <= 0.2 ms at the median. The writer's own work (about 0.15
ms of CPU a record, in batches every 50 ms) lands on whichever run is going then, of either
variant; on a loaded machine the difference wanders by more than that, so the cost of the
hook on the run's own thread (record_run: queue a record) is measured alone as well. Reported: both medians, their
difference and ratio, and how many records landed (all of them, after a final flush).
The database is a temporary state directory's. The figures of a loaded machine are
indicative; the difference is what counts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

GOAL_MS = 0.2
WARMUP = 5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--json")
    a = ap.parse_args()
    state = tempfile.mkdtemp(prefix="corral-bench-audit-")
    os.environ["CORRAL_STATE_DIR"] = state
    import corral
    from corral.audit import query, record

    samples: dict[str, list[float]] = {"off": [], "off2": [], "on": []}
    rng = random.Random(21)
    for i in range(a.runs + WARMUP):
        for v in rng.sample(sorted(samples), 3):
            os.environ["CORRAL_AUDIT"] = "1" if v == "on" else "0"
            t0 = time.perf_counter()
            corral.run(["/bin/true"])
            dt = time.perf_counter() - t0
            if i >= WARMUP:
                samples[v].append(dt * 1000)
    os.environ["CORRAL_AUDIT"] = "1"
    landed = record.flush(10)
    n = len(query.runs(limit=10**9))
    # the hook alone, as each run calls it on its own thread (the writer drains meanwhile)
    sb = corral.Sandbox()
    r = corral.run(["/bin/true"])
    hook = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        record.record_run(record.new_id(), time.time(), r, policy=sb.policy, plan=sb.plan,
                          argv=["/bin/true"], isolation="namespace", origin=record.origin())
        hook.append((time.perf_counter() - t0) * 1e6)
    record.flush(10)
    off, off2, on = (statistics.median(samples[k]) for k in ("off", "off2", "on"))
    out = {"runs": a.runs, "off_ms": round(off, 3), "on_ms": round(on, 3),
           "extra_ms": round(on - off, 3),
           "off2_ms": round(off2, 3), "noise_ms": round(off2 - off, 3), "ratio": round(on / off, 4),
           "hook_us": round(statistics.median(hook), 2), "records": n, "expected_records": a.runs + WARMUP, "flushed": landed,
           "goal_extra_ms": GOAL_MS, "met": on - off <= GOAL_MS}
    print(f"corral.run /bin/true, median of {a.runs}: off {off:.3f} ms, on {on:.3f} ms, "
          f"extra {on - off:+.3f} ms (ratio {on / off:.4f}), A/A noise (off2 - off) "
          f"{off2 - off:+.3f} ms; goal <= {GOAL_MS} ms: "
          f"{'met' if out['met'] else 'NOT met'}; {n} of {a.runs + WARMUP} records "
          f"written; the hook on the run's thread alone: {out['hook_us']} us at the median")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
