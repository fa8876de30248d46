"""corral batch: `/usr/bin/python3 -c pass` jobs per second, against raw bwrap in a process
pool, and through a local Ray cluster of two nodes.

    .venv/bin/python bench/batch.py [--quick] [--jobs N] [--rounds R] [--parallel P]
                                    [--ray] [--baseline-src DIR] [--json FILE]

Contenders, each running the same N jobs with P at once (default P = 2, this machine's
cores), in rounds that rotate their order; the figures: the median jobs/s over rounds, and
the ratio to the bwrap pool as the median of each round's paired ratio (the load of other
work on the machine changes from round to round, less within one):

  bwrap pool     a multiprocessing pool of P forked workers, each running the raw bwrap argv
                 of bench/startup.py (corral's own argv and seccomp program, same uid and
                 environment) with subprocess: the baseline of the ratio
  batch local    corral.batch.map(jobs, concurrency=P): P forked workers, a fresh sandbox
                 a job from each one's warm pool, the result line with the node's signed
                 receipt, the record in the audit store (a state directory of the
                 benchmark's own)
  batch reuse    the same with [batch] reuse = true: one sandbox per slot, scratch wiped
                 between jobs
  base local     (--baseline-src DIR) batch local with another checkout's corral (DIR: its
  base reuse     `src`), in a process of its own started once (and warmed) before the
                 rounds, which runs each round's batch when told: side by side with this
                 build's, interleaved (its wall and CPU are taken in that process, around
                 the batch only)
  batch ray      (--ray) corral.batch.map(jobs, ray_address=...) on a local
                 ray.cluster_utils.Cluster: a head that runs no jobs and two nodes of one
                 CPU each, P/2 jobs at once on each (P in all); started once, outside the
                 timing; the driver is this process

CPU a job (where cpuacct is a cgroup v1 hierarchy apart from cpu, as root): the bench
runs in a cpuacct cgroup of its own, which every contender's processes and sandboxes are
below (not the Ray cluster's, started before it): the median over rounds of its CPU time
per job, all processes and the kernel's work for them.

Per-job overhead of Ray = (wall of batch ray - wall of batch local) / N * P: the extra
slot-time each job costs; and the driver's own CPU time per job on Ray (this process:
dispatch, results, output lines, audit records), which bounds how many nodes one driver
keeps busy. Goal (issue 22): batch local >= 0.95x bwrap pool, measured without --ray: a
Ray cluster on the same two cores (three raylets, the GCS, the actors) and Ray's threads in
this process slow every contender down, the in-process ones most.

On a machine others load too, jobs per second follow their load: compare the ratios of
one run (the contenders alternate within each round), not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import startup

CMD = ["/usr/bin/python3", "-c", "pass"]
GOAL = 0.95

_W: dict = {}


def _worker_init(prefix, env, kw) -> None:
    from corral.linux import seccomp

    _W["fd"] = seccomp.bpf_fd(seccomp.bpf_bytes(None))
    p = list(prefix)
    p[p.index("--seccomp") + 1] = str(_W["fd"])
    _W["argv"], _W["env"], _W["kw"] = p + ["--", *CMD], env, kw


def _worker_one(_i: int) -> int:
    os.lseek(_W["fd"], 0, os.SEEK_SET)
    startup.run_checked(_W["argv"], env=_W["env"], pass_fds=(_W["fd"],), **_W["kw"])
    return 1


def bwrap_pool(base, n: int, p: int) -> float:
    kw = {"user": base.uid, "group": base.gid, "extra_groups": []} if base.switch_user \
        else {}
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(p, _worker_init, (base.bwrap_prefix, base.env, kw))
    pool.map(_worker_one, range(p), chunksize=1)        # workers up and warm
    t0 = time.monotonic()
    done = sum(pool.imap_unordered(_worker_one, range(n), chunksize=1))
    wall = time.monotonic() - t0
    pool.close()
    pool.join()     # workers exit and are waited for: their CPU is counted
    assert done == n
    return wall


def batch(n: int, p: int, policy=None, ray_address=None) -> float:
    import corral.batch

    jobs = [{"id": i, "argv": CMD} for i in range(n)]
    t0 = time.monotonic()
    lines = list(corral.batch.map(jobs, policy, ray_address=ray_address, concurrency=p))
    wall = time.monotonic() - t0
    bad = [x for x in lines if x.get("verdict") != "ok"]
    assert len(lines) == n and not bad, bad[:2]
    return wall


class Baseline:
    """--baseline-src: a process importing corral from another checkout's src, which
    runs a batch (local or reuse) of n jobs at P at once each time it is told, and
    answers with its wall seconds and the CPU ns the bench's cpuacct cgroup counted
    meanwhile (-1 without one)."""

    def __init__(self, src: str, n: int, p: int, acct_dir: str | None) -> None:
        import subprocess

        env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", str(n), str(p),
             acct_dir or ""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, mode: str) -> tuple[float, int]:
        self.proc.stdin.write(mode + "\n")
        self.proc.stdin.flush()
        wall, ns = self.proc.stdout.readline().split()
        return float(wall), int(ns)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def serve(n: int, p: int, acct_dir: str) -> int:
    """The baseline's side (see Baseline): which corral it imports is PYTHONPATH's."""
    import corral

    def ns() -> int:
        if not acct_dir:
            return -1
        with open(os.path.join(acct_dir, "cpuacct.usage")) as f:
            return int(f.read())

    assert os.path.abspath(corral.__file__).startswith(os.environ["PYTHONPATH"])
    batch(min(n, 20), p)
    print("ready", flush=True)
    for mode in sys.stdin:
        policy = {"batch": {"reuse": True}} if mode.strip() == "reuse" else None
        c0 = ns()
        w = batch(n, p, policy)
        print(w, ns() - c0 if c0 >= 0 else -1, flush=True)
    return 0


class RayCluster:
    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
        os.environ["RAY_TMPDIR"] = self.tmp
        self.c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False})
        for _ in range(2):
            self.c.add_node(num_cpus=1, resources={"corral_namespace": 1000})
        self.c.wait_for_nodes(timeout=180)
        import ray

        ray.init(address=self.c.address, log_to_driver=False, configure_logging=False)

    def close(self) -> None:
        import ray

        ray.shutdown()
        self.c.shutdown()
        shutil.rmtree(self.tmp, ignore_errors=True)


class CpuAccount:
    """This process (and all it starts from now on, the sandboxes' run cgroups below it
    included) in a cpuacct cgroup of its own, when cpuacct is a cgroup v1 hierarchy apart
    from cpu (so the scheduler's view of the contenders is unchanged): the CPU time every
    process of a contender used, the kernel's work on their behalf included (not its
    deferred work in kernel threads). None where that cannot be had."""

    ROOT = "/sys/fs/cgroup/cpuacct"

    def __init__(self) -> None:
        self.dir = None
        cpu = "/sys/fs/cgroup/cpu"
        try:
            if os.path.samefile(self.ROOT, cpu):
                return
            with open("/proc/self/cgroup") as f:
                own = next(line.split(":", 2)[2].strip() for line in f
                           if "cpuacct" in line.split(":", 2)[1].split(","))
            d = os.path.join(self.ROOT + own, f"corral-bench-{os.getpid()}")
            os.mkdir(d)
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except (OSError, StopIteration):
            return
        self.dir, self.home = d, os.path.dirname(d)

    def ns(self) -> int:
        with open(os.path.join(self.dir, "cpuacct.usage")) as f:
            return int(f.read())

    def close(self) -> None:
        if self.dir is None:
            return
        try:
            with open(os.path.join(self.home, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            return
        for d in sorted((r for r, _, _ in os.walk(self.dir)), key=len, reverse=True):
            try:
                os.rmdir(d)
            except OSError:
                pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--baseline-src", metavar="DIR",
                    help="also run batch local and reuse with the corral in DIR (another "
                         "checkout's src), interleaved")
    if sys.argv[1:2] == ["--serve"]:
        return serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    args = ap.parse_args()
    n = args.jobs or (60 if args.quick else 300)
    rounds = args.rounds or (1 if args.quick else 3)
    p = args.parallel
    state = tempfile.mkdtemp(prefix="corral-bench-batch-")
    os.environ["CORRAL_STATE_DIR"] = state
    os.environ["CORRAL_AUDIT"] = "1"
    info = startup.machine()
    base = startup.Bench(use_runsc=False)
    cluster = RayCluster() if args.ray else None
    acct = CpuAccount()      # after the cluster: its processes stay out of the account
    contenders = {
        "bwrap pool": lambda: bwrap_pool(base, n, p),
        "batch local": lambda: batch(n, p),
        "batch reuse": lambda: batch(n, p, {"batch": {"reuse": True}}),
    }
    baseline = Baseline(args.baseline_src, n, p, acct.dir) if args.baseline_src else None
    base_cpu: dict[str, float] = {}
    if baseline is not None:
        def on_base(mode: str):
            def go() -> float:
                w, cpu_ns = baseline.run(mode)
                base_cpu[mode] = cpu_ns
                return w
            return go
        contenders["base local"] = on_base("local")
        contenders["base reuse"] = on_base("reuse")
    driver_cpu: list[float] = []
    if cluster is not None:
        def on_ray() -> float:
            c0 = resource.getrusage(resource.RUSAGE_SELF)
            w = batch(n, max(1, p // 2), None, cluster.c.address)
            c1 = resource.getrusage(resource.RUSAGE_SELF)
            driver_cpu.append((c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
                              / n * 1000)
            return w
        contenders["batch ray"] = on_ray
    names = list(contenders)
    walls: dict[str, list[float]] = {c: [] for c in names}
    cpu_ms: dict[str, list[float]] = {c: [] for c in names if c != "batch ray"}
    load0 = os.getloadavg()
    try:
        batch(min(n, 20), p)                 # warm-up: imports, caches, the receipt key
        for rnd in range(rounds):
            k = rnd % len(names)
            for c in names[k:] + names[:k]:
                t0 = acct.ns() if acct.dir and c in cpu_ms else None
                w = contenders[c]()
                walls[c].append(w)
                extra = ""
                if c.startswith("base ") and t0 is not None:   # the batch's own, in there
                    t0 = acct.ns() - base_cpu[c.split()[1]]
                if t0 is not None:
                    cpu_ms[c].append((acct.ns() - t0) / n / 1e6)
                    extra = f", {cpu_ms[c][-1]:.1f} ms CPU a job"
                print(f"  round {rnd + 1} {c:12} {n / w:7.1f} jobs/s ({w:.2f} s{extra})",
                      file=sys.stderr, flush=True)
    finally:
        base.close()
        if baseline is not None:
            baseline.close()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(state, ignore_errors=True)
        acct.close()
    load1 = os.getloadavg()
    wall = {c: statistics.median(ws) for c, ws in walls.items()}
    rate = {c: n / w for c, w in wall.items()}
    print(f"\n{n} jobs of {' '.join(CMD)}, {p} at once, median of {rounds} round(s); "
          f"load average {load0[0]:.2f} -> {load1[0]:.2f}")
    # paired: each round's ratio to the bwrap pool of the same round, then the median
    paired = {c: statistics.median(b / w for w, b in zip(walls[c], walls["bwrap pool"]))
              for c in names}
    cpu = {c: statistics.median(v) for c, v in cpu_ms.items() if v}
    for c in names:
        print(f"  {c:12} {rate[c]:7.1f} jobs/s   {paired[c]:.2f}x bwrap pool (median of "
              f"the rounds' paired ratios; of the medians: "
              f"{rate[c] / rate['bwrap pool']:.2f}x)"
              + (f"; CPU {cpu[c]:.1f} ms a job" if c in cpu else ""))
    out = {"machine": info, "jobs": n, "parallel": p, "rounds": rounds, "walls": walls,
           "jobs_per_s": rate, "paired_ratio": paired, "ratio_local": paired["batch local"],
           "goal": f"batch local >= {GOAL}x bwrap pool", "cpu_ms_per_job": cpu}
    if "batch ray" in wall:
        over = (wall["batch ray"] - wall["batch local"]) / n * p * 1000
        out["ray_overhead_ms_per_job"] = over
        out["ray_driver_cpu_ms_per_job"] = statistics.median(driver_cpu)
        print(f"  Ray: {over:+.1f} ms of slot time per job over batch local; the driver's "
              f"own CPU {out['ray_driver_cpu_ms_per_job']:.2f} ms per job")
    ok = out["ratio_local"] >= GOAL
    print(f"goal: batch local >= {GOAL}x bwrap pool: {'met' if ok else 'NOT met'} "
          f"({out['ratio_local']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
