"""corral batch: corral's own CPU a job, the sandboxes left out; this build against
another checkout's, alternately.

    .venv/bin/python bench/batch_cpu.py [--jobs N] [--pairs K] [--baseline-src DIR]

Each run is a process of its own (PYTHONPATH: this checkout's src, or DIR) that runs N
`/usr/bin/python3 -c pass` jobs through corral.batch.map, 2 at once, in a state
directory of its own, after 4 jobs to warm up. Per job it reports the driver process's
CPU (getrusage, all its threads: the main thread, the audit writer), the driver's main
thread alone (thread_time), and the workers' own CPU (getrusage in each worker as it
exits: its job thread and its warm pool's thread, not the sandboxes it started, which
are its children). Thread CPU is what load changes least: on a saturated machine a
batch's throughput follows the CPU each job costs (bench/batch.py measures that). The
figures: medians over the K runs of each build, and the median of the paired
differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CMD = ["/usr/bin/python3", "-c", "pass"]


def one(n: int) -> dict:
    """This process's run (which corral it imports is PYTHONPATH's)."""
    import resource
    import time

    os.environ["CORRAL_STATE_DIR"] = tempfile.mkdtemp(prefix="corral-batch-cpu-")
    out = tempfile.mkdtemp(prefix="corral-batch-cpu-w")
    import corral.batch
    from corral.audit import record
    from corral.scale import local

    inner = local._worker

    def worker(sock, runner, base) -> None:
        try:
            inner(sock, runner, base)
        finally:
            u = resource.getrusage(resource.RUSAGE_SELF)
            with open(os.path.join(out, str(os.getpid())), "w") as f:
                f.write(str(u.ru_utime + u.ru_stime))

    local._worker = worker
    jobs = [{"id": i, "argv": CMD} for i in range(n)]
    list(corral.batch.map(jobs[:4], None, concurrency=2))
    record.flush()
    for name in os.listdir(out):
        os.unlink(os.path.join(out, name))
    s0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    lines = list(corral.batch.map(jobs, None, concurrency=2))
    record.flush()
    s1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    assert len(lines) == n and all(x.get("verdict") == "ok" for x in lines), lines[:2]
    workers = 0.0
    for name in os.listdir(out):
        with open(os.path.join(out, name)) as f:
            workers += float(f.read())
    ms = 1e3 / n
    driver = (s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime) * ms
    return {"driver": driver, "driver_main": (t1 - t0) * ms, "workers": workers * ms,
            "own": driver + workers * ms, "load": os.getloadavg()[0]}


def run(src: str, n: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", str(n)],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=150)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--baseline-src", metavar="DIR")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one)))
        return 0
    builds = {"this": os.path.join(HERE, "..", "src")}
    if a.baseline_src:
        builds["base"] = a.baseline_src
    got: dict[str, list[dict]] = {k: [] for k in builds}
    for i in range(a.pairs):
        order = list(builds) if i % 2 == 0 else list(reversed(builds))
        for k in order:
            r = run(builds[k], a.jobs)
            got[k].append(r)
            print(f"  pair {i + 1} {k:4s} own {r['own']:.3f} ms a job (driver {r['driver']:.3f}, "
                  f"its main thread {r['driver_main']:.3f}; workers {r['workers']:.3f}), "
                  f"load {r['load']:.2f}", flush=True)
    med = statistics.median
    for k, rs in got.items():
        print(f"{k:4s} median of {len(rs)}: own {med(r['own'] for r in rs):.3f} ms a job "
              f"(driver {med(r['driver'] for r in rs):.3f}, its main thread "
              f"{med(r['driver_main'] for r in rs):.3f}; workers "
              f"{med(r['workers'] for r in rs):.3f})")
    if "base" in got:
        diffs = sorted(b["own"] - t["own"] for t, b in zip(got["this"], got["base"]))
        print(f"base - this, paired: median {med(diffs):+.3f} ms a job, range "
              f"{diffs[0]:+.3f} to {diffs[-1]:+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
