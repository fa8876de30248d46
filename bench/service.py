"""corral serve over loopback HTTP with the SDK (corral.client), beside what the server does
in process, and MCP over stdio.

    .venv/bin/python bench/service.py [--quick] [--runs N] [--json FILE]

Starts `corral serve` (uvicorn, one process) on 127.0.0.1 with a fresh state directory and
one token, then, each a median of --runs (default 40, --quick 10) after dropped warm-ups,
variants alternating run by run so a load spike hits them alike (the service's calls
together, then the in-process ones together: one live sandbox at a time in this process,
whose threads would otherwise share the SDK's GIL), each call after a GAP_S pause (agents
think between calls; a live sandbox prepares its next entrant meanwhile):

  create        client.Sandbox.create(): from the call to the 201 (a new HTTP client and
                connection, as a program that makes one sandbox pays); kill timed apart
  create_inproc what the server does for it, in this process: registry.open_sandbox(policy)
  first_true    the first sb.commands.run("true") of a new sandbox: what a sandbox that
                starts lazily (the per-exec Sandbox the service holds today) pays then
  health        GET /health on a kept connection: the HTTP floor (no token, no sandbox)
  run_true      sb.commands.run("true") on the service (/bin/sh -c true)
  run_true_inproc  the same command through the in-process Sandbox.exec
  run_code      sb.run_code("1+1") on the service (a warm interpreter)
  run_code_inproc  the same cell through the in-process Sandbox.run_code
  mcp_run_code  call_tool("run_code", {"code": "1+1"}) from the official MCP client to
                `corral mcp` over stdio (the session's own sandbox, warm)
  burst         100 sandboxes created at once by 10 clients (threads, 10 each, each its own
                connection), then a `true` in each of them from the same clients, then all
                killed: wall times and errors (goal: none)

Goals (issue 17): create <= 25 ms, run_true <= 5 ms, run_code <= 3 ms, mcp_run_code <=
5 ms, burst without an error. E2B's figures are published ones, not measured here:
sandbox creation about 150 ms (e2b.dev), about 230 ms measured by third parties. On a
shared machine the figures are indicative: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")

import httpx

from corral import client

#: the pause before each timed call (agents think between calls), as bench/live.py's: a
#: live sandbox prepares its next command's entrant meanwhile
GAP_S = 0.02
GOALS = {"create_ms": 25.0, "run_true_ms": 5.0, "run_code_ms": 3.0, "mcp_run_code_ms": 5.0}
PUBLISHED = {"e2b_create_ms": 150.0, "e2b_create_third_party_ms": 230.0}


def med(xs):
    return statistics.median(xs) * 1000


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.95))] * 1000


class Server:
    def __init__(self) -> None:
        import socket

        self.tmp = tempfile.mkdtemp(prefix="corral-bench-serve-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        out = subprocess.run([CORRAL, "token", "create", "--name", "bench", "--state-dir",
                              self.tmp], capture_output=True, text=True, check=True)
        self.token = out.stdout.splitlines()[-1]
        self.log = open(os.path.join(self.tmp, "serve.log"), "wb")
        self.proc = subprocess.Popen([CORRAL, "serve", "--port", str(self.port),
                                      "--state-dir", self.tmp, "--config",
                                      self._config()], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise SystemExit("corral serve did not come up")

    def _config(self) -> str:
        path = os.path.join(self.tmp, "serve.toml")
        with open(path, "w") as f:
            f.write('[server]\nlog_level = "warning"\n')    # no access log line a request
        return path

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def bench_http(srv: Server, runs: int, warm: int) -> dict:
    from corral.service.registry import open_sandbox

    kw = {"api_url": srv.url, "api_key": srv.token}
    s = {k: [] for k in ("create", "first_true", "kill", "create_inproc", "health",
                         "run_true",
                         "run_true_inproc", "run_code", "run_code_inproc")}
    for i in range(warm + runs):
        t = time.perf_counter()
        sb = client.Sandbox.create(**kw)
        t1 = time.perf_counter()
        sb.commands.run("true")
        tf = time.perf_counter()
        sb.kill()
        t2 = time.perf_counter()
        local = open_sandbox(_policy())
        t3 = time.perf_counter()
        local.close()
        if i >= warm:
            s["create"].append(t1 - t)
            s["first_true"].append(tf - t1)
            s["kill"].append(t2 - tf)
            s["create_inproc"].append(t3 - t2)
    # the service's calls, then the same in process: one live sandbox at a time in this
    # process (a live sandbox's own threads would share this process's GIL with the SDK)
    sb = client.Sandbox.create(**kw)
    floor = httpx.Client(base_url=srv.url)
    try:
        sb.run_code("0")
        _timed(s, runs, warm, (("health", lambda: floor.get("/health")),
                               ("run_true", lambda: sb.commands.run("true")),
                               ("run_code", lambda: sb.run_code("1+1"))))
    finally:
        floor.close()
        sb.kill()
    local = open_sandbox(_policy())
    try:
        local.run_code("0")
        _timed(s, runs, warm, (("run_true_inproc", lambda: local.exec(["/bin/sh", "-c",
                                                                        "true"])),
                               ("run_code_inproc", lambda: local.run_code("1+1"))))
    finally:
        local.close()
    return s


def _timed(s: dict, runs: int, warm: int, calls) -> None:
    """Each call of `calls` ((name, fn) pairs) in turn, after a GAP_S pause, warm+runs
    times; the timings after the warm-up go to s[name]."""
    for i in range(warm + runs):
        for name, call in calls:
            time.sleep(GAP_S)
            t = time.perf_counter()
            got = call()
            dt = time.perf_counter() - t
            if name.startswith("run_true"):
                assert got.verdict == "ok", got
            elif name.startswith("run_code"):
                assert got.text == "2", got
            if i >= warm:
                s[name].append(dt)


def _policy():
    from corral.policy.load import policy_from_dict

    return policy_from_dict({})


def bench_burst(srv: Server, clients: int = 10, each: int = 10) -> dict:
    made: list = []
    errors: list[str] = []
    mu = threading.Lock()

    def one():
        for _ in range(each):
            try:
                sb = client.Sandbox.create(api_url=srv.url, api_key=srv.token)
                with mu:
                    made.append(sb)
            except Exception as e:       # noqa: BLE001 - counted, shown
                with mu:
                    errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    live = httpx.get(srv.url + "/health", timeout=30).json()["sandboxes"]

    def run(part):
        for sb in part:
            try:
                assert sb.commands.run("true").verdict == "ok"
            except Exception as e:       # noqa: BLE001 - counted, shown
                with mu:
                    errors.append(f"run: {type(e).__name__}: {e}")

    parts = [made[i::clients] for i in range(clients)]
    threads = [threading.Thread(target=run, args=(p,)) for p in parts]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    run_wall = time.perf_counter() - t
    t = time.perf_counter()
    for sb in made:
        sb.kill()
    kill_wall = time.perf_counter() - t
    return {"clients": clients, "each": each, "created": len(made), "errors": errors,
            "live_after": live, "wall_s": wall, "run_wall_s": run_wall,
            "kill_wall_s": kill_wall}


def bench_mcp(runs: int, warm: int) -> list[float]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def main():
        out = []
        async with Client(StdioServerParameters(command=CORRAL, args=["mcp"])) as c:
            r = await c.call_tool("run_code", {"code": "0"})      # the lazy sandbox
            assert not r.is_error, r.content
            for i in range(warm + runs):
                t = time.perf_counter()
                r = await c.call_tool("run_code", {"code": "1+1"})
                dt = time.perf_counter() - t
                assert r.structured_content["results"][0]["text"] == "2"
                if i >= warm:
                    out.append(dt)
        return out

    return asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = a.runs or (10 if a.quick else 40)
    warm = 3
    srv = Server()
    try:
        s = bench_http(srv, runs, warm)
        burst = bench_burst(srv)
    finally:
        srv.stop()
    s["mcp_run_code"] = bench_mcp(runs, warm)
    load = os.getloadavg()
    rows = [(k, med(v), p95(v)) for k, v in s.items()]
    print(f"corral serve over loopback HTTP, the SDK; runs={runs}; load {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f} (indicative on a shared machine)")
    print(f"{'':18}{'median ms':>11}{'p95 ms':>9}{'goal':>8}")
    for k, m, p in rows:
        goal = GOALS.get(f"{k}_ms")
        mark = "" if goal is None else f"{goal:>6.0f}  " + ("ok" if m <= goal else "MISSED")
        print(f"{k:18}{m:>11.2f}{p:>9.2f}  {mark}")
    print(f"service overhead: create +{med(s['create']) - med(s['create_inproc']):.1f} ms, "
          f"run_true +{med(s['run_true']) - med(s['run_true_inproc']):.2f} ms, "
          f"run_code +{med(s['run_code']) - med(s['run_code_inproc']):.2f} ms over in process "
          f"(the HTTP floor, GET /health: {med(s['health']):.2f} ms)")
    print(f"burst: {burst['created']} of {burst['clients'] * burst['each']} sandboxes made "
          f"by {burst['clients']} clients at once in {burst['wall_s']:.2f} s, "
          f"{len(burst['errors'])} errors, {burst['live_after']} live after; a `true` in "
          f"each in {burst['run_wall_s']:.2f} s; all killed in {burst['kill_wall_s']:.2f} s")
    for e in burst["errors"][:5]:
        print("  error:", e)
    print(f"E2B (published, not measured here): create ~{PUBLISHED['e2b_create_ms']:.0f} ms "
          f"(e2b.dev), ~{PUBLISHED['e2b_create_third_party_ms']:.0f} ms by third parties; "
          f"corral create here: {med(s['create']):.1f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "load": load, "samples": s, "burst": burst,
                       "goals": GOALS, "published": PUBLISHED}, f, indent=1)
    return 0 if not burst["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
