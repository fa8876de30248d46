"""Two corral builds' live-sandbox commands through the egress proxy, interleaved command
by command (bench/_interleave.py), and whether each Result holds its connections' events.

    .venv/bin/python bench/live_net_ab.py --baseline OLD/src [--runs 60]

Each build: one namespace-tier sandbox with network.mode = "allow" for an HTTP server of
this process on a loopback address of its own (an IP literal rule; nothing is resolved).
Kinds (median ms of the call, and `miss`: how many Results lacked an event they should
hold, of --runs):

  true    commands.run(["true"]): no network (it must pay nothing for the proxy)
  fetch   python3: urllib GET through the proxy (plain HTTP), then exit
  tunnel  python3: a CONNECT tunnel carrying one GET, a denied CONNECT, exit without
          closing either (the allowed tunnel's event is written when the proxy sees the
          close, after the command's exit)
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _interleave import Sides, answer  # noqa: E402

PY = "/usr/bin/python3"
FETCH = ("import urllib.request as u, os\n"
         "u.urlopen('http://%s:8080/', timeout=10).read()\n"
         "os._exit(0)\n")
TUNNEL = """
import os, socket
host, port = os.environ["http_proxy"].split("//")[1].rstrip("/").rsplit(":", 1)
def tunnel(target):
    s = socket.create_connection((host, int(port)))
    s.sendall(("CONNECT %%s HTTP/1.1\\r\\nHost: %%s\\r\\n\\r\\n" %% (target, target)).encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        more = s.recv(4096)
        if not more:
            break
        head += more
    return s
s = tunnel("%s:8080")
s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
got = b""
while b"hello" not in got:
    got += s.recv(4096)
d = tunnel("denied.test:80")
os._exit(0)
"""


class Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "6")
        self.end_headers()
        self.wfile.write(b"hello\n")


def child(src: str, ip: str) -> None:
    sys.path.insert(0, src)
    import corral
    from corral.linux import enter

    enter.warm()
    sb = corral.Sandbox.create({"network": {"mode": "allow", "allow": [f"{ip}:8080"],
                                            "allow_private": [f"{ip}/32"]}}, timeout=3600)
    want = {"true": [], "fetch": [("allow", ip)],
            "tunnel": [("allow", ip), ("deny", "denied.test")]}
    argv = {"true": ["true"], "fetch": [PY, "-c", FETCH % ip], "tunnel": [PY, "-c", TUNNEL % ip]}

    def timed(kind: str) -> str:
        t = time.perf_counter()
        r = sb.commands.run(argv[kind])
        dt = time.perf_counter() - t
        if r.exit_code != 0:
            raise SystemExit(f"{kind}: {r}")
        got = sorted((e["decision"], e["host"]) for e in r.events if e["kind"] == "net")
        return json.dumps([dt, got != sorted(want[kind])])

    try:
        for kind in argv:
            timed(kind)
        answer({k: (lambda k=k: timed(k)) for k in argv})
    finally:
        sb.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, metavar="SRC")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--ip", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.ip)
        return
    ip = "127.{}.{}.2".format(*os.urandom(2))
    srv = http.server.ThreadingHTTPServer((ip, 8080), Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    builds = {"baseline": os.path.abspath(a.baseline),
              "this": os.path.join(os.path.dirname(HERE), "src")}
    sides = Sides({k: [sys.executable, __file__, "--baseline", "-", "--child", v, "--ip", ip]
                   for k, v in builds.items()})
    load = os.getloadavg()
    ms: dict[tuple[str, str], list[float]] = {}
    miss: dict[tuple[str, str], int] = {}
    kinds = ("true", "fetch", "tunnel")
    for i in range(a.runs):
        for kind in kinds:
            for name in sides.order(i):
                dt, missed = json.loads(sides.ask(name, kind))
                ms.setdefault((kind, name), []).append(dt * 1000)
                miss[(kind, name)] = miss.get((kind, name), 0) + missed
    sides.close()
    srv.shutdown()
    srv.server_close()
    print(f"{a.runs} runs each, interleaved; load average {load[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")
    print(f"{'':8}{'baseline ms':>12}{'miss':>6}{'this ms':>10}{'miss':>6}")
    for kind in kinds:
        print(f"{kind:8}" + "".join(f"{statistics.median(ms[(kind, n)]):12.2f}"
                                    f"{miss[(kind, n)]:6d}" if n == "baseline" else
                                    f"{statistics.median(ms[(kind, n)]):10.2f}"
                                    f"{miss[(kind, n)]:6d}" for n in builds))


if __name__ == "__main__":
    main()
