"""Where the time of `corral run -- /bin/true` goes, stage by stage (issue 14).

    .venv/bin/python bench/cli_breakdown.py [--runs N] [--launcher FILE] [--baseline FILE]

Each run is one fresh process started like the launcher (.venv/bin/corral: its #! line's
interpreter and flags, its prelude), which does what `corral run` does, step by step, and
notes the time after each step (time.perf_counter_ns, in the process):

  imports   import corral.cli, then the sandbox and the namespace tier (what `run` imports)
  prepare   Sandbox(policy): plan the default policy, check it against the tier
  open      the run dir, the /etc tree, scratch, the seccomp program, bwrap's argv
  exec      one `/bin/true`: its cgroup, bwrap, the command, the Result (bwrap's own time,
            measured on its own by bench/startup.py, is most of it)
  close     scratch unmounted, run dir removed, cgroups removed (an older build: given
            to the cgroup pool); the audit record appended to the spool (as `corral run`
            does)
  atexit    the exit handlers (an older build: the cgroup pool drained, the run's cgroups
            removed)

Around them, timed from outside (wall clock of the whole process, as bench/startup.py):
`interp` is the launcher's interpreter with its flags and nothing else (`-c pass`),
`interp -I` the bare `/usr/bin/python3 -I -c pass` of issue 14's goal, and `rest` what the
whole process took beyond `interp` and the stages (the launcher's prelude, parsing the
command line, and the exit: os._exit after cli.entry(), the interpreter's finalization
for an older launcher whose main() returns). Runs are interleaved, each stage's median and minimum are shown; the
machine is shared, so read the minimum as "at best" and the median as "typically".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

STAGES = ("imports", "prepare", "open", "exec", "close", "atexit")

DRIVER = """
import time; _t = [time.perf_counter_ns()]
{prelude}
import corral.cli
from corral.runtime.sandbox import Sandbox
import corral.backends.namespace
_t.append(time.perf_counter_ns())
r = corral.cli.parse_run_args(["--", "/bin/true"], want_command=True)
sb = Sandbox(corral.cli.effective_policy(r))
try:   # as cmd_run: the record goes to the spool at exit (no writer thread, no SQLite)
    from corral.audit.record import flush, use_spool
    use_spool()
except ImportError:   # an older build, without the audit store
    flush = lambda: None
try:   # as cmd_run: the sandbox's cgroups removed at close, not pooled
    from corral.backends.host.cgroups import POOL
    POOL.short_lived()
except (ImportError, AttributeError):   # an older build: they go to the pool
    pass
_t.append(time.perf_counter_ns())
sb.open()
_t.append(time.perf_counter_ns())
res = sb.exec(r.command)
assert res.exit_code == 0, res
_t.append(time.perf_counter_ns())
sb.close()
flush()
_t.append(time.perf_counter_ns())
import atexit, os
atexit._run_exitfuncs()
_t.append(time.perf_counter_ns())
os.write(1, " ".join(str(b - a) for a, b in zip(_t, _t[1:])).encode())
if hasattr(corral.cli, "entry"):   # it ends with os._exit; an older main() does not
    os._exit(0)
"""


def launcher_parts(path: str) -> tuple[list[str], str]:
    """The launcher's interpreter with its flags, and its prelude (what comes before it
    imports corral.cli)."""
    with open(path) as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].startswith("#!"):
        raise SystemExit(f"{path}: not a launcher script (no #! line)")
    interp = lines[0][2:].split()
    prelude = [ln for ln in lines[1:] if not ln.startswith(("from corral", "entry(",
                                                             "sys.exit("))]
    return interp, "\n".join(prelude)


def report(title: str, walls: dict[str, list[float]], stages: dict[str, list[float]]) -> None:
    print(title)
    print(f"  {'stage':10} {'median ms':>10} {'min ms':>8}")
    rows = [("interp -I", walls["interp -I"]), ("interp", walls["interp"]),
            *((s, stages[s]) for s in STAGES)]
    for name, xs in rows:
        print(f"  {name:10} {statistics.median(xs):10.2f} {min(xs):8.2f}")
    for what, f in (("median", statistics.median), ("min", min)):
        rest = f(walls["whole"]) - f(walls["interp"]) - sum(f(stages[s]) for s in STAGES)
        print(f"  rest ({what}: whole - interp - stages) {rest:.2f} ms")
    print(f"  {'whole':10} {statistics.median(walls['whole']):10.2f} "
          f"{min(walls['whole']):8.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--launcher", default=os.path.join(os.path.dirname(sys.executable),
                                                       "corral"))
    ap.add_argument("--baseline", metavar="LAUNCHER",
                    help="also this launcher (e.g. an older checkout's), in the same rounds, "
                         "right after each run of --launcher")
    args = ap.parse_args()
    launchers = [args.launcher] + ([args.baseline] if args.baseline else [])
    parts = {path: launcher_parts(path) for path in launchers}
    walls = {path: {"interp -I": [], "interp": [], "whole": []} for path in launchers}
    stages = {path: {s: [] for s in STAGES} for path in launchers}
    for _ in range(args.runs):
        for path in launchers:
            interp, prelude = parts[path]
            for name, argv in (("interp -I", ["/usr/bin/python3", "-I", "-c", "pass"]),
                               ("interp", [*interp, "-c", "pass"]),
                               ("whole", [*interp, "-c", DRIVER.format(prelude=prelude)])):
                t = time.perf_counter_ns()
                p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
                walls[path][name].append((time.perf_counter_ns() - t) / 1e6)
                if p.returncode != 0:
                    raise SystemExit(f"{name} failed: {p.stderr.decode()[-800:]}")
                if name == "whole":
                    for s, ns in zip(STAGES, p.stdout.split()):
                        stages[path][s].append(int(ns) / 1e6)
    for path in launchers:
        report(f"{args.runs} runs, launcher {path} ({' '.join(parts[path][0])})",
               walls[path], stages[path])
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
