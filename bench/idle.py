"""N idle live sandboxes (Sandbox.create) at once: memory per sandbox, and how soon a new
sandbox's proxy answers its first request.

    .venv/bin/python bench/idle.py [--n 200] [--modes none,allow,allow-fresh] [--json FILE]

Each mode runs in a fresh supervisor process (this script with --one) that creates N live
sandboxes on the namespace tier one after another and leaves them idle (bwrap, its init
and the holder `sleep infinity`; with network allow also the sandbox's egress proxy),
measured once every sandbox has been idle longer than runtime/live.ENTRANT_KEEP_S (until
then each keeps its next command's entrant, a forked copy of the supervisor, ready):

  none         network.mode = "none"
  allow        network.mode = "allow", each sandbox's proxy forked from the zygote
               (backends/host/zygote.py), which the first live sandbox starts
  allow-fresh  the same with CORRAL_EGRESS_ZYGOTE=0: every proxy a fresh interpreter (the
               way before the zygote), side by side for the ratio

Memory: PSS (/proc/PID/smaps_rollup) summed over every process below the supervisor (the
zygote included: PSS already divides its shared pages among the children that map them,
so its share is counted once), plus the supervisor's own PSS growth over its state after
one warm-up sandbox, divided by N. Goals (issue 16): <= 3 MB a sandbox with network none,
<= 8 MB with allow.

First request: for each of the last --first sandboxes, right after Sandbox.create returns,
a client process of the bench's own (not a thread of the supervisor, whose GIL and forks
would sit in the figure) enters the sandbox's network namespace, connects to the proxy's
127.0.0.1:3128 and sends one GET for a 100-byte body from a server on the host's loopback
(allowed by the policy); the time from connect to the whole response. References beside
it: a second GET through the same proxy right after (what any request costs on this
machine at that moment), and the same GET sent directly to the server from the host. Goal: <= 5 ms.
Beside the times, the proxy's own CPU for each of the two requests (schedstat, every
thread) and its minor page faults on the first: what the load moves far less.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from memory import descendants, smaps  # the same PSS reading as bench/memory.py

MB = 1024 * 1024
GOALS_MB = {"none": 3.0, "allow": 8.0}
GOAL_FIRST_MS = 5.0
BODY = b"x" * 100


def server() -> tuple[subprocess.Popen, int]:
    """The upstream: --serve in a process of its own (in the supervisor, its thread would
    wait for the GIL while the supervisor forks, and the figure would be the bench's)."""
    p = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE,
                         text=True)
    return p, int(p.stdout.readline())


def serve() -> None:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(512)
    print(ls.getsockname()[1], flush=True)

    def loop() -> None:
        while True:
            c, _ = ls.accept()
            try:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    d = c.recv(4096)
                    if not d:
                        break
                    buf += d
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n"
                          + BODY)
            except OSError:
                pass
            finally:
                c.close()

    loop()


def get(addr: tuple[str, int], target: str, host: str) -> float:
    """ms from connect to the whole response (Connection: close)."""
    t0 = time.perf_counter()
    s = socket.create_connection(addr, timeout=10)
    try:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                  .encode())
        data = b""
        while d := s.recv(65536):
            data += d
    finally:
        s.close()
    ms = (time.perf_counter() - t0) * 1e3
    if not data.startswith(b"HTTP/1.1 200") or not data.endswith(BODY):
        raise RuntimeError(f"bad answer {data[:120]!r}")
    return ms


