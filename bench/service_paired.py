"""`commands.run("true")` over loopback HTTP with the SDK, two source trees side by side:
a `before` tree (e.g. main, exported with `git archive main src | tar -x -C DIR`) and this
one, in alternating rounds (A, B, A, B...), each round a fresh `corral serve` of that tree
and a client process importing that tree's corral.client, so that server, zygote and SDK
are each side's own. Per round: the median round trip, the client's CPU per call
(thread_time), and the server side's CPU per call: the server process, its zygote and
everything the zygote reaped (the entrants and the commands themselves), from
/proc/PID/stat (utime + stime + cutime + cstime), less sensitive to the machine's load
than the wall times. Run as root from the repository root:

    .venv/bin/python bench/service_paired.py --before DIR/src [--rounds 6] [--runs 40]
        [--before-http h11]

`--before-http h11`: the before tree's server on uvicorn's h11 parser even if httptools is
installed (main's lock has no httptools: what it ran with).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _serve import free_port, wait_up  # bench/_serve.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, ".venv", "bin", "python")
GAP_S = 0.02

SERVER = """
import os, sys
sys.path.insert(0, {src!r})
if {h11!r}:
    import uvicorn
    _init = uvicorn.Config.__init__
    def init(self, app, **kw):
        kw["http"] = "h11"
        _init(self, app, **kw)
    uvicorn.Config.__init__ = init
sys.argv = ["corral"] + sys.argv[1:]
from corral.cli import main
sys.exit(main())
"""


def _ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(v) for v in x[11:15])


def _tree_ticks(pid: int) -> int:
    """The server's and its direct children's (the zygotes) CPU, with what they reaped."""
    total = _ticks(pid)
    kids = []
    try:    # each thread's: a child forked by another thread is listed under it
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += f.read().split()
    except OSError:
        pass
    return total + sum(_ticks(int(k)) for k in kids)


def side(src: str, h11: bool, runs: int) -> dict:
    """One round of one tree (run in a process of its own: its corral is `src`'s)."""
    sys.path.insert(0, src)

    from corral import client

    tmp = tempfile.mkdtemp(prefix="corral-bench-paired-")
    state = os.path.join(tmp, "state")
    launcher = [PY, "-c", SERVER.format(src=src, h11=h11)]
    tok = subprocess.run(launcher + ["token", "create", "--name", "bench", "--state-dir",
                                     state], capture_output=True, text=True,
                         check=True).stdout.split()[-1]
    port = free_port()
    log = open(os.path.join(tmp, "serve.log"), "wb")
    proc = subprocess.Popen(launcher + ["serve", "--port", str(port), "--state-dir", state],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    sb = None
    try:
        wait_up(url, proc)
        sb = client.Sandbox.create({}, timeout=600, api_url=url, api_key=tok)
        for _ in range(5):
            sb.commands.run("true")
        wall, ccpu, scpu = [], 0.0, 0
        for _ in range(runs):
            time.sleep(GAP_S)
            s0 = _tree_ticks(proc.pid)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            r = sb.commands.run("true")
            wall.append(time.perf_counter() - t0)
            ccpu += time.thread_time() - c0
            scpu += _tree_ticks(proc.pid) - s0
            assert r.exit_code == 0, r
    finally:
        if sb is not None:
            sb.kill()
        proc.terminate()
        proc.wait(60)
        log.close()
    return {"median_ms": statistics.median(wall) * 1e3,
            "client_cpu_ms": ccpu / runs * 1e3,
            "server_cpu_ms": scpu / os.sysconf("SC_CLK_TCK") / runs * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the before tree's src/ directory")
    ap.add_argument("--before-http", default="", help="h11: force uvicorn's h11 parser")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--side", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        print(json.dumps(side(a.side[0], a.side[1] == "1", int(a.side[2]))))
        return 0
    trees = {"before": (os.path.abspath(a.before), a.before_http == "h11"),
             "after": (os.path.join(ROOT, "src"), False)}
    out: dict[str, list[dict]] = {k: [] for k in trees}
    loads = []
    for i in range(a.rounds):
        order = list(trees) if i % 2 == 0 else list(trees)[::-1]
        for k in order:
            src, h11 = trees[k]
            p = subprocess.run([PY, __file__, "--before", a.before, "--side", src,
                                "1" if h11 else "0", str(a.runs)], capture_output=True,
                               text=True, check=True)
            out[k].append(json.loads(p.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
    print(f"commands.run('true') over loopback HTTP with the SDK, {a.rounds} rounds of "
          f"{a.runs}, alternating (load {min(loads):.1f}-{max(loads):.1f}: indicative)")
    for k, rs in out.items():
        med = [r["median_ms"] for r in rs]
        print(f"  {k:7s} median of medians {statistics.median(med):6.2f} ms "
              f"(rounds {' '.join(f'{m:.2f}' for m in med)}); client CPU "
              f"{statistics.median(r['client_cpu_ms'] for r in rs):.2f} ms/call; server side "
              f"CPU {statistics.median(r['server_cpu_ms'] for r in rs):.2f} ms/call")
    ratios = [b["median_ms"] / a_["median_ms"] for a_, b in zip(out["before"], out["after"])]
    print(f"  after/before, round by round: {' '.join(f'{r:.2f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
