"""How fast can any user-space TCP relay be on this machine? A 200 MB download on loopback.

    .venv/bin/python bench/relay_ceiling.py [--runs N] [--no-c] [--no-corral] [--json FILE]

Issue 16 asks a download through the egress proxy to reach 0.9x direct. Every variant here
moves the same 200 MB (the HTTP server of bench/network.py: sendfile from /dev/shm) to
curl on loopback, round robin, the first variant rotated each round, one warm-up round
dropped:

  direct        curl -> the server
  py-splice     curl -> a minimal relay in Python -> the server: a blocking thread per
                direction, socket -> pipe (1 MiB) -> socket with splice(2)
  py-copy       the same, recv_into a 4 MiB buffer and sendall
  py-copy-16m   the same with a 16 MiB buffer
  c-splice      the same relays in C (gcc -O2), a pthread per direction
  c-copy        (skipped with --no-c or without gcc)
  c-copy-256k   c-copy with a 256 KiB buffer
  c-copy-16m    c-copy with a 16 MiB buffer
  corral        curl -x -> `python -m corral.egress --listen` (the standalone proxy,
                relay threads splicing: the default)
  corral-copy   the same with CORRAL_EGRESS_RELAY_SPLICE=0 (relay threads copying
                through a 4 MiB ring)   (both skipped with --no-corral)

The minimal relays do nothing but move bytes: no policy, no budget, no event loop. They
are the best a relay with a second TCP hop can do, as near as a few lines get: if the best
of them stays below 0.9x, the goal is out of reach for any proxy on this machine.

Beside the MB/s, the CPU each process spent per download (ms, user + system): curl's from
getrusage of the children (us), the server's and the relay's from /proc/PID/stat (every
thread, the ended ones too; clock ticks of 10 ms, so the table gives means over the rounds,
not medians). Load average at start and end: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from network_clients import (  # noqa: E402
    cpu_ms,
    curl_argv,
    free_port,
    loadavg,
    wait_listening,
)

BIG = 200 * 1000 * 1000
COPY_BUF = 4 << 20
PIPE_SIZE = 1 << 20
HOST_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

C_RELAY = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int use_splice;
static size_t bufsize;

struct pair { int src, dst; };

static void *pump(void *arg) {
    struct pair *p = arg;
    if (use_splice) {
        int pf[2];
        if (pipe2(pf, O_CLOEXEC)) { perror("pipe2"); exit(1); }
        fcntl(pf[1], F_SETPIPE_SZ, (int)bufsize);
        for (;;) {
            ssize_t n = splice(p->src, NULL, pf[1], NULL, bufsize, SPLICE_F_MOVE);
            if (n <= 0) break;
            while (n > 0) {
                ssize_t m = splice(pf[0], NULL, p->dst, NULL, n, SPLICE_F_MOVE);
                if (m <= 0) goto out;
                n -= m;
            }
        }
out:
        close(pf[0]); close(pf[1]);
    } else {
        char *buf = malloc(bufsize);
        for (;;) {
            ssize_t n = read(p->src, buf, bufsize);
            if (n <= 0) break;
            for (ssize_t off = 0; off < n;) {
                ssize_t m = write(p->dst, buf + off, n - off);
                if (m <= 0) goto out2;
                off += m;
            }
        }
out2:
        free(buf);
    }
    shutdown(p->dst, SHUT_WR);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: relay splice|copy BUF LIP UPIP UPPORT -\n"); return 2; }
    use_splice = strcmp(argv[1], "splice") == 0;
    bufsize = strtoul(argv[2], NULL, 10);
    struct sockaddr_in la = {.sin_family = AF_INET}, ua = {.sin_family = AF_INET};
    inet_pton(AF_INET, argv[3], &la.sin_addr);
    inet_pton(AF_INET, argv[4], &ua.sin_addr);
    ua.sin_port = htons(atoi(argv[5]));
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (void *)&la, sizeof la) || listen(ls, 64)) { perror("listen"); return 1; }
    socklen_t len = sizeof la;
    getsockname(ls, (void *)&la, &len);
    printf("%d\n", ntohs(la.sin_port));
    fflush(stdout);
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) continue;
        int u = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(u, (void *)&ua, sizeof ua)) { perror("connect"); close(c); close(u); continue; }
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct pair up = {c, u}, down = {u, c};
        pthread_t t;
        pthread_create(&t, NULL, pump, &up);
        pump(&down);
        pthread_join(t, NULL);
        close(c); close(u);
    }
}
"""


