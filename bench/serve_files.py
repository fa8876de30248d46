"""A file's download through `corral serve` (GET /sandboxes/{id}/files/content, streamed
out of a live namespace sandbox) against the same bytes from Python's own http.server on
loopback, side by side in one run: the ratio is what the service's path (auth, openat2
inside the sandbox's root as its user, a worker thread a chunk) costs over a plain HTTP
file server. Indicative on a loaded machine; run as root:

    .venv/bin/python bench/serve_files.py [--mib 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
from _serve import free_port  # bench/_serve.py

HERE = os.path.dirname(os.path.abspath(__file__))
CORRAL = os.path.join(os.path.dirname(HERE), ".venv", "bin", "corral")


def _up(url: str, proc) -> None:
    for _ in range(600):
        try:
            httpx.get(url, timeout=5)
            return
        except httpx.TransportError:
            if proc.poll() is not None:
                raise SystemExit(f"{url}: the server exited") from None
            time.sleep(0.05)
    raise SystemExit(f"{url}: never came up")


def _get(http: httpx.Client, url: str, **kw) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    with http.stream("GET", url, **kw) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes(1 << 20):
            n += len(chunk)
    return time.perf_counter() - t0, n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from corral import client

    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        tok = subprocess.run([CORRAL, "token", "create", "--name", "bench", "--state-dir",
                              state], capture_output=True, text=True, check=True
                             ).stdout.split()[-1]
        port, raw_port = free_port(), free_port()
        url = f"http://127.0.0.1:{port}"
        serve = subprocess.Popen([CORRAL, "serve", "--port", str(port), "--state-dir",
                                  state], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        raw = subprocess.Popen(["/usr/bin/python3", "-m", "http.server", "--bind",
                                "127.0.0.1", str(raw_port), "--directory", tmp],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _up(url + "/health", serve)
            _up(f"http://127.0.0.1:{raw_port}/", raw)
            with client.Sandbox.create({}, api_url=url, api_key=tok) as sb:
                r = sb.exec(["sh", "-c", f"head -c {a.mib}M /dev/urandom > /scratch/big"])
                assert r.verdict == "ok", r
                with open(os.path.join(tmp, "big"), "wb") as f:   # the same bytes, host side
                    for chunk in sb.files.read("/scratch/big", format="stream"):
                        f.write(chunk)
                svc_t, raw_t = [], []
                with httpx.Client(timeout=600, headers={"Authorization": f"Bearer {tok}"}) \
                        as http:
                    for _ in range(a.rounds):
                        t, n = _get(http, f"{url}/sandboxes/{sb.id}/files/content",
                                    params={"path": "/scratch/big"})
                        assert n == a.mib << 20
                        svc_t.append(t)
                        t, n = _get(http, f"http://127.0.0.1:{raw_port}/big")
                        assert n == a.mib << 20
                        raw_t.append(t)
        finally:
            for p in (serve, raw):
                p.terminate()
                p.wait(60)
    s, r = statistics.median(svc_t), statistics.median(raw_t)
    print(f"download {a.mib} MiB, median of {a.rounds}: corral serve {a.mib / s:.0f} MiB/s, "
          f"http.server {a.mib / r:.0f} MiB/s, ratio {s / r:.2f}x the raw server's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