def get_in_netns(pid: int, port: int) -> float:
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict = {}

    def work() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            out["ms"] = get(("127.0.0.1", 3128), f"http://127.0.0.1:{port}/small",
                            f"127.0.0.1:{port}")
        except Exception as e:  # noqa: BLE001 - reported
            out["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if "error" in out:
        raise RuntimeError(out["error"])
    return out["ms"]


def client() -> None:
    """--client: a process of its own that measures first requests (lines "PID PORT" in,
    "MS" or "error ..." out; PID 0: the same GET direct), so that no thread of the
    supervisor (its GIL, held while it forks an entrant) sits in the measurement."""
    for line in sys.stdin:
        pid, port = map(int, line.split())
        try:
            ms = get_in_netns(pid, port) if pid else get(
                ("127.0.0.1", port), "/small", f"127.0.0.1:{port}")
            print(f"{ms}", flush=True)
        except (RuntimeError, OSError) as e:
            print(f"error {e}", flush=True)


class Client:
    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, __file__, "--client"], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def first(self, pid: int, port: int) -> float:
        self.p.stdin.write(f"{pid} {port}\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        if not out or out.startswith("error"):
            raise RuntimeError(out or "the client ended")
        return float(out)

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(10)


def proxy_cpu(pid: int | None) -> tuple[float, int] | None:
    """(CPU ms, every thread, from schedstat: ns, not ticks; minor faults) of a proxy."""
    if pid is None:
        return None
    try:
        ns = 0
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                ns += int(f.read().split()[0])
        with open(f"/proc/{pid}/stat") as f:
            minflt = int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None
    return ns / 1e6, minflt


def one(n: int, mode: str, first: int) -> dict:
    import corral

    srv, port = server()
    pol: dict = {}
    if mode != "none":
        pol = {"network": {"mode": "allow", "allow": [f"127.0.0.1:{port}"],
                           "allow_private": ["127.0.0.1/32"]}}
    me = os.getpid()
    warm = corral.Sandbox.create(pol, timeout=3600)     # lazy imports; the zygote starts
    if mode != "none":
        from corral.backends.host import zygote

        zygote.wait_ready()
        get_in_netns(warm._live.init_pid, port)
    warm.kill()
    time.sleep(0.5)
    base = smaps(me).get("Pss", 0)
    sbs, firsts, seconds, directs, errors = [], [], [], [], []
    cpu_first, cpu_second, faults_first = [], [], []
    cl = Client() if mode != "none" else None
    t0 = time.monotonic()
    for i in range(n):
        try:
            sb = corral.Sandbox.create(pol, timeout=3600)
        except Exception as e:  # noqa: BLE001 - recorded; the rest are measured
            errors.append(f"create: {type(e).__name__}: {e}"[:300])
            continue
        sbs.append(sb)
        if mode != "none" and i >= n - first:
            try:
                proxy = sb._live.proxy.pid if sb._live.proxy is not None else None
                c0 = proxy_cpu(proxy)
                firsts.append(cl.first(sb._live.init_pid, port))
                c1 = proxy_cpu(proxy)
                seconds.append(cl.first(sb._live.init_pid, port))
                c2 = proxy_cpu(proxy)
                if None not in (c0, c1, c2):
                    cpu_first.append(c1[0] - c0[0])
                    cpu_second.append(c2[0] - c1[0])
                    faults_first.append(c1[1] - c0[1])
                directs.append(cl.first(0, port))
            except RuntimeError as e:
                errors.append(f"first request: {e}"[:300])
    start_all = time.monotonic() - t0
    if cl is not None:
        cl.close()
    from corral.runtime.live import ENTRANT_KEEP_S

    # idle: past the time a sandbox keeps its next command's entrant (a forked copy of
    # this process) ready after its last use
    time.sleep(ENTRANT_KEEP_S + 2.0)
    d = descendants(me)
    zpid = None
    if mode == "allow":
        from corral.backends.host import zygote

        zpid = zygote.zygote_pid()
    by: dict[str, dict] = {}
    for pid, c in d:
        if pid == srv.pid:
            continue                   # the bench's upstream server, not a sandbox's
        kind = "zygote" if pid == zpid else ("proxy" if c.startswith("python") else c)
        m = smaps(pid)
        e = by.setdefault(kind, {"count": 0, "pss": 0, "rss": 0})
        e["count"] += 1
        e["pss"] += m.get("Pss", 0)
        e["rss"] += m.get("Rss", 0)
    sup_growth = smaps(me).get("Pss", 0) - base
    problems = []
    for sb in sbs:
        try:
            sb.kill()
        except Exception as e:  # noqa: BLE001
            problems.append(str(e)[:200])
    srv.kill()
    srv.wait()
    live = max(len(sbs), 1)
    desc = sum(e["pss"] for e in by.values())
    return {"n": n, "mode": mode, "alive": len(sbs), "start_all_s": start_all,
            "processes": by, "descendants_pss": desc, "supervisor_growth": sup_growth,
            "per_sandbox_bytes": (desc + sup_growth) / live,
            "first_request_ms": firsts, "second_request_ms": seconds, "direct_ms": directs,
            "proxy_cpu_first_ms": cpu_first, "proxy_cpu_second_ms": cpu_second,
            "proxy_minflt_first": faults_first,
            "errors": errors[:5], "problems": problems[:5]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--modes", default="none,allow,allow-fresh")
    ap.add_argument("--first", type=int, default=20, help="first-request samples per mode")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        client()
        return 0
    if a.serve:
        serve()
        return 0
    if a.one:
        print(json.dumps(one(int(a.one[0]), a.one[1], int(a.one[2]))))
        return 0
    out = []
    for mode in a.modes.split(","):
        env = dict(os.environ)
        if mode == "allow-fresh":
            env["CORRAL_EGRESS_ZYGOTE"] = "0"
        p = subprocess.run([sys.executable, __file__, "--one", str(a.n), mode,
                            str(min(a.first, a.n))], capture_output=True, text=True,
                           env=env, timeout=1800, check=False)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            r = {"n": a.n, "mode": mode, "error": f"exit {p.returncode}: {p.stderr[-600:]}"}
        out.append(r)
        if "error" in r:
            print(f"  {mode:12} failed: {r['error']}")
            continue
        kinds = ", ".join(f"{k} x{e['count']} {e['pss'] / r['alive'] / MB:.2f}"
                          for k, e in sorted(r["processes"].items()))
        line = (f"  {mode:12} N={r['alive']:<4} per sandbox {r['per_sandbox_bytes'] / MB:6.2f} MB"
                f" = ({kinds}) + supervisor {r['supervisor_growth'] / r['alive'] / MB:.2f}; "
                f"all created in {r['start_all_s']:.1f}s")
        if r["first_request_ms"]:
            f, dr = r["first_request_ms"], r["direct_ms"]
            r["first_p50_ms"] = statistics.median(f)
            line += (f"; first request p50 {statistics.median(f):.2f} ms max {max(f):.2f}"
                     f" (the second through the same proxy "
                     f"{statistics.median(r['second_request_ms']):.2f}, direct "
                     f"{statistics.median(dr):.2f})")
            if r.get("proxy_cpu_first_ms"):
                line += (f"; the proxy's CPU for the first request "
                         f"{statistics.median(r['proxy_cpu_first_ms']):.2f} ms "
                         f"({statistics.median(r['proxy_minflt_first']):.0f} minor faults), "
                         f"the second {statistics.median(r['proxy_cpu_second_ms']):.2f} ms")
        print(line + (f" errors {r['errors']}" if r["errors"] else ""), flush=True)
    goals = []
    for r in out:
        base = "allow" if r.get("mode", "").startswith("allow") else "none"
        if "error" in r or r["mode"] == "allow-fresh":
            continue
        mb = r["per_sandbox_bytes"] / MB
        goals.append({"goal": f"idle live sandbox, network {base}: <= {GOALS_MB[base]:g} MB",
                      "value": round(mb, 2), "met": mb <= GOALS_MB[base]})
        if r.get("first_p50_ms") is not None:
            goals.append({"goal": f"first proxied request <= {GOAL_FIRST_MS:g} ms (p50)",
                          "value": round(r["first_p50_ms"], 2),
                          "met": r["first_p50_ms"] <= GOAL_FIRST_MS})
    for g in goals:
        print(f"goal {g['goal']}: {g['value']}  {'MET' if g['met'] else 'NOT MET'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"n": a.n, "points": out, "goals": goals,
                       "loadavg": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
