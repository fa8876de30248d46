"""Live sandboxes: create to ready, pool claim, and one command against a bare host exec.

    .venv/bin/python bench/live.py [--quick] [--runs N] [--json FILE]

Side by side in one process (namespace tier, default policy), each a median of --runs
(default 50, --quick 10) after warm-up runs that are dropped:

  create        corral.Sandbox.create(): from the call to a sandbox ready for commands
                (bwrap running, its init and holder started, the Target opened); the
                kill() after it is timed apart ("kill")
  claim         pool.claim() from a corral.Pool(size=4) whose sandboxes are ready (the
                script waits for the filler between claims, so each claim finds one)
  run_true      sb.commands.run(["true"]) (an argv, no shell) in one
                live sandbox: enter (fork, setns, clone), exec, supervise, Result
  host_true     subprocess.run(["/bin/true"]) on the host, no sandbox: the floor
  run_sh_true   sb.commands.run("true"): the same through /bin/sh -c
  run_true_b2b  run_true right after another command, with no pause: its entrant is
                still being prepared (or is made on the spot)
  run_true_cpu  the CPU time (time.thread_time) of the calling thread over run_true,
  host_true_cpu and over host_true: what the host side itself costs, less sensitive to
                the machine's load than the wall times (the rest of run_true's wall time
                is waiting: the entrant's vfork + exec inside, the command, scheduling)

gvisor tier, the same sandbox life (default policy with isolation = "gvisor"; indicative:
runsc 20221219 on the ptrace platform), side by side in the same run:

  gvisor_create       Sandbox.create(): runsc run started, its state file says running
  gvisor_kill         kill() after it: runsc, gofer, Sentry, cgroup, mounts gone
  gvisor_run_true     sb.commands.run(["true"]): a `runsc exec` of it, supervised
  gvisor_run_sh_true  sb.commands.run("true") through /bin/sh -c
  runsc_exec_true     the raw tool: `runsc exec <id> /bin/true` into the same sandbox by
                      subprocess.run, no corral in between (the floor of this mechanism)

Memory (printed apart, not timed): idle_pss_mb, the PSS of the processes in one idle
sandbox's own cgroup (namespace: bwrap, its init, the holder; gvisor: runsc run, the gofer,
the Sentry and its ptrace stubs, the sandbox's init and holder), from /proc/PID/smaps_rollup.

Each of run_true, host_true and run_sh_true follows a GAP_S pause (agents think between
commands; the sandbox prepares the next command's entrant meanwhile). Variants alternate
run by run, so a load spike hits them alike. Goals (issue 16): create median <= 15 ms; claim <= 1 ms; run_true <= 1.1 x
host_true + 2 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "src"))

import corral

GOALS = {"create_ms": 15.0, "claim_ms": 1.0}
#: the pause before each timed command (agents think between commands): the sandbox's
#: thread forks the next command's entrant meanwhile; run_true_b2b has none
GAP_S = 0.02


def med(xs):
    return statistics.median(xs) * 1000


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.95))] * 1000


def bench(runs: int, warm: int) -> dict:
    samples: dict[str, list[float]] = {k: [] for k in (
        "create", "kill", "claim", "run_true", "host_true", "run_sh_true",
        "run_true_b2b", "run_true_cpu", "host_true_cpu")}
    for i in range(warm + runs):
        t = time.perf_counter()
        sb = corral.Sandbox.create(timeout=60)
        t1 = time.perf_counter()
        sb.kill()
        t2 = time.perf_counter()
        if i >= warm:
            samples["create"].append(t1 - t)
            samples["kill"].append(t2 - t1)
    with corral.Pool(size=4, timeout=60) as pool:
        for i in range(warm + runs):
            deadline = time.monotonic() + 60
            while pool.ready() < pool.size and time.monotonic() < deadline:
                time.sleep(0.01)
            t = time.perf_counter()
            sb = pool.claim()
            t1 = time.perf_counter()
            sb.kill()
            if i >= warm:
                samples["claim"].append(t1 - t)
    sb = corral.Sandbox.create(timeout=600)
    try:
        for i in range(warm + runs):
            time.sleep(GAP_S)     # think time: the next command's entrant gets ready
            c = time.thread_time()
            t = time.perf_counter()
            r = sb.commands.run(["true"])
            t1 = time.perf_counter()
            c1 = time.thread_time()
            assert r.verdict == "ok", r
            time.sleep(GAP_S)
            c2 = time.thread_time()
            t2 = time.perf_counter()
            subprocess.run(["/bin/true"], check=True)
            t3 = time.perf_counter()
            c3 = time.thread_time()
            time.sleep(GAP_S)
            t4 = time.perf_counter()
            r = sb.commands.run("true")
            t5 = time.perf_counter()
            assert r.verdict == "ok", r
            r = sb.commands.run(["true"])     # back to back: no time to prepare
            t6 = time.perf_counter()
            if i >= warm:
                samples["run_true"].append(t1 - t)
                samples["host_true"].append(t3 - t2)
                samples["run_sh_true"].append(t5 - t4)
                samples["run_true_b2b"].append(t6 - t5)
                samples["run_true_cpu"].append(c1 - c)
                samples["host_true_cpu"].append(c3 - c2)
    finally:
        sb.kill()
    return samples


def bench_gvisor(runs: int, warm: int) -> dict:
    """The gvisor tier's live sandbox, against the raw `runsc exec` of the same command."""
    samples: dict[str, list[float]] = {k: [] for k in (
        "gvisor_create", "gvisor_kill", "gvisor_run_true", "gvisor_run_sh_true",
        "runsc_exec_true")}
    policy = {"isolation": "gvisor"}
    for i in range(warm + max(runs // 5, 3)):
        t = time.perf_counter()
        sb = corral.Sandbox.create(policy, timeout=60)
        t1 = time.perf_counter()
        sb.kill()
        t2 = time.perf_counter()
        if i >= warm:
            samples["gvisor_create"].append(t1 - t)
            samples["gvisor_kill"].append(t2 - t1)
    sb = corral.Sandbox.create(policy, timeout=600)
    live = sb._live
    raw = [live.backend.runsc, f"--root={live.state}", "exec", live.cid, "/bin/true"]
    try:
        for i in range(warm + runs):
            time.sleep(GAP_S)
            t = time.perf_counter()
            r = sb.commands.run(["true"])
            t1 = time.perf_counter()
            assert r.verdict == "ok", r
            time.sleep(GAP_S)
            t2 = time.perf_counter()
            subprocess.run(raw, check=True)
            t3 = time.perf_counter()
            time.sleep(GAP_S)
            t4 = time.perf_counter()
            r = sb.commands.run("true")
            t5 = time.perf_counter()
            assert r.verdict == "ok", r
            if i >= warm:
                samples["gvisor_run_true"].append(t1 - t)
                samples["runsc_exec_true"].append(t3 - t2)
                samples["gvisor_run_sh_true"].append(t5 - t4)
    finally:
        sb.kill()
    return samples


def idle_pss_mb(tier: str) -> float:
    """PSS (MB) of the processes in an idle live sandbox's own cgroup, 1 s after create."""
    sb = corral.Sandbox.create({"isolation": tier}, timeout=60)
    try:
        time.sleep(1)
        total = 0
        for pid in sb._live.sandbox_cg.pids():
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            total += int(line.split()[1])
            except OSError:
                pass
        return total / 1024
    finally:
        sb.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--tiers", default="namespace,gvisor",
                    help="comma-separated: namespace, gvisor (default both)")
    args = ap.parse_args()
    runs = args.runs or (10 if args.quick else 50)
    tiers = set(args.tiers.split(","))
    load = os.getloadavg()
    samples = bench(runs, warm=3) if "namespace" in tiers else {}
    if "gvisor" in tiers:
        samples.update(bench_gvisor(runs, warm=2))
    stats = {k: {"median_ms": round(med(v), 3), "p95_ms": round(p95(v), 3),
                 "min_ms": round(min(v) * 1000, 3)} for k, v in samples.items()}
    host = stats["host_true"]["median_ms"] if "host_true" in stats else float("nan")
    goal_run = 1.1 * host + 2.0
    print(f"live sandboxes ({', '.join(sorted(tiers))}), {runs} runs each (gvisor_create: "
          f"{max(runs // 5, 3)}); load average before: "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'':14}{'median ms':>10}{'p95 ms':>10}{'min ms':>10}  goal")
    goals = {"create": f"<= {GOALS['create_ms']:g}", "claim": f"<= {GOALS['claim_ms']:g}",
             "run_true": f"<= {goal_run:.2f} (1.1 x host_true + 2)"}
    for k, s in stats.items():
        print(f"{k:14}{s['median_ms']:>10.3f}{s['p95_ms']:>10.3f}{s['min_ms']:>10.3f}  "
              f"{goals.get(k, '')}")
    if "run_true" in stats:
        print(f"run_true / host_true = {stats['run_true']['median_ms'] / host:.2f}x")
    pss = {t: round(idle_pss_mb(t), 2) for t in sorted(tiers)}
    print("idle_pss_mb (one idle sandbox's cgroup): "
          + ", ".join(f"{t} {v:.1f}" for t, v in pss.items()))
    if "gvisor_run_true" in stats:
        g = stats["gvisor_run_true"]["median_ms"]
        print(f"gvisor_run_true / runsc_exec_true = "
              f"{g / stats['runsc_exec_true']['median_ms']:.2f}x")
        if "create" in stats:
            print(f"gvisor_create / create = "
                  f"{stats['gvisor_create']['median_ms'] / stats['create']['median_ms']:.1f}x; "
                  f"gvisor_run_true / run_true = {g / stats['run_true']['median_ms']:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "load_before": load, "stats": stats, "idle_pss_mb": pss,
                       "samples": samples, "goals": {**GOALS, "run_true_ms": goal_run}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
