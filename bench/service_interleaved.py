"""The service's round trips, two source trees interleaved call by call: `before` (e.g.
main's, exported with `git archive main src | tar -x -C DIR`) and this one, each a
`corral serve` of its own tree and a client process importing that tree's corral.client
(server and SDK each side's own), both up for the whole run. Each call goes to one side
then the other, in random order, after the same 20 ms pause (an agent thinks between
calls): a load spike hits both sides alike, which the per-round servers of
service_paired.py cannot promise on a busy machine. Per side and kind: the median and
25th percentile of the round trips and the server process's CPU per call (/proc/PID/stat
ticks, summed). Run as root from the repository root:

    .venv/bin/python bench/service_interleaved.py --before DIR/src [--runs 150]
        [--kinds tch]    # t: commands.run("true"), c: run_code("1+1"), h: GET /health
        [--tree-cpu]     # each server under perf stat: its whole CPU a call (server CPU 0)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, ".venv", "bin", "python")
#: a server of a given tree: .venv/bin/corral runs `python -IS`, which ignores PYTHONPATH
#: (both sides would run this tree's server), so each side's is started from its own src,
#: as the launcher starts it (the collector off until corral.cli.gc_back_on)
LAUNCH = ("import gc, sys; gc.disable(); sys.path.insert(0, {src!r}); "
          "sys.argv = ['corral'] + sys.argv[1:]; from corral.cli import main; sys.exit(main())")
sys.path.insert(0, HERE)
from _interleave import GAP_S, Sides, answer  # noqa: E402

NAMES = {"t": "run_true", "c": "run_code", "h": "health"}


def side(src: str) -> None:
    """One side: its server and its client, one call per line of stdin ("t", "c", "h";
    "q" ends), each answered with "MS SERVER_CPU_MS"."""
    sys.path.insert(0, src)
    import httpx
    from _serve import free_port, wait_up

    from corral import client

    tmp = tempfile.mkdtemp(prefix="corral-bench-il-")
    launch = [PY, "-c", LAUNCH.format(src=src)]
    tok = subprocess.run(launch + ["token", "create", "--name", "b", "--state-dir", tmp],
                         capture_output=True, text=True, check=True).stdout.split()[-1]
    url = f"http://127.0.0.1:{free_port()}"
    perf = os.environ.get("BENCH_TREE_CPU")     # main()'s --tree-cpu: perf stat's output
    if perf:
        launch = ["perf", "stat", "-x,", "-e", "task-clock", "-o", perf, "--"] + launch
    proc = subprocess.Popen(launch + ["serve", "--port", url.rsplit(":", 1)[1],
                                      "--state-dir", tmp], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_up(url, proc)
        tick = os.sysconf("SC_CLK_TCK")

        def cpu() -> float:
            if perf:
                return 0.0
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        sb = client.Sandbox.create({}, timeout=3600, api_url=url, api_key=tok)
        h = httpx.Client(base_url=url)
        calls = {"t": lambda: sb.commands.run("true"), "c": lambda: sb.run_code("1+1"),
                 "h": lambda: h.get("/health").raise_for_status()}
        for _ in range(5):
            for fn in calls.values():
                fn()

        def timed(fn) -> str:
            c0, t0 = cpu(), time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            return f"{dt * 1e3:.4f} {(cpu() - c0) * 1e3:.1f}"

        answer({k: (lambda fn=fn: timed(fn)) for k, fn in calls.items()})
        sb.kill()
        h.close()
    finally:
        target = proc.pid
        if perf:    # the server itself (perf stat writes its count once it exits)
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                target = int(f.read().split()[0])
        os.kill(target, 15)
        proc.wait(60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="the before tree's src/ directory")
    ap.add_argument("--runs", type=int, default=150)
    ap.add_argument("--kinds", default="tch")
    ap.add_argument("--tree-cpu", action="store_true",
                    help="run each server under `perf stat`: all the CPU of each side's "
                         "server, zygote, entrants and commands, per call (all kinds)")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        side(a.side)
        return 0
    if not a.before:
        ap.error("--before DIR/src is needed")
    trees = {"before": os.path.abspath(a.before), "after": os.path.join(ROOT, "src")}
    tmp = tempfile.mkdtemp(prefix="corral-bench-il-cpu-")
    perf = {k: os.path.join(tmp, k) for k in trees}
    sides = Sides({k: [PY, __file__, "--side", src] for k, src in trees.items()},
                  {k: dict(os.environ, BENCH_TREE_CPU=perf[k]) for k in trees}
                  if a.tree_cpu else None)
    ms = {(s, k): [] for s in trees for k in a.kinds}
    cpu = {(s, k): 0.0 for s in trees for k in a.kinds}
    for i in range(a.runs):
        for k in a.kinds:
            for s in sides.order(i, shuffle=True):
                t, c = sides.ask(s, k).split()
                ms[(s, k)].append(float(t))
                cpu[(s, k)] += float(c)
    sides.close()
    la = os.getloadavg()
    print(f"interleaved call by call, {a.runs} calls a kind and side, {GAP_S * 1e3:g} ms "
          f"apart (load {la[0]:.1f} {la[1]:.1f} {la[2]:.1f}: indicative)")
    for k in a.kinds:
        cells = []
        for s in ("before", "after"):
            xs = ms[(s, k)]
            cells.append(f"{s} {statistics.median(xs):6.2f} ms (p25 "
                         f"{statistics.quantiles(xs, n=4)[0]:5.2f}, server CPU "
                         f"{cpu[(s, k)] / a.runs:4.2f} ms)")
        ratio = statistics.median(ms[("after", k)]) / statistics.median(ms[("before", k)])
        print(f"  {NAMES[k]:9s} " + "   ".join(cells) + f"   after/before {ratio:.2f}")
    if a.tree_cpu:
        calls = a.runs * len(a.kinds) + 5 * 3 + 1     # with the warm-up and the create
        got = {}
        for s, path in perf.items():
            with open(path) as f:
                got[s] = next(float(x.split(",")[0]) for x in f if "task-clock" in x)
        print("  server side's CPU (every process, perf stat task-clock), ms a call: "
              + "   ".join(f"{s} {got[s] / calls:.2f}" for s in ("before", "after")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