# -- the minimal Python relay (run as a child: --relay KIND BUF LIP UPIP UPPORT) ------------

def py_relay(kind: str, bufsize: int, lip: str, upip: str, upport: int) -> None:
    import fcntl

    def pump(src: socket.socket, dst: socket.socket) -> None:
        if kind == "splice":
            pr, pw = os.pipe()
            fcntl.fcntl(pw, fcntl.F_SETPIPE_SZ, bufsize)
            s, d = src.fileno(), dst.fileno()
            try:
                while n := os.splice(s, pw, bufsize, flags=os.SPLICE_F_MOVE):
                    while n:
                        n -= os.splice(pr, d, n, flags=os.SPLICE_F_MOVE)
            except OSError:
                pass
            os.close(pr)
            os.close(pw)
        else:
            buf = bytearray(bufsize)
            view = memoryview(buf)
            try:
                while n := src.recv_into(buf):
                    dst.sendall(view[:n])
            except OSError:
                pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((lip, 0))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)
    while True:
        c, _ = ls.accept()
        u = socket.create_connection((upip, upport))
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = threading.Thread(target=pump, args=(c, u))
        t.start()
        pump(u, c)
        t.join()
        c.close()
        u.close()


# -- the bench --------------------------------------------------------------------------------

class Ceiling:
    def __init__(self, net: str, with_c: bool, with_corral: bool) -> None:
        self.procs: list[subprocess.Popen] = []
        self.tmp = tempfile.mkdtemp(prefix="corral-bench-ceiling-", dir="/dev/shm")
        self.srv_ip, self.relay_ip = f"{net}.1", f"{net}.2"
        big = os.path.join(self.tmp, "big")
        with open(big, "wb") as f:
            chunk = os.urandom(1 << 20)
            left = BIG
            while left:
                left -= f.write(chunk[:min(left, len(chunk))])
        srv = self._spawn([sys.executable, os.path.join(HERE, "network.py"), "--serve",
                           self.srv_ip, big])
        self.srv_pid = srv.pid
        self.srv_port = int(srv.stdout.readline())
        self.url = f"http://{self.srv_ip}:{self.srv_port}/big"
        #: variant -> (pid of the relay or None, curl argv)
        self.variants: dict[str, tuple[int | None, list[str]]] = {
            "direct": (None, curl_argv(self.url))}
        up = [self.srv_ip, str(self.srv_port)]
        for name, kind, buf in (("py-splice", "splice", PIPE_SIZE),
                                ("py-copy", "copy", COPY_BUF),
                                ("py-copy-16m", "copy", 16 << 20)):
            self._relay(name, [sys.executable, os.path.abspath(__file__), "--relay", kind,
                               str(buf), self.relay_ip, *up])
        self.c_note = ""
        if with_c:
            cc = shutil.which("gcc") or shutil.which("cc")
            if cc is None:
                self.c_note = "no C compiler: c-* variants skipped"
            else:
                src, exe = os.path.join(self.tmp, "relay.c"), os.path.join(self.tmp, "relay")
                with open(src, "w") as f:
                    f.write(C_RELAY)
                subprocess.run([cc, "-O2", "-pthread", "-o", exe, src], check=True)
                for name, kind, buf in (("c-splice", "splice", PIPE_SIZE),
                                        ("c-copy", "copy", COPY_BUF),
                                        ("c-copy-256k", "copy", 256 << 10),
                                        ("c-copy-16m", "copy", 16 << 20)):
                    self._relay(name, [exe, kind, str(buf), self.relay_ip, *up, "-"])
        if with_corral:
            cfg = os.path.join(self.tmp, "egress.json")
            with open(cfg, "w") as f:
                json.dump({"allow": [f"{self.srv_ip}:{self.srv_port}"],
                           "allow_private": ["127.0.0.0/8"],
                           "budget": {"bytes_out": None, "bytes_in": None,
                                      "requests": None}}, f)
            for name, env in (("corral", {}),
                              ("corral-copy", {"CORRAL_EGRESS_RELAY_SPLICE": "0"})):
                port = free_port(self.relay_ip)
                p = self._spawn([sys.executable, "-I", "-m", "corral.egress", "--config", cfg,
                                 "--listen", f"{self.relay_ip}:{port}", "--events",
                                 "/dev/null"], stderr=subprocess.PIPE,
                                env={**HOST_ENV, **env})
                if "listening on" not in p.stderr.readline().decode():
                    raise SystemExit(f"{name}: the standalone proxy did not start")
                self.variants[name] = (p.pid, curl_argv(
                    self.url, proxy=f"http://{self.relay_ip}:{port}"))

    def _spawn(self, argv, **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("env", HOST_ENV)
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def _relay(self, name: str, argv: list[str]) -> None:
        p = self._spawn(argv)
        port = int(p.stdout.readline())
        wait_listening(self.relay_ip, port)
        self.variants[name] = (p.pid, curl_argv(f"http://{self.relay_ip}:{port}/big"))

    def download(self, name: str) -> dict:
        """One download: MB/s, and the CPU ms of curl, the server and the relay."""
        pid, argv = self.variants[name]
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s0 = cpu_ms(self.srv_pid)
        r0 = cpu_ms(pid) if pid else 0.0
        p = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, env=HOST_ENV, timeout=120)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            code, size, speed = p.stdout.split()
        except ValueError:
            raise SystemExit(f"{name}: curl printed {p.stdout!r} {p.stderr[-300:]!r}") from None
        if code != "200" or int(size) != BIG:
            raise SystemExit(f"{name}: HTTP {code}, {size} of {BIG} bytes")
        return {"mbs": float(speed) / 1e6,
                "curl": (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) * 1e3,
                "server": cpu_ms(self.srv_pid) - s0,
                "relay": (cpu_ms(pid) - r0) if pid else 0.0}

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="measured rounds (default 8)")
    ap.add_argument("--no-c", action="store_true", help="skip the C relays")
    ap.add_argument("--no-corral", action="store_true", help="skip corral's proxy")
    ap.add_argument("--json", metavar="FILE", help="write every raw sample here")
    ap.add_argument("--relay", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.relay:
        kind, buf, lip, upip, upport = args.relay
        py_relay(kind, int(buf), lip, upip, int(upport))
        return 0
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    a, b = os.urandom(2)
    net = f"127.{a % 200 + 50}.{b}"
    load0 = loadavg()
    print(f"command: {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(f"nproc {os.cpu_count()}, load at start {load0}")
    bench = Ceiling(net, not args.no_c, not args.no_corral)
    if bench.c_note:
        print(bench.c_note)
    names = list(bench.variants)
    samples: dict[str, list[dict]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    try:
        for rnd in range(args.runs + 1):
            k = rnd % len(names)
            got = {n: bench.download(n) for n in names[k:] + names[:k]}
            if rnd == 0:
                continue                      # warm-up
            for n in names:
                samples[n].append(got[n])
                ratios[n].append(got[n]["mbs"] / got["direct"]["mbs"])
            print(f"  round {rnd}: " + "  ".join(f"{n} {got[n]['mbs']:.0f}" for n in names),
                  file=sys.stderr)
    finally:
        bench.close()
    load1 = loadavg()
    med = statistics.median
    print(f"\n{args.runs} rounds of a 200 MB download (MB/s = 10^6 B/s, curl's figure); "
          f"x direct: median of the per-round ratios; CPU ms per download, means")
    print(f"  {'variant':12} {'MB/s':>6} {'min':>6} {'max':>6} {'x direct':>9} {'best x':>7}"
          f" {'curl':>6} {'relay':>6} {'server':>6} {'total':>6}")
    for n in names:
        s = samples[n]
        mbs = [x["mbs"] for x in s]
        cpu = {k: statistics.mean([x[k] for x in s]) for k in ("curl", "relay", "server")}
        relay = f"{cpu['relay']:6.0f}" if n != "direct" else f"{'':>6}"
        print(f"  {n:12} {med(mbs):6.0f} {min(mbs):6.0f} {max(mbs):6.0f} "
              f"{med(ratios[n]):8.2f}x {max(ratios[n]):6.2f}x {cpu['curl']:6.0f} {relay} "
              f"{cpu['server']:6.0f} {sum(cpu.values()):6.0f}")
    print(f"load at end {load1}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_start": load0, "load_end": load1, "samples": samples}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
