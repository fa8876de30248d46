"""Where the soak's `true` tail goes, run by run: bench/soak.py's loop cut down to the
kind before `true` in its mix (`review`), `true` itself and raw bwrap right after it, with
each stage of the `true` run timed and what else happened during it noted.

    .venv/bin/python bench/tail_stages.py [--rounds 600] [--before review|true|none]

Runs as root from the repository root. Per `true` run: its stages (wall ms: `sandbox()`,
`open` with its parts, `exec` with its parts, `close`), and beside them: whether the
teardown thread (backends/host/deferred.py) had work queued at the run's start and how
long it was busy during the run, whether a run dir made ahead was taken, whether the run's
cgroup was new (not from the pool), gc collections inside the run, the process's minor
page faults, the calling thread's involuntary context switches, and the CPU pressure
(PSI) over the run. Then p50 / p90 / p99 / max of each, p99/p50 of `true` and of raw
bwrap (all runs and calm runs, as in soak.py), and the slowest `true` runs with what was
different about them. To set two builds side by side, run it alternately with
PYTHONPATH=OTHER/src.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import corral  # noqa: E402
from corral.backends import namespace as ns  # noqa: E402
from corral.backends.host import cgroups as cgm  # noqa: E402
from corral.linux import limits as lim  # noqa: E402
from corral.linux import rundir as rd  # noqa: E402
from corral.runtime import sandbox as sbm  # noqa: E402

T: dict[str, float] = {}
N: dict[str, int] = {}
BUSY: list[tuple[float, float]] = []     # the teardown thread's work, (start, end)
CALM = 0.3


def timed(obj, name: str, label: str) -> None:
    f = getattr(obj, name)

    def w(*a, **k):
        s = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[label] = T.get(label, 0) + time.perf_counter() - s
    setattr(obj, name, w)


def counted(obj, name: str, label: str) -> None:
    f = getattr(obj, name)

    def w(*a, **k):
        N[label] = N.get(label, 0) + 1
        return f(*a, **k)
    setattr(obj, name, w)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def stall_us() -> int:
    with open("/proc/pressure/cpu") as f:
        return int(f.readline().rsplit("total=", 1)[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--before", default="review", choices=("review", "true", "none"))
    ap.add_argument("--json", help="write every run's row here")
    ap.add_argument("--flush", action="store_true", help="every other round, wait for the "
                    "teardown thread's queue (DEFERRED.flush()) before the timed `true` run: "
                    "both halves reported apart")
    a = ap.parse_args()
    os.environ.setdefault("CORRAL_AUDIT", "0")
    import startup

    bench = startup.Bench(use_runsc=False)
    from soak import raw_bwrap

    raw = raw_bwrap(bench)
    for obj, name, label in [
            (sbm.Sandbox, "__init__", "sandbox()"), (sbm.Sandbox, "open", "open"),
            (sbm.Sandbox, "exec", "exec"), (sbm.Sandbox, "close", "close"),
            (rd, "sweep_if_due", " open.sweep_if_due"), (rd.RunDir, "__init__", " open.RunDir"),
            (ns.NamespaceSandbox, "_setup", " open._setup"),
            (ns, "run_cgroup", " exec.run_cgroup"), (ns, "spawn", " exec.spawn"),
            (ns, "_confine", " exec._confine"),
            # bwrap's report of its child: _child_pid, bwrap_child_pid since session 12
            (ns, "bwrap_child_pid" if hasattr(ns, "bwrap_child_pid") else "_child_pid",
             " exec._child_pid"),
            (ns, "supervise", " exec.supervise"), (ns, "_reap_init", " exec._reap_init"),
            (ns, "keep_cgroup", " exec.keep_cgroup"), (ns, "usage_of", " exec.usage_of"),
            (ns, "finish", " exec.finish")]:
        timed(obj, name, label)
    counted(lim.RunCgroup, "create", "new cgroup")
    waitpid = os.waitpid

    def noted_waitpid(*args):   # supervise() reaps bwrap's monitor with it: when it exited
        r = waitpid(*args)
        T["monitor reaped at"] = time.perf_counter()
        return r
    os.waitpid = noted_waitpid
    reap = ns._reap_init

    def after_monitor(*args):
        # from the monitor's reaping to init reaped and the cgroup found empty (pipes
        # drained, init's exit and the cgroup's check): what raw bwrap does not wait for
        r = reap(*args)
        if "monitor reaped at" in T:
            T["after monitor exit"] = time.perf_counter() - T.pop("monitor reaped at")
        return r
    ns._reap_init = after_monitor
    counted(cgm.POOL, "take", "pool take")
    ws = tempfile.mkdtemp(prefix="corral-tail-", dir="/var/tmp")
    os.chmod(ws, 0o755)
    with open(os.path.join(ws, "keep.txt"), "w") as f:
        f.write("kept\n")
    os.chmod(os.path.join(ws, "keep.txt"), 0o644)
    base = {"isolation": "namespace", "limits": {"timeout": "60s"}}
    review = {**base, "filesystem": {"workspace": {"path": ws, "mode": "review"}}}
    rev_argv = ["/bin/sh", "-c", "echo x > /workspace/new.txt && cat keep.txt && echo wrote"]
    gcs: list[float] = []
    gstart = [0.0]
    on = [False]

    def gcb(phase, info):
        if phase == "start":
            gstart[0] = time.perf_counter()
        elif on[0]:
            gcs.append(time.perf_counter() - gstart[0])
    gc.callbacks.append(gcb)
    rows, raws = [], []
    try:
        for _ in range(5):
            corral.run(rev_argv, review)
            corral.run(["/bin/true"], base)
            raw(["/bin/true"])
        from corral.backends.host import deferred as dm
        inner = dm.DEFERRED._run

        def busy(*args):
            s = time.perf_counter()
            try:
                return inner(*args)
            finally:
                BUSY.append((s, time.perf_counter()))
        dm.DEFERRED._run = busy
        for i in range(a.rounds):
            if a.before == "review":
                corral.run(rev_argv, review)
            elif a.before == "true":
                corral.run(["/bin/true"], base)
            flushed = a.flush and i % 2 == 1
            if flushed:
                dm.DEFERRED.flush()
            T.clear()
            N.clear()
            del gcs[:]
            pending = dm.DEFERRED.pending()
            ready = sum(1 for _ in dm.DEFERRED._ready)
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            th0 = resource.getrusage(resource.RUSAGE_THREAD)
            st0 = stall_us()
            on[0] = True
            s = time.perf_counter()
            r = corral.run(["/bin/true"], base)
            e = time.perf_counter()
            on[0] = False
            st1 = stall_us()
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            th1 = resource.getrusage(resource.RUSAGE_THREAD)
            assert r.verdict == "ok", r
            overlap = sum(max(0.0, min(b, e) - max(x, s)) for x, b in BUSY
                          if b > s and x < e)
            del BUSY[:-8]
            T.pop("monitor reaped at", None)
            row = {k: v * 1e3 for k, v in T.items()}
            row.update({"TOTAL": (e - s) * 1e3, "teardown busy": overlap * 1e3,
                        "gc": sum(gcs) * 1e3, "minflt": ru1.ru_minflt - ru0.ru_minflt,
                        "nivcsw": th1.ru_nivcsw - th0.ru_nivcsw,
                        "stall": (st1 - st0) / 1e3, "pending at start": pending,
                        "ready waiting": ready, "new cgroup": N.get("new cgroup", 0),
                        "calm": (st1 - st0) / 1e6 < CALM * (e - s), "flushed": flushed})
            rows.append(row)
            st0 = stall_us()
            s = time.perf_counter()
            raw(["/bin/true"])
            took = time.perf_counter() - s
            raws.append((took * 1e3, (stall_us() - st0) / 1e6 < CALM * took, flushed))
    finally:
        shutil.rmtree(ws)
        bench.close()
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump({"true": rows, "raw": raws}, f)
    print(f"{a.rounds} rounds ({a.before} before each true), corral from "
          f"{os.path.dirname(corral.__file__)}, load average {os.getloadavg()[0]:.2f}")
    keys = sorted({k for r in rows for k in r if k not in ("calm", "flushed")})
    for k in keys:
        xs = [float(r.get(k, 0)) for r in rows]
        print(f"  {k:22} p50 {pct(xs, 50):7.3f}  p90 {pct(xs, 90):7.3f}  "
              f"p99 {pct(xs, 99):7.3f}  max {max(xs):7.3f}  mean {sum(xs) / len(xs):7.3f}")
    halves = ((" (teardown queued)", False), (" (flushed first)", True)) if a.flush \
        else (("", False),)
    for (label, _), (name, xs, calm) in ((h, t) for h in halves for t in (
            ("true", [r["TOTAL"] for r in rows if r["flushed"] == h[1]],
             [r["TOTAL"] for r in rows if r["calm"] and r["flushed"] == h[1]]),
            ("raw bwrap", [x for x, _, f in raws if f == h[1]],
             [x for x, c, f in raws if c and f == h[1]]))):
        name += label
        calm_part = (f"p50 {pct(calm, 50):6.2f} p99 {pct(calm, 99):6.2f} p99/p50 "
                     f"{pct(calm, 99) / pct(calm, 50):5.2f}") if calm else "-"
        print(f"  {name:28} p50 {pct(xs, 50):6.2f} p99 {pct(xs, 99):6.2f} p99/p50 "
              f"{pct(xs, 99) / pct(xs, 50):5.2f}; calm {len(calm)}: {calm_part}")
    if a.flush:
        for k in ("after monitor exit", " exec._reap_init", " exec.supervise", "TOTAL"):
            for label, fl in halves:
                xs = [float(r.get(k, 0)) for r in rows if r["flushed"] == fl]
                print(f"  {k.strip() + label:40} p50 {pct(xs, 50):7.3f}  p90 {pct(xs, 90):7.3f}"
                      f"  p99 {pct(xs, 99):7.3f}  mean {sum(xs) / len(xs):7.3f}")
    print("  slowest true runs (ms; calm ones marked *):")
    for r in sorted(rows, key=lambda r: r["TOTAL"])[-max(5, a.rounds // 40):]:
        print("   " + ("*" if r["calm"] else " ") + " ".join(
            f"{k.strip()}={float(r.get(k, 0)):.2f}" for k in keys
            if k.strip() not in ("open", "exec")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
