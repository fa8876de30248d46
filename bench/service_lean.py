"""`commands.run("true")` over loopback HTTP, the hot path's parts side by side (issue 17's
goal: <= 5 ms with the SDK). Two `corral serve` processes on loopback, one with the lean
exec path (service/fastexec.py, the default) and one without it (CORRAL_SERVE_LEAN=0:
FastAPI's route), and calls alternating run by run:

  lean_sdk      corral.client's sb.commands.run("true") against the lean server
  fastapi_sdk   the same against the FastAPI-only server
  lean_raw      the same request (POST /sandboxes/ID/exec {"cmd": "true"}) as prebuilt bytes
                on a kept-alive http.client connection, the JSON answer parsed: the
                client's part is then nearly nothing (what the SDK adds is lean_sdk -
                lean_raw)
  inproc        corral.Sandbox.create(...).commands.run("true") in this process: the
                command's own cost, no HTTP

Each after a GAP_S pause (as bench/service_speed.py). Server CPU per call: /proc/PID/stat
ticks of each server summed over its timed calls; client CPU per call: this process's
time.thread_time() over the call (the SDK's or http.client's own work; in-process: the
whole calling thread's share of the command). Run as root from the repository root:

    .venv/bin/python bench/service_lean.py [--runs 60]
"""

from __future__ import annotations

import argparse
import http.client
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
sys.path.insert(0, os.path.join(ROOT, "src"))
CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")
GAP_S = 0.02


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(tmp: str, name: str, lean: bool):

    state = os.path.join(tmp, name)
    tok = subprocess.run([CORRAL, "token", "create", "--name", "bench", "--state-dir", state],
                         capture_output=True, text=True, check=True).stdout.split()[-1]
    port = free_port()
    env = dict(os.environ, CORRAL_SERVE_LEAN="1" if lean else "0")
    log = open(os.path.join(tmp, name + ".log"), "wb")
    proc = subprocess.Popen([CORRAL, "serve", "--port", str(port), "--state-dir", state],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_up(url, proc)
    return proc, url, tok, port, log


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    a = ap.parse_args()
    import corral
    from corral import client

    tmp = tempfile.mkdtemp(prefix="corral-bench-lean-")
    servers = {"lean": _serve(tmp, "lean", True), "fastapi": _serve(tmp, "fastapi", False)}
    sbs = {}
    conn = None
    local = None
    try:
        for k, (_, url, tok, _, _) in servers.items():
            sbs[k] = client.Sandbox.create({}, timeout=600, api_url=url, api_key=tok)
        _, url, tok, port, _ = servers["lean"]
        conn = http.client.HTTPConnection("127.0.0.1", port)
        body = b'{"cmd":"true"}'
        headers = {"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
        path = f"/sandboxes/{sbs['lean'].id}/exec"

        def raw():
            conn.request("POST", path, body, headers)
            r = conn.getresponse()
            d = json.loads(r.read())
            assert r.status == 200 and d["exit_code"] == 0, d

        local = corral.Sandbox.create({}, timeout=600)
        fns = {"lean_sdk": lambda: sbs["lean"].commands.run("true"),
               "fastapi_sdk": lambda: sbs["fastapi"].commands.run("true"),
               "lean_raw": raw,
               "inproc": lambda: local.commands.run("true")}
        pid_of = {"lean_sdk": servers["lean"][0].pid, "lean_raw": servers["lean"][0].pid,
                  "fastapi_sdk": servers["fastapi"][0].pid}
        for fn in fns.values():
            for _ in range(5):
                fn()
        out = {k: [] for k in fns}
        cpu = {k: 0.0 for k in fns}
        ccpu = {k: 0.0 for k in fns}
        for _ in range(a.runs):
            for k, fn in fns.items():
                time.sleep(GAP_S)
                pid = pid_of.get(k)
                c0 = _cpu(pid) if pid else 0.0
                u0 = time.thread_time()
                t0 = time.perf_counter()
                fn()
                out[k].append(time.perf_counter() - t0)
                ccpu[k] += time.thread_time() - u0
                if pid:
                    cpu[k] += _cpu(pid) - c0
    finally:
        if conn is not None:
            conn.close()
        for sb in sbs.values():
            sb.kill()
        if local is not None:
            local.kill()
        for proc, _, _, _, log in servers.values():
            proc.terminate()
            proc.wait(60)
            log.close()
    la = os.getloadavg()
    med = {k: statistics.median(v) * 1e3 for k, v in out.items()}
    print(f"commands.run('true') over loopback HTTP, {a.runs} runs alternating "
          f"(load {la[0]:.1f} {la[1]:.1f}: a shared machine, indicative)")
    print(f"  {'':12s} {'median ms':>10s} {'p25 ms':>8s} {'/inproc':>8s} "
          f"{'client CPU ms/call':>19s} {'server CPU ms/call':>19s}")
    for k, v in out.items():
        q = statistics.quantiles(v, n=4)
        c = f"{cpu[k] / len(v) * 1e3:19.2f}" if k in pid_of else ""
        print(f"  {k:12s} {med[k]:10.2f} {q[0] * 1e3:8.2f} {med[k] / med['inproc']:8.2f} "
              f"{ccpu[k] / len(v) * 1e3:19.2f} {c}")
    print(f"  lean_sdk / fastapi_sdk = {med['lean_sdk'] / med['fastapi_sdk']:.2f}; "
          f"SDK's own part (lean_sdk - lean_raw) = {med['lean_sdk'] - med['lean_raw']:.2f} ms; "
          f"goal lean_sdk <= 5 ms: {'met' if med['lean_sdk'] <= 5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
