"""The service's speed (issue 17): corral's own SDK (corral.client) against a real
`corral serve` on loopback, side by side in one run with the in-process API
(corral.Sandbox) and a bare HTTP round trip (GET /health), as ratios. Indicative on a
loaded machine; run as root from the repository root:

    .venv/bin/python bench/service_speed.py [--runs 30] [--json FILE]

  health          GET /health on a kept-alive connection: the floor of one HTTP round
                  trip through uvicorn (no token, no sandbox)
  create          client.Sandbox.create({}) to its answer (the sandbox ready for
                  commands); the kill after it not timed. In-process: corral.Sandbox.create
  run_true        sb.commands.run("true") round trip in a warm sandbox (after a GAP_S pause:
                  agents think between commands, the sandbox readies the next entrant)
  run_code        sb.run_code("1+1") round trip in a warm python context
  concurrent      100 client.Sandbox.create({}) by 10 client threads at once (each then
                  killed): errors and the wall time of the whole
  server CPU      the server process's CPU time over the timed HTTP calls of each row,
                  per call (/proc/PID/stat ticks summed over the runs): less sensitive to
                  the machine's load than the wall times
  mcp_run_code    `corral mcp` over stdio, the official MCP SDK's client: call_tool
                  run_code {"code": "1+1"} round trip in the session's warm sandbox

Goals (issue 17): create median <= 25 ms; run_true <= 5 ms; run_code <= 3 ms; concurrent
with no error; mcp_run_code <= 5 ms. E2B's published figures (their cloud, not measured
here): creation about 150 ms (E2B), about 230 ms (a third party).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from _serve import free_port, wait_up  # bench/_serve.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
if __name__ == "__main__":
    # the in-process commands' zygote forked before httpx and the SDK are imported, as
    # corral serve forks its own before the web stack (linux/enter.warm): the in-process
    # column is then the command's own cost, not that of forking a bigger process
    from corral.linux import enter

    enter.warm()

import httpx  # noqa: E402

CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")

GOALS_MS = {"create": 25.0, "run_true": 5.0, "run_code": 3.0, "mcp_run_code": 5.0}
GAP_S = 0.02           # the pause before each timed command (as bench/live.py)
PUBLISHED = "E2B (their cloud, published, not measured here): create ~150 ms (E2B), " \
            "~230 ms (a third party)"


def _med(xs) -> float:
    return statistics.median(xs) * 1e3


def _side_by_side(fns: dict, runs: int, warm: int = 3, gap: float = 0.0) -> dict:
    """Each of fns timed `runs` times, alternating run by run (a load spike hits them
    alike), after `warm` untimed runs each."""
    for fn in fns.values():
        for _ in range(warm):
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            if gap:
                time.sleep(gap)
            c0 = SERVER_CPU() if k == "http" else 0.0
            t0 = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t0)
            if k == "http":
                CPU_S[CPU_KEY[0]] = CPU_S.get(CPU_KEY[0], 0.0) + SERVER_CPU() - c0
    return out


#: the server's CPU seconds (user + system, from /proc/PID/stat: 10 ms ticks, summed
#: over many runs) spent in the timed HTTP calls of each row
CPU_S: dict[str, float] = {}
CPU_KEY = [""]
SERVER_PID = [0]


def SERVER_CPU() -> float:     # noqa: N802 - a probe, named as the figure it gives
    if not SERVER_PID[0]:
        return 0.0
    with open(f"/proc/{SERVER_PID[0]}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_pairs(url: str, tok: str, runs: int, inproc: bool) -> tuple[dict, dict]:
    """(HTTP rows, in-process rows): create, run_true, run_code side by side."""
    import corral
    from corral import client

    def http_create():
        sb = client.Sandbox.create({}, timeout=60, api_url=url, api_key=tok)
        made.append(sb)

    def local_create():
        made.append(corral.Sandbox.create({}, timeout=60))

    made: list = []

    def reap():
        while made:
            made.pop().kill()

    fns = {"http": http_create}
    if inproc:
        fns["local"] = local_create
    rows: dict[str, dict] = {"http": {}, "local": {}}
    for _ in range(3):
        for fn in fns.values():
            fn()
            reap()
    for _ in range(runs):
        for k, fn in fns.items():
            c0 = SERVER_CPU()
            t0 = time.perf_counter()
            fn()
            rows[k].setdefault("create", []).append(time.perf_counter() - t0)
            if k == "http":
                CPU_S["create"] = CPU_S.get("create", 0.0) + SERVER_CPU() - c0
            reap()           # the kill is not timed

    CPU_KEY[0] = "health"
    with httpx.Client(base_url=url) as h:
        rows["http"]["health"] = _side_by_side(
            {"http": lambda: h.get("/health").raise_for_status()}, runs * 3)["http"]
    remote = client.Sandbox.create({}, timeout=300, api_url=url, api_key=tok)
    local = corral.Sandbox.create({}, timeout=300) if inproc else None
    try:
        assert remote.commands.run("true").exit_code == 0
        assert remote.run_code("1+1").text == "2"
        sbs = {"http": remote}
        if local is not None:
            assert local.run_code("1+1").text == "2"
            sbs["local"] = local
        CPU_KEY[0] = "run_true"
        got = _side_by_side({k: (lambda sb=sb: sb.commands.run("true"))
                             for k, sb in sbs.items()}, runs, gap=GAP_S)
        for k, xs in got.items():
            rows[k]["run_true"] = xs
        CPU_KEY[0] = "run_code"
        got = _side_by_side({k: (lambda sb=sb: sb.run_code("1+1"))
                             for k, sb in sbs.items()}, runs * 3, warm=5)
        for k, xs in got.items():
            rows[k]["run_code"] = xs
    finally:
        remote.kill()
        if local is not None:
            local.kill()
    return rows["http"], rows["local"]


def bench_concurrent(url: str, tok: str, total: int = 100, clients: int = 10) -> dict:
    from corral import client

    errors: list[str] = []
    lock = threading.Lock()
    per = total // clients

    def one_client():
        for _ in range(per):
            try:
                sb = client.Sandbox.create({}, timeout=60, api_url=url, api_key=tok)
                sb.kill()
            except Exception as e:  # noqa: BLE001 - counted and shown
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")

    ts = [threading.Thread(target=one_client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"total": per * clients, "clients": clients, "errors": errors,
            "wall_s": time.perf_counter() - t0}


def bench_mcp(runs: int) -> list[float] | str:
    try:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters
    except ImportError as e:
        return f"mcp SDK not importable: {e}"

    async def main():
        async with Client(StdioServerParameters(command=CORRAL, args=["mcp"])) as c:
            for _ in range(5):
                r = await c.call_tool("run_code", {"code": "1+1"})
                assert not r.is_error, r.content
            out = []
            for _ in range(runs):
                t0 = time.perf_counter()
                await c.call_tool("run_code", {"code": "1+1"})
                out.append(time.perf_counter() - t0)
            return out

    return asyncio.run(asyncio.wait_for(main(), 300))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--skip", default="", help="comma list of: inproc,concurrent,mcp")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    tmp = tempfile.mkdtemp(prefix="corral-bench-svc-")
    state = os.path.join(tmp, "state")
    tok = subprocess.run([CORRAL, "token", "create", "--name", "bench", "--state-dir", state],
                         capture_output=True, text=True, check=True).stdout.split()[-1]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(os.path.join(tmp, "serve.log"), "wb")
    proc = subprocess.Popen([CORRAL, "serve", "--port", str(port), "--state-dir", state],
                            stdout=log, stderr=subprocess.STDOUT)
    SERVER_PID[0] = proc.pid
    try:
        wait_up(url, proc)
        http, inproc = bench_pairs(url, tok, a.runs, "inproc" not in skip)
        conc = None if "concurrent" in skip else bench_concurrent(url, tok)
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    mcp = None if "mcp" in skip else bench_mcp(a.runs * 3)

    la = os.getloadavg()
    print(f"corral serve on loopback, corral's SDK (corral.client) vs in-process corral.Sandbox "
          f"({a.runs} runs; load {la[0]:.1f} {la[1]:.1f}: indicative, a shared machine)")
    print(f"  {'':14s} {'http ms':>9s} {'in-proc ms':>11s} {'http/inproc':>12s} "
          f"{'http/health':>12s} {'goal ms':>8s}      server CPU ms/call")
    health = _med(http["health"])

    def cpu_of(k):
        n = len(http[k])
        return f"{CPU_S[k] / n * 1e3:6.2f}" if k in CPU_S and n else ""
    print(f"  {'health':14s} {health:9.2f} {'':54s}{cpu_of('health')}")
    for k in ("create", "run_true", "run_code"):
        h = _med(http[k])
        i = _med(inproc[k]) if k in inproc else float("nan")
        ok = "ok    " if h <= GOALS_MS[k] else "MISSED"
        print(f"  {k:14s} {h:9.2f} {i:11.2f} {h / i:12.2f} {h / health:12.1f} "
              f"{GOALS_MS[k]:8.0f} {ok} {cpu_of(k)}")
    if isinstance(mcp, list):
        m = _med(mcp)
        i = _med(inproc["run_code"]) if "run_code" in inproc else float("nan")
        ok = "ok" if m <= GOALS_MS["mcp_run_code"] else "MISSED"
        print(f"  {'mcp_run_code':14s} {m:9.2f} {i:11.2f} {m / i:12.2f} {'(stdio)':>12s} "
              f"{GOALS_MS['mcp_run_code']:8.0f} {ok}")
    elif mcp is not None:
        print(f"  mcp_run_code   skipped: {mcp}")
    if conc is not None:
        print(f"  concurrent     {conc['total']} creates by {conc['clients']} clients: "
              f"{len(conc['errors'])} errors, {conc['wall_s']:.2f} s wall "
              f"({conc['total'] / conc['wall_s']:.0f}/s)")
        for e in conc["errors"][:5]:
            print(f"                 {e}")
    print(f"  {PUBLISHED}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"http": http, "inproc": inproc, "mcp": mcp, "concurrent": conc,
                       "server_cpu_s": CPU_S,
                       "load": la, "runs": a.runs}, f, indent=1)
    return 1 if conc is not None and conc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
