"""Start-up latency of a sandboxed `/bin/true` and `/usr/bin/python3 -c pass`.

    .venv/bin/python bench/startup.py [--runs N] [--quick] [--json FILE] [--no-runsc]
                                      [--baseline-cli LAUNCHER]

Each sample is the wall time from the call to the finished result (exit status or corral
Result), teardown included, with fresh namespaces every run. Variants (bench/README.md):

  bare          subprocess.run(cmd): fork+exec of the command itself, the floor
  bwrap         subprocess.run(bwrap ...): the exact bwrap argv corral builds (read from an
                open Sandbox), the same seccomp program on an fd of our own, the same
                unprivileged uid/gid and environment, the same scratch binds
  corral.run    corral.run(cmd): a fresh Sandbox per run (what a one-shot run costs)
  sb.exec       Sandbox.exec(cmd) on one Sandbox kept open (the per-exec cost)
  cli           `.venv/bin/corral run -- cmd` as a subprocess (interpreter start included)
  runsc         `runsc --network=none --platform=ptrace do cmd` (optional; skipped with
                the error recorded if runsc is missing or fails)
  interp        `/usr/bin/python3 -I -c pass`: one bare interpreter start, the floor of any
                Python CLI (measured once per round, shown under /bin/true); issue 14's goal:
                cli - bwrap <= 1.3x interp
  cli-base      with --baseline-cli: another corral launcher (an older checkout's
                .venv/bin/corral) `run -- cmd`, in the same rounds: before/after side by side

Beside the wall time, each sample's CPU time (user + system) is kept: of the child processes
for the variants that start one (getrusage(RUSAGE_CHILDREN): what was waited for), of this
process and its children for the in-process ones. bwrap exits on its command's status
without reaping the pid namespace's init (which reaped the command); corral, a child
subreaper while it runs, reaps that init itself, so its CPU (and the command's) is in
corral's figures. For the raw bwrap variant this process is a subreaper too, and after
bwrap has exited it reaps the init it inherits before the CPU time is read (after the
wall time is: a user of raw bwrap need not wait for it), so both count the same processes.
On a shared, loaded host CPU time moves far less than wall time; issue 14's goal is also
given on it and on the minima.

Variants run round robin: every variant once per round, in an order shuffled afresh each
round (seeded: --seed), so that no variant always follows the same one (a heavy one such
as runsc leaves the kernel cleaning up after it); the first WARMUP rounds are discarded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time

WARMUP = 2
#: the variants that run in this process (their CPU time includes this process's own)
IN_PROCESS = ("corral.run", "sb.exec")
COMMANDS = {
    "true": ["/bin/true"],
    "python3": ["/usr/bin/python3", "-c", "pass"],
}
RAW_BWRAP_SPAWN = "subprocess.run (fork+exec: user=/group=/extra_groups= rule out vfork)"
GOAL_INPROC_RATIO = 1.3   # issue 2: in-process <= 1.3x raw bwrap
GOAL_CLI_EXTRA_MS = 30.0  # issue 2: CLI <= raw bwrap + 30 ms
GOAL_CLI_INTERP = 1.3     # issue 14: CLI - raw bwrap <= 1.3x a bare interpreter start
INTERP = ["/usr/bin/python3", "-I", "-c", "pass"]


class VariantFailed(Exception):
    pass


def round_orders(units: list, rounds: int, seed: int) -> list[list]:
    """The order of every round: each a fresh shuffle of `units` (a fixed or merely
    rotated cycle puts every unit after the same predecessor, which biases it)."""
    rng = random.Random(seed)
    return [rng.sample(units, len(units)) for _ in range(rounds)]


def sh(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
        return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr) \
            else f"exit {p.returncode}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e})"


def machine() -> dict:
    cpu, virt = "", "no"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not cpu:
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and " hypervisor" in line:
                    virt = "yes (a VM: the cpuinfo flags list 'hypervisor')"
    except OSError:
        pass
    import corral
    from corral.linux import limits

    cg = limits.detect()
    cgroup = f"{cg.version} (as corral uses it)" if cg.version else f"none: {cg.reason}"

    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "vm": virt,
        "cgroup": cgroup,
        "kernel": platform.release(),
        "python": f"{platform.python_implementation()} {platform.python_version()} "
                  f"({sys.executable})",
        "bwrap": sh(["bwrap", "--version"]),
        "runsc": sh(["runsc", "--version"]) if shutil.which("runsc") else "not installed",
        "corral": corral.__version__,
        "euid": os.geteuid(),
    }


def run_checked(argv: list[str], **kw) -> None:
    """subprocess.run with stdin from /dev/null and both outputs captured (as corral does);
    VariantFailed unless it exits 0."""
    p = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True, **kw)
    if p.returncode != 0:
        err = (p.stderr or b"").decode(errors="replace").strip()[-500:]
        raise VariantFailed(f"exit {p.returncode}: {err}")


def check_result(r) -> None:
    if r.verdict != "ok" or r.exit_code != 0:
        raise VariantFailed(f"verdict {r.verdict}, exit {r.exit_code}: {r.stderr[-500:]!r} "
                            f"events {r.events}")


class Bench:
    def __init__(self, use_runsc: bool, baseline_cli: str | None = None) -> None:
        import corral
        from corral.linux import _sys, seccomp
        from corral.plan import Environment
        from corral.runtime.sandbox import Sandbox

        self.corral = corral
        self.sb = Sandbox()            # default policy; kept open for the whole benchmark
        self.sb.open()
        live = self.sb._live
        # corral passes the same program on a pipe it fills once the limits are on (the
        # gate, backends/namespace.py); here it is a memfd of our own
        self.seccomp_fd = seccomp.bpf_fd(seccomp.bpf_bytes(None))
        full = live.direct_argv(["CMD"], self.seccomp_fd)
        self.bwrap_prefix = full[:full.index("--")]
        self.uid, self.gid = live.uid, live.gid
        self.env = dict(self.sb.plan.find(Environment)[0].env)
        self.switch_user = os.geteuid() == 0 and (self.uid, self.gid) != (0, 0)
        bindir = os.path.dirname(sys.executable)
        self.cli = os.path.join(bindir, "corral")
        if not os.access(self.cli, os.X_OK):
            self.cli = shutil.which("corral") or self.cli
        self.runsc = shutil.which("runsc") if use_runsc else None
        self.baseline_cli = baseline_cli
        self.orphans_pending = False
        self._sys = _sys   # its counted subreaper_acquire/release, as corral's own runs use

    def close(self) -> None:
        os.close(self.seccomp_fd)
        self.sb.close()

    # -- the variants: each runs argv once and raises VariantFailed unless it exits 0 -------
    def bare(self, argv: list[str]) -> None:
        run_checked(argv, env=self.env)

    def bwrap(self, argv: list[str]) -> None:
        os.lseek(self.seccomp_fd, 0, os.SEEK_SET)  # bwrap reads from the current offset
        kw = {}
        if self.switch_user:
            kw = {"user": self.uid, "group": self.gid, "extra_groups": []}
        self._sys.subreaper_acquire()   # bwrap's init, orphaned when bwrap exits, comes to us
        try:
            run_checked(self.bwrap_prefix + ["--", *argv], env=self.env,
                        pass_fds=(self.seccomp_fd,), **kw)
        except BaseException:
            self._sys.subreaper_release()
            raise
        self.orphans_pending = True   # reap_orphans(), after the wall time is taken

    def reap_orphans(self) -> None:
        """Wait for and reap what bwrap left to this process (its pid namespace's init,
        which has its parent-death signal), so that its CPU time is counted; then stop
        being a subreaper. Only bwrap's leftovers can be our children here: every other
        variant waits for its own before it returns."""
        if not self.orphans_pending:
            return
        self.orphans_pending = False
        try:
            while True:
                os.waitpid(-1, 0)
        except ChildProcessError:
            pass
        finally:
            self._sys.subreaper_release()

    def corral_run(self, argv: list[str]) -> None:
        check_result(self.corral.run(argv))

    def sb_exec(self, argv: list[str]) -> None:
        check_result(self.sb.exec(argv))

    def cli_run(self, argv: list[str]) -> None:
        run_checked([self.cli, "run", "--", *argv])

    def cli_base(self, argv: list[str]) -> None:
        run_checked([self.baseline_cli, "run", "--", *argv])

    def runsc_do(self, argv: list[str]) -> None:
        run_checked([self.runsc, "--network=none", "--platform=ptrace", "do", *argv],
                    timeout=60)

    def interp(self, argv: list[str]) -> None:
        run_checked(INTERP)

    def variants(self) -> dict:
        v = {"bare": self.bare, "bwrap": self.bwrap, "corral.run": self.corral_run,
             "sb.exec": self.sb_exec, "cli": self.cli_run, "interp": self.interp}
        if self.baseline_cli:
            v["cli-base"] = self.cli_base
        if self.runsc:
            v["runsc"] = self.runsc_do
        return v


def cpu_ms(with_self: bool) -> float:
    """CPU time (user + system, ms) of the waited-for children so far, and of this process
    too when `with_self`."""
    total = 0.0
    for who in (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF) if with_self else \
            (resource.RUSAGE_CHILDREN,):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total * 1000


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, help="measured runs per variant (default 30, "
                    "--quick 10); 2 warm-up runs more are discarded")
    ap.add_argument("--quick", action="store_true", help="10 runs per variant")
    ap.add_argument("--json", metavar="FILE", help="write every raw sample here")
    ap.add_argument("--no-runsc", action="store_true", help="skip the runsc variant")
    ap.add_argument("--gap", type=float, default=0.0, metavar="MS",
                    help="idle this long before each run (default 0: back to back); "
                         "e.g. 200 to see a one-shot call on a quiet host")
    ap.add_argument("--seed", type=int, default=1, help="of the per-round shuffle (default 1)")
    ap.add_argument("--baseline-cli", metavar="LAUNCHER",
                    help="also time this corral launcher (e.g. an older checkout's "
                         ".venv/bin/corral) as the cli-base variant, in the same rounds")
    args = ap.parse_args()
    runs = args.runs if args.runs is not None else (10 if args.quick else 30)
    if runs < 1:
        ap.error("--runs must be at least 1")

    info = machine()
    print("machine:")
    for k in ("nproc", "cpu", "vm", "cgroup", "kernel", "python", "bwrap", "runsc", "corral",
              "euid"):
        print(f"  {k:7} {info[k]}")
    print(f"  raw bwrap started with {RAW_BWRAP_SPAWN}")

    if args.baseline_cli and not os.access(args.baseline_cli, os.X_OK):
        ap.error(f"--baseline-cli: {args.baseline_cli} is not an executable launcher")
    bench = Bench(use_runsc=not args.no_runsc, baseline_cli=args.baseline_cli)
    errors: dict[str, str] = {}
    if args.no_runsc:
        errors["runsc"] = "skipped (--no-runsc)"
    elif not bench.runsc:
        errors["runsc"] = "runsc not installed"
    funcs = bench.variants()
    # the interpreter start does not depend on the command: one unit, under "true"
    units = [(v, c) for v in funcs for c in COMMANDS if v != "interp" or c == "true"]
    samples: dict[str, list[float]] = {f"{v} {c}": [] for v, c in units}
    cpu: dict[str, list[float]] = {k: [] for k in samples}
    warm: dict[str, list[float]] = {k: [] for k in samples}
    total = WARMUP + runs
    t0 = time.monotonic()
    try:
        for rnd, order in enumerate(round_orders(units, total, args.seed)):
            for v, c in order:
                if v in errors:
                    continue
                key = f"{v} {c}"
                if args.gap:
                    time.sleep(args.gap / 1000)
                try:
                    r0 = cpu_ms(v in IN_PROCESS)
                    start = time.perf_counter_ns()
                    funcs[v](COMMANDS[c])
                    ms = (time.perf_counter_ns() - start) / 1e6
                    bench.reap_orphans()   # raw bwrap's init: its CPU counted, not its wait
                    used = cpu_ms(v in IN_PROCESS) - r0
                except (VariantFailed, OSError, subprocess.SubprocessError) as e:
                    errors[v] = f"{key}, round {rnd}: {type(e).__name__}: {e}"
                    print(f"  {v} failed and is dropped: {errors[v]}", file=sys.stderr)
                    continue
                (warm if rnd < WARMUP else samples)[key].append(ms)
                if rnd >= WARMUP:
                    cpu[key].append(used)
            if sys.stderr.isatty():
                print(f"\r  round {rnd + 1}/{total} ({time.monotonic() - t0:.0f}s)", end="",
                      file=sys.stderr, flush=True)
        if sys.stderr.isatty():
            print(file=sys.stderr)
    finally:
        bench.close()

    summary: dict[str, dict] = {}
    for key, xs in samples.items():
        if xs and key.split()[0] not in errors:
            summary[key] = {"n": len(xs), "median_ms": statistics.median(xs),
                            "p95_ms": percentile(xs, 0.95), "min_ms": min(xs),
                            "cpu_median_ms": statistics.median(cpu[key])}

    print(f"\n{runs} measured runs per variant after {WARMUP} warm-up runs, round robin in a "
          f"shuffled order (seed {args.seed})"
          f"{f', {args.gap:g} ms idle before each' if args.gap else ', back to back'}; "
          f"ms from the call to the result, teardown included")
    for c, argv in COMMANDS.items():
        base = summary.get(f"bwrap {c}", {}).get("median_ms")
        print(f"\n{' '.join(argv)}")
        print(f"  {'variant':12} {'median ms':>10} {'p95 ms':>10} {'min ms':>10} "
              f"{'x bwrap':>8} {'cpu ms':>8}")
        for v in funcs:
            if v == "interp" and c != "true":
                continue
            s = summary.get(f"{v} {c}")
            if s is None:
                print(f"  {v:12} {'failed: see below':>41}")
                continue
            ratio = f"{s['median_ms'] / base:.2f}" if base else "-"
            s["ratio_to_bwrap"] = s["median_ms"] / base if base else None
            print(f"  {v:12} {s['median_ms']:10.2f} {s['p95_ms']:10.2f} {s['min_ms']:10.2f} "
                  f"{ratio:>8} {s['cpu_median_ms']:8.2f}")

    goals = []
    print("\ngoals (issue 2), on medians:")
    for c in COMMANDS:
        base = summary.get(f"bwrap {c}", {}).get("median_ms")
        if base is None:
            continue
        for v in ("corral.run", "sb.exec"):
            s = summary.get(f"{v} {c}")
            if s:
                ok = s["median_ms"] <= GOAL_INPROC_RATIO * base
                goals.append({"goal": f"{v} <= {GOAL_INPROC_RATIO}x bwrap", "command": c,
                              "value_ms": s["median_ms"], "limit_ms": GOAL_INPROC_RATIO * base,
                              "met": ok})
                print(f"  {c:8} {v:10} <= {GOAL_INPROC_RATIO}x bwrap: {s['median_ms']:7.2f} "
                      f"vs {GOAL_INPROC_RATIO * base:7.2f} ms "
                      f"({s['median_ms'] / base:.2f}x)  {'MET' if ok else 'NOT MET'}")
        s = summary.get(f"cli {c}")
        if s:
            ok = s["median_ms"] <= base + GOAL_CLI_EXTRA_MS
            goals.append({"goal": f"cli <= bwrap + {GOAL_CLI_EXTRA_MS:g} ms", "command": c,
                          "value_ms": s["median_ms"], "limit_ms": base + GOAL_CLI_EXTRA_MS,
                          "met": ok})
            print(f"  {c:8} {'cli':10} <= bwrap + {GOAL_CLI_EXTRA_MS:g} ms: "
                  f"{s['median_ms']:7.2f} vs {base + GOAL_CLI_EXTRA_MS:7.2f} ms "
                  f"(+{s['median_ms'] - base:.2f} ms)  {'MET' if ok else 'NOT MET'}")

    interp = summary.get("interp true", {}).get("median_ms")
    base = summary.get("bwrap true", {}).get("median_ms")
    for v in ("cli", "cli-base"):
        cli = summary.get(f"{v} true", {}).get("median_ms")
        if not (interp and base and cli):
            continue
        extra = cli - base
        ok = extra <= GOAL_CLI_INTERP * interp
        goals.append({"goal": f"{v} - bwrap <= {GOAL_CLI_INTERP}x interp", "command": "true",
                      "value_ms": extra, "limit_ms": GOAL_CLI_INTERP * interp, "met": ok})
        print(f"  true     {v + ' - bwrap':14} <= {GOAL_CLI_INTERP}x interp: {extra:7.2f} vs "
              f"{GOAL_CLI_INTERP * interp:7.2f} ms ({extra / interp:.2f}x a bare "
              f"`python3 -I -c pass`, {interp:.2f} ms)  {'MET' if ok else 'NOT MET'}")
        mins = [summary[f"{x} true"]["min_ms"] for x in (v, "bwrap", "interp")]
        cpus = [summary[f"{x} true"]["cpu_median_ms"] for x in (v, "bwrap", "interp")]
        for what, (c, b, i) in (("minima", mins), ("CPU time", cpus)):
            print(f"  {'':8} {'':14}    on {what + ':':9} {c - b:7.2f} vs {GOAL_CLI_INTERP * i:7.2f} "
                  f"ms ({(c - b) / i:.2f}x)")

    if errors:
        print("\nnot measured:")
        for v, e in errors.items():
            print(f"  {v}: {e}")

    if args.json:
        out = {"machine": info, "runs": runs, "warmup": WARMUP, "seed": args.seed,
               "gap_ms": args.gap,
               "raw_bwrap_spawn": RAW_BWRAP_SPAWN, "commands": COMMANDS,
               "bwrap_argv": bench.bwrap_prefix + ["--", "CMD..."],
               "bwrap_user": {"uid": bench.uid, "gid": bench.gid,
                              "switched": bench.switch_user},
               "order": [f"{v} {c}" for v, c in units], "errors": errors,
               "summary": summary, "goals": goals,
               "samples_ms": samples, "cpu_samples_ms": cpu, "warmup_samples_ms": warm}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nraw samples written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
