"""The parts of bench/network.py that run outside its process or hold no state: the HTTP
server (`network.py --serve`), the timed small GET whose source the sandboxed and direct-cg
clients run, the client scripts, /proc readings and small helpers (stats, load average).

Kept apart so that network.py stays readable; network.py imports everything here.
"""

from __future__ import annotations

import inspect
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

from startup import percentile

SMALL = 100                      # bytes of a small body


# -- the server ---------------------------------------------------------------------------

def serve(host: str, path: str) -> None:
    """HTTP/1.1 on host:0 (the port is printed on stdout), a thread per connection,
    keep-alive honoured. /big: `path` with sendfile; anything else: SMALL bytes."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    small = b"x" * (SMALL - 1) + b"\n"
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, 0))
    ls.listen(4096)
    print(ls.getsockname()[1], flush=True)

    def conn(c: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                target = lines[0].split()[1]
                close = any(h.lower().replace(b" ", b"") == b"connection:close"
                            for h in lines[1:])
                conn_hdr = b"close" if close else b"keep-alive"
                if target.endswith(b"/big"):
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                              b"Content-Length: %d\r\nConnection: %s\r\n\r\n" % (size, conn_hdr))
                    off = 0
                    while off < size:
                        n = os.sendfile(c.fileno(), fd, off, size - off)
                        if n == 0:
                            return
                        off += n
                else:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                              b"Content-Length: %d\r\nConnection: %s\r\n\r\n%s"
                              % (len(small), conn_hdr, small))
                if close:
                    return
        except OSError:
            return
        finally:
            c.close()

    while True:
        c, _ = ls.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=conn, args=(c,), daemon=True).start()


# -- one small request, timed (the same code runs on the host and inside the sandbox) ------

def timed_get(addr: tuple[str, int], request: bytes) -> float:
    """Seconds from before connect to the last byte of the response (Content-Length)."""
    t0 = time.perf_counter()
    s = socket.create_connection(addr)
    try:
        s.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise OSError("closed before the response head")
            buf += d
        head, body = buf.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 200"):
            raise OSError("status " + head.split(b"\r\n")[0].decode(errors="replace"))
        n = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v)
        while len(body) < n:
            d = s.recv(65536)
            if not d:
                raise OSError("closed in the body")
            body += d
    finally:
        s.close()
    return time.perf_counter() - t0


def get_request(host: str, port: int, absolute: bool) -> bytes:
    target = f"http://{host}:{port}/small" if absolute else "/small"
    return (f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
            ).encode()


CLIENT = ("from __future__ import annotations\nimport socket, time\n\n"
          + inspect.getsource(timed_get) + "\n" + inspect.getsource(get_request))

# inside a sandbox: warm + N timed GETs through HTTP_PROXY; prints {"ms": [N], "warmup_ms": [warm]}
SANDBOX_LATENCY = CLIENT + r'''
import json, os, sys, urllib.parse
host, port, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
p = urllib.parse.urlsplit(os.environ["http_proxy"])
proxy = (p.hostname, p.port)
req = get_request(host, port, True)
ms = [timed_get(proxy, req) * 1e3 for _ in range(n + warm)]
print(json.dumps({"proxy": os.environ["http_proxy"], "ms": ms[warm:], "warmup_ms": ms[:warm]}))
'''

# on the host, in direct-cg's cpu cgroup: warm + N timed GETs straight to the server; the
# same interpreter and client code as the sandboxed one, with a sandbox's CPU share
DIRECT_LATENCY = CLIENT + r'''
import json, sys
host, port, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
req = get_request(host, port, False)
ms = [timed_get((host, port), req) * 1e3 for _ in range(n + warm)]
print(json.dumps({"ms": ms[warm:]}))
'''

# inside a sandbox: N connections opened at once through HTTP_PROXY; once all are open (or
# have failed), each sends one GET and reads the response
SANDBOX_STORM = r'''
import asyncio, json, os, resource, sys, time, urllib.parse
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = urllib.parse.urlsplit(os.environ["http_proxy"])
req = ("GET http://%s:%d/small HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n"
       % (host, port, host, port)).encode()
errors, opened = {}, [0]

def err(e):
    k = type(e).__name__ + (": " + str(e) if str(e) else "")
    errors[k[:120]] = errors.get(k[:120], 0) + 1

async def main():
    arrived, all_in = [0], asyncio.Event()
    def arrive():
        arrived[0] += 1
        if arrived[0] == n:
            all_in.set()
    async def one():
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(p.hostname, p.port), 60)
        except Exception as e:
            arrive(); err(e); return False
        opened[0] += 1
        arrive()
        try:
            await all_in.wait()
            w.write(req)
            await w.drain()
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 60)
            status = head.split(b"\r\n")[0]
            if not status.startswith(b"HTTP/1.1 200"):
                raise OSError(status.decode(errors="replace"))
            length = [int(l.split(b":")[1]) for l in head.split(b"\r\n")
                      if l.lower().startswith(b"content-length:")][0]
            await asyncio.wait_for(r.readexactly(length), 60)
            return True
        except Exception as e:
            err(e); return False
        finally:
            w.close()
    # one GET first: the fresh proxy's start-up is not the storm's
    r, w = await asyncio.open_connection(p.hostname, p.port)
    w.write(req)
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 60)
    w.close()
    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(one()) for _ in range(n)]
    await all_in.wait()
    t_open = time.perf_counter() - t0
    ok = sum(await asyncio.gather(*tasks))
    return ok, t_open, time.perf_counter() - t0

ok, t_open, wall = asyncio.run(main())
print(json.dumps({"n": n, "ok": ok, "errors": errors, "opened_at_once": opened[0],
                  "open_s": t_open, "wall_s": wall,
                  "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)}))
'''


def cpu_ms(pid: int) -> float:
    """utime + stime of pid, all its threads, in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def sched_ms(pid: int) -> float:
    """CPU time of pid, every thread, in ms from /proc/PID/task/*/schedstat (ns, not ticks)."""
    ns = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                ns += int(f.read().split()[0])
        except (OSError, ValueError):
            pass                      # a thread that ended meanwhile
    return ns / 1e6


def free_port(ip: str) -> int:
    s = socket.socket()
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_listening(ip: str, port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def stats(xs: list[float]) -> dict:
    return {"n": len(xs), "median": statistics.median(xs), "p95": percentile(xs, 0.95),
            "min": min(xs), "max": max(xs)}


def progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"\r  {text}\033[K", end="", file=sys.stderr, flush=True)


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3]) + " (1, 5, 15 min)"
    except OSError as e:
        return f"unavailable ({e})"


def socat_version() -> str:
    try:
        out = subprocess.run(["socat", "-V"], check=False, capture_output=True,
                             text=True).stdout
    except OSError as e:
        return f"unavailable ({e})"
    for line in out.splitlines():
        if line.startswith("socat version"):
            return line.strip()
    return "unknown"


def curl_argv(url: str, proxy: str | None = None, sandbox: bool = False) -> list[str]:
    argv = ["curl", "-sS", "-o", "/dev/null", "-w",
            "%{http_code} %{size_download} %{speed_download}", "-m", "120"]
    if proxy:
        argv += ["-x", proxy]
    elif not sandbox:
        argv += ["--noproxy", "*"]
    return argv + [url]
