"""Where a one-shot run's time goes, stage by stage: corral.run of soak.py's `review` kind
(a workspace in review mode) or of `/bin/true`, with each stage timed.

    .venv/bin/python bench/review_stages.py [review|true] [RUNS]

Runs as root from the repository root (review mode needs it). Stages (ms, p50 / p90 /
p99 / max over RUNS runs after 5 warm-up runs): `sandbox()` (policy, plan, the tier's
check: for review, the idmap probe), `open` (run dir, scratch, the review overlay:
`open.mount_review`), `exec` (`exec.supervise`: from bwrap's start to its exit), `close`
(`close.unmount_all_but`: the review tree unmounted on the caller's thread) and the
total; `close._umount` also counts the teardown thread's unmounts of scratch, which run
beside the next run. Then the slowest runs, stage by stage: which stage their tail is
in. To set two builds side by side, run it alternately with PYTHONPATH=OTHER/src.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import corral
from corral.backends import namespace as ns
from corral.backends.host import review as rv
from corral.linux import rundir as rd
from corral.runtime import sandbox as sbm

T: dict[str, float] = {}


def timed(obj, name: str, label: str) -> None:
    f = getattr(obj, name)

    def w(*a, **k):
        s = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[label] = T.get(label, 0) + time.perf_counter() - s
    setattr(obj, name, w)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> int:
    kind = sys.argv[1] if len(sys.argv) > 1 else "review"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    os.environ.setdefault("CORRAL_AUDIT", "0")
    for obj, name, label in [(sbm.Sandbox, "__init__", "sandbox()"),
                             (sbm.Sandbox, "open", "open"), (sbm.Sandbox, "exec", "exec"),
                             (sbm.Sandbox, "close", "close"),
                             (rv, "mount_review", " open.mount_review"),
                             (ns, "supervise", " exec.supervise"),
                             (rd.RunDir, "unmount_all_but", " close.unmount_all_but"),
                             (rd, "_umount", " close._umount")]:
        timed(obj, name, label)
    ws = tempfile.mkdtemp(prefix="corral-stages-", dir="/var/tmp")
    os.chmod(ws, 0o755)
    with open(os.path.join(ws, "keep.txt"), "w") as f:
        f.write("kept\n")
    policy: dict = {"isolation": "namespace", "limits": {"timeout": "60s"}}
    argv = ["/bin/true"]
    if kind == "review":
        policy["filesystem"] = {"workspace": {"path": ws, "mode": "review"}}
        argv = ["/bin/sh", "-c", "echo x > /workspace/new.txt && cat keep.txt && echo wrote"]
    rows = []
    try:
        for _ in range(5):
            corral.run(argv, policy)
        for _ in range(n):
            T.clear()
            s = time.perf_counter()
            r = corral.run(argv, policy)
            T["TOTAL"] = time.perf_counter() - s
            assert r.verdict == "ok", r
            rows.append(dict(T))
    finally:
        shutil.rmtree(ws)
    print(f"{kind}: {n} runs, corral from {os.path.dirname(corral.__file__)}, load average "
          f"{os.getloadavg()[0]:.2f}")
    keys = sorted({k for r in rows for k in r})
    for k in keys:
        xs = [r.get(k, 0) * 1e3 for r in rows]
        print(f"  {k:26} p50 {pct(xs, 50):7.3f}  p90 {pct(xs, 90):7.3f}  "
              f"p99 {pct(xs, 99):7.3f}  max {max(xs):7.3f}")
    print("  slowest runs:")
    for r in sorted(rows, key=lambda r: r["TOTAL"])[-max(3, n // 50):]:
        print("   " + " ".join(f"{k.strip()}={r.get(k, 0) * 1e3:.2f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
