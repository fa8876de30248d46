"""What a one-shot `corral.run(["/bin/true"])` costs beyond the raw bwrap it starts.

    .venv/bin/python bench/oneshot.py [--pairs 200] [--policy-dict] [--json FILE]

Runs as root from the repository root. Pairs of one corral.run and one raw bwrap run
(bench/startup.py's argv: corral's own bwrap line and seccomp program, the same uid), the
order alternating from pair to pair (each side follows the other as often), back to back.
For each side: wall p50/p90/p99 and p99/p50, the runs/s ratio (the soak's goal: corral.run
>= 0.95x raw bwrap), and CPU time: the calling thread's own (thread_time: the work on the
caller's critical path) and the whole process's per run (getrusage; it includes the
teardown thread's work, host/deferred.py, which overlaps whatever runs next). Then, for
the corral.run side, the wall time and the calling thread's CPU time of each step of a run
(time.perf_counter_ns and thread_time_ns around the functions of backends/namespace.py that
make up its path), p50 and p99. CPU time is the figure to judge a change by on a shared
machine: wall time there is mostly the scheduler's (print the load average beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

#: the steps timed (functions of backends/namespace.py and the Sandbox around them)
STEPS = ("spawn", "_confine", "_child_pid", "supervise", "_reap_init", "usage_of",
         "run_cgroup", "finish")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def instrument(cur: dict) -> None:
    """Wrap the steps so that each run adds its wall and thread CPU time to `cur`."""
    from corral.backends import namespace as ns
    from corral.runtime import sandbox as sbm

    def wrap(owner, name, label):
        f = getattr(owner, name)

        def timed(*a, **kw):
            w, c = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return f(*a, **kw)
            finally:
                cur.setdefault(label, [0, 0])
                cur[label][0] += time.perf_counter_ns() - w
                cur[label][1] += time.thread_time_ns() - c
        setattr(owner, name, timed)

    for name in STEPS:
        # bwrap's report of its child moved to linux/supervise.py as bwrap_child_pid
        # (session 12); the label stays, so that figures of either build compare
        wrap(ns, "bwrap_child_pid" if name == "_child_pid" and not hasattr(ns, name)
             else name, name)
    wrap(ns.NamespaceSandbox, "__init__", "sandbox setup (run dir, scratch, argv)")
    wrap(ns.NamespaceSandbox, "close", "close")
    wrap(sbm.Sandbox, "_set_up", "policy, plan, tier check")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--policy-dict", action="store_true",
                    help="pass the soak's policy dict (isolation, a timeout) to corral.run")
    ap.add_argument("--no-steps", action="store_true", help="no per-step breakdown")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("oneshot.py runs as root")
        return 2
    os.environ.setdefault("CORRAL_AUDIT", "0")
    import startup

    import corral

    bench = startup.Bench(use_runsc=False)
    policy = {"isolation": "namespace", "limits": {"timeout": "60s"}} if a.policy_dict \
        else None
    cur: dict = {}
    steps: dict[str, list[tuple[int, int]]] = {}
    if not a.no_steps:
        instrument(cur)
    sides = {"corral.run": {"wall": [], "thread": [], "proc": []},
             "raw bwrap": {"wall": [], "thread": [], "proc": []}}

    def corral_run():
        r = corral.run(["/bin/true"], policy)
        if r.verdict != "ok":
            raise SystemExit(f"corral.run failed: {r}")

    def one(side: str, fn) -> None:
        cur.clear()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        c, w = time.thread_time_ns() - c, time.perf_counter_ns() - w
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        bench.reap_orphans()   # raw bwrap's init (Bench.bwrap leaves it to us), once timed
        s = sides[side]
        s["wall"].append(w / 1e6)
        s["thread"].append(c / 1e6)
        s["proc"].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3)
        if side == "corral.run":
            for k, (sw, sc) in cur.items():
                steps.setdefault(k, []).append((sw, sc))

    raw = lambda: bench.bwrap(["/bin/true"])   # noqa: E731
    try:
        for _ in range(5):
            corral_run()
            raw()
            bench.reap_orphans()
        for i in range(a.pairs):
            order = [("corral.run", corral_run), ("raw bwrap", raw)]
            for side, fn in (order if i % 2 else order[::-1]):
                one(side, fn)
    finally:
        bench.close()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{a.pairs} pairs, order alternating; load average {' '.join(load)}")
    print(f"  {'':12} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p99/p50':>8} "
          f"{'thread CPU ms':>14} {'process CPU ms':>15}")
    out: dict = {"pairs": a.pairs, "load": load, "sides": {}, "steps": {}}
    for side, s in sides.items():
        w = s["wall"]
        row = {"p50_ms": pct(w, 50), "p90_ms": pct(w, 90), "p99_ms": pct(w, 99),
               "runs_per_s": len(w) / sum(w) * 1e3,
               "thread_cpu_ms": sum(s["thread"]) / len(w),
               "process_cpu_ms": sum(s["proc"]) / len(w)}
        out["sides"][side] = row
        print(f"  {side:12} {row['p50_ms']:8.2f} {row['p90_ms']:8.2f} {row['p99_ms']:8.2f} "
              f"{row['p99_ms'] / row['p50_ms']:8.2f} {row['thread_cpu_ms']:14.3f} "
              f"{row['process_cpu_ms']:15.3f}")
    ratio = out["sides"]["corral.run"]["runs_per_s"] / out["sides"]["raw bwrap"]["runs_per_s"]
    out["ratio"] = ratio
    print(f"  corral.run {ratio:.3f}x raw bwrap's runs/s (goal >= 0.95)")
    if steps:
        print("\n  corral.run, per step: wall ms p50 / p99, calling thread CPU ms p50 / mean")
        for k, v in sorted(steps.items(), key=lambda kv: -sum(x[0] for x in kv[1])):
            w = [x[0] / 1e6 for x in v]
            c = [x[1] / 1e6 for x in v]
            out["steps"][k] = {"wall_p50": pct(w, 50), "wall_p99": pct(w, 99),
                               "cpu_p50": pct(c, 50), "cpu_mean": sum(c) / len(c)}
            print(f"  {k:40} {pct(w, 50):7.3f} / {pct(w, 99):7.3f}   "
                  f"{pct(c, 50):6.3f} / {sum(c) / len(c):6.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
