"""The egress proxy's speed on loopback: throughput, added latency, a connection storm.

    .venv/bin/python bench/network.py [--quick] [--runs N] [--requests N] [--storm N]
                                      [--json FILE]

Issue 3 (Speed) asks, side by side in one run, through the proxy vs direct on loopback
(issue 16 tightens its goals to 0.9x and +0.5 ms):

  1. throughput of a 200 MB download (goal: >= 0.9 of direct), measured by curl's
     %{speed_download}, in these variants (bench/README.md):
       direct       curl on the host -> the server
       sandbox      curl inside corral.run (network.mode = "allow"), through HTTP_PROXY,
                    i.e. the proxy corral starts in the run's cgroup, default limits; a
                    small GET first (it waits for the fresh proxy to start), then the
                    timed download
       live         curl in one live sandbox (corral.Sandbox.create, network allow, default
                    limits), made once for the whole run: sb.commands.run per round, its
                    proxy forked from the zygote and warm (issue 16's goal is stated for a
                    live sandbox)
       sandbox-Ncpu the same as sandbox with limits.cpus = nproc (the default is 1.0 and the proxy
                    shares the run's CPU quota with curl)
       sandbox-copy  the same as sandbox, from a supervisor process of its own whose
                    proxies have CORRAL_EGRESS_RELAY_SPLICE=0 (relay threads that copy
                    through a 4 MiB ring instead of splicing, the default until
                    2026-12-06): the A/B of the ring inside a sandbox
       direct-cg    direct, with curl in a cpu cgroup made beside the sandboxes' (cgroup v1:
                    /corral/bench-PID-direct, the live sandbox's cpu.shares and CFS quota
                    copied): the CPU share a sandboxed client gets, without a proxy. A
                    reference for like with like: a sandbox is one cgroup (curl and its
                    proxy together) under corral's, whose weight every sandbox on the
                    machine shares, where the host's curl is a task of its own
       socat        curl on the host -> a socat TCP forwarder on the host -> the server
       socat-256k   the same with socat -b 262144 (socat's default buffer is 8 KiB)
       proxy        curl -x on the host -> `python -m corral.egress --listen` (standalone)
       proxy-loop   the same proxy with CORRAL_EGRESS_RELAY_THREADS=0: no relay thread,
                    every byte on the event loop (the A/B of relay.py's bulk threads)
       proxy-copy   the same proxy with CORRAL_EGRESS_RELAY_SPLICE=0: its relay threads
                    copy through a 4 MiB ring instead of splicing (the default until
                    2026-12-06)
  2. added latency per request, p50 and p95 (goal: p50 <= direct + 0.5 ms): small GETs, a new
     connection each, from a Python client on the host (direct and standalone proxy,
     interleaved) and from a Python client inside a sandbox (a one-shot corral.run, and
     the live sandbox above) through HTTP_PROXY;
  3. a storm of 500 concurrent connections from inside one sandbox (limits.open_files =
     2048), each doing one GET through the proxy (goal: 500/500 ok).

CPU per download, beside the MB/s: curl's (getrusage of the children, host variants), the
server's and the standalone or live proxy's (/proc/PID/stat, every thread). On 2 shared CPUs
a loaded machine hands out CPU time, so the ratio direct/proxied of the CPU a download costs
in all is what a busy machine's MB/s ratio tends to; it moves far less with the load than
MB/s does.

Everything runs on a random /24 of 127.0.0.0/8; nothing leaves the machine. The server is
a small threaded Python process of this script (--serve) that answers /big from a 200 MB
file in /dev/shm with sendfile(2) and /small with a 100-byte body.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from network_clients import (  # noqa: E402 - the server, the clients, /proc readings
    DIRECT_LATENCY,
    SANDBOX_LATENCY,
    SANDBOX_STORM,
    SMALL,
    cpu_ms,
    curl_argv,
    free_port,
    get_request,
    loadavg,
    progress,
    sched_ms,
    serve,
    socat_version,
    stats,
    timed_get,
    wait_listening,
)
from startup import machine, sh  # the same machine description

BIG = 200 * 1000 * 1000          # bytes of the download (200 MB, 1 MB = 10^6 B)
WARMUP = 1                       # throughput rounds discarded
LAT_WARMUP = 10                  # latency requests discarded per batch
GOAL_RATIO = 0.9                 # issue 16 (issue 3 asked 0.8): throughput >= 0.9 x direct
GOAL_ADDED_MS = 0.5              # issue 16 (issue 3 asked 1 ms): added p50 latency <= 0.5 ms
SANDBOX_PY = "/usr/bin/python3"  # the interpreter the sandboxed clients run
CPU_V1 = "/sys/fs/cgroup/cpu"    # cgroup v1's cpu hierarchy (direct-cg)

HOST_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # no *_proxy


class Failed(Exception):
    pass


# -- the bench ----------------------------------------------------------------------------

def parse_curl(out: str, err: str) -> float:
    """MB/s from curl's -w line; Failed unless a 200 with every byte."""
    try:
        code, size, speed = out.split()
        code, size, speed = int(code), int(size), float(speed)
    except ValueError:
        raise Failed(f"curl printed {out!r}, stderr {err.strip()[-300:]!r}") from None
    if code != 200 or size != BIG:
        raise Failed(f"HTTP {code}, {size} bytes of {BIG}; stderr {err.strip()[-300:]!r}")
    return speed / 1e6


class Bench:
    def __init__(self, net: str, ab_src: str | None = None) -> None:
        self.procs: list[subprocess.Popen] = []
        self.tmp = tempfile.mkdtemp(prefix="corral-bench-net-", dir="/dev/shm")
        self.srv_ip, self.relay_ip, self.proxy_ip = f"{net}.1", f"{net}.2", f"{net}.3"
        self.big = os.path.join(self.tmp, "big")
        with open(self.big, "wb") as f:
            chunk = os.urandom(1 << 20)
            left = BIG
            while left:
                left -= f.write(chunk[:min(left, len(chunk))])
        srv = self._spawn([sys.executable, os.path.abspath(__file__), "--serve",
                           self.srv_ip, self.big])
        self.srv_port = int(srv.stdout.readline())
        self.big_url = f"http://{self.srv_ip}:{self.srv_port}/big"
        self.small_url = f"http://{self.srv_ip}:{self.srv_port}/small"
        # the first request of each fresh sandbox, its proxy's start-up included: curl's
        # time to the first byte (throughput runs), the latency client's first sample
        self.first_byte_ms: list[float] = []
        self.first_request_ms: list[float] = []

        # socat as it comes (8 KiB read/write buffer), and with -b 256 KiB
        self.socat: dict[str, tuple[int, list[str]]] = {}
        for name, opts in (("socat", []), ("socat-256k", ["-b", "262144"])):
            port = free_port(self.relay_ip)
            listen = f"TCP-LISTEN:{port},bind={self.relay_ip},reuseaddr,fork,backlog=4096"
            argv = ["socat", *opts, listen, f"TCP:{self.srv_ip}:{self.srv_port}"]
            self._spawn(argv)
            wait_listening(self.relay_ip, port)
            self.socat[name] = (port, argv)

        # the standalone proxy: the policy's config, budget unlimited (one proxy serves every
        # round here; a sandbox gets a fresh proxy and budget per run)
        self.allow = [f"{self.srv_ip}:{self.srv_port}"]
        cfg = {"allow": self.allow, "allow_private": ["127.0.0.0/8"],
               "budget": {"bytes_out": None, "bytes_in": None, "requests": None}}
        self.proxy_cfg = os.path.join(self.tmp, "egress.json")
        with open(self.proxy_cfg, "w") as f:
            json.dump(cfg, f)
        self.proxy_port = free_port(self.proxy_ip)
        self.proxy_argv = [sys.executable, "-I", "-m", "corral.egress", "--config",
                           self.proxy_cfg, "--listen", f"{self.proxy_ip}:{self.proxy_port}",
                           "--events", "/dev/null"]
        p = self._spawn(self.proxy_argv, stderr=subprocess.PIPE)
        self.proxy_pid = p.pid
        # the same proxy with its relay threads off (every byte moved on the event loop,
        # as before them): the A/B of egress/relay.py's _Relay in the same run
        self.loop_port = free_port(self.proxy_ip)
        self.loop_argv = [*self.proxy_argv[:-4], "--listen",
                          f"{self.proxy_ip}:{self.loop_port}", "--events", "/dev/null"]
        q = self._spawn(self.loop_argv, stderr=subprocess.PIPE,
                        env={**HOST_ENV, "CORRAL_EGRESS_RELAY_THREADS": "0"})
        self.loop_pid = q.pid
        self.loop_cpu_ms: list[float] = []
        if "listening on" not in q.stderr.readline().decode():
            raise SystemExit("the standalone proxy (relay threads off) did not start")
        # and with its relay threads splicing instead of copying (relay.py RELAY_COPY)
        self.splice_port = free_port(self.proxy_ip)
        self.splice_argv = [*self.proxy_argv[:-4], "--listen",
                            f"{self.proxy_ip}:{self.splice_port}", "--events", "/dev/null"]
        q = self._spawn(self.splice_argv, stderr=subprocess.PIPE,
                        env={**HOST_ENV, "CORRAL_EGRESS_RELAY_SPLICE": "0"})
        self.splice_pid = q.pid
        self.splice_cpu_ms: list[float] = []
        if "listening on" not in q.stderr.readline().decode():
            raise SystemExit("the standalone proxy (relay threads splicing) did not start")
        # --ab-src: the same standalone proxy from another source tree (say main's, from
        # `git archive main src | tar -x -C DIR`), its small requests interleaved with the
        # others in the latency batches: an A/B of the proxy's code in one run
        self.ab_pid = self.ab_port = None
        self.lat_ab: list[float] = []
        self.lat_ab_cpu_us: list[float] = []
        if ab_src:
            self.ab_port = free_port(self.proxy_ip)
            code = (f"import runpy, sys; sys.path.insert(0, {os.path.abspath(ab_src)!r}); "
                    f"runpy.run_module('corral.egress', run_name='__main__', alter_sys=True)")
            q = self._spawn([sys.executable, "-I", "-c", code, "--config", self.proxy_cfg,
                             "--listen", f"{self.proxy_ip}:{self.ab_port}", "--events",
                             "/dev/null"], stderr=subprocess.PIPE)
            self.ab_pid = q.pid
            if "listening on" not in q.stderr.readline().decode():
                raise SystemExit(f"the proxy from {ab_src} did not start")
        #: CPU ms (user + system, every thread) the standalone proxy spent per download:
        #: what it costs, which load on the machine moves far less than MB/s
        self.proxy_cpu_ms: list[float] = []
        line = p.stderr.readline().decode()
        if "listening on" not in line:
            raise SystemExit(f"the standalone proxy did not start: {line}")
        self.proxy_url = f"http://{self.proxy_ip}:{self.proxy_port}"

        import corral
        self.corral = corral
        self.nproc = len(os.sched_getaffinity(0))
        self.srv_pid = srv.pid
        #: per variant, CPU ms of each download: {"curl": [...], "server": [...], "proxy": [...]}
        self.cpu: dict[str, dict[str, list[float]]] = {}
        self._live = None           # the live sandbox (live_sandbox()), made on first use
        self._direct_cg: str | None = None   # direct-cg's cpu cgroup, made on first use
        #: the standalone proxy's CPU per small request, us, one figure per latency batch
        self.lat_cpu_us: list[float] = []

    def _spawn(self, argv, **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("env", HOST_ENV)
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def live_sandbox(self):
        """The run's one live sandbox (Sandbox.create, default limits), made on first use."""
        if self._live is None:
            from corral.backends.host import zygote

            zygote.warm()               # as in a long-lived supervisor: its proxy is forked
            zygote.wait_ready()
            pol = self.policy()
            # one proxy for every round: the default budget (per sandbox) would cut it
            pol["network"]["budget"] = {"requests": 1000000, "bytes_in": "1000G",
                                        "bytes_out": "1000G"}
            try:
                self._live = self.corral.Sandbox.create(pol, timeout=3600)
            except Exception as e:  # corral failing is a result here
                raise Failed(f"Sandbox.create raised {type(e).__name__}: {e}") from e
        return self._live

    def live_run(self, argv: list[str]):
        try:
            r = self.live_sandbox().commands.run(argv, timeout=150)
        except Exception as e:  # corral failing is a result here
            raise Failed(f"commands.run raised {type(e).__name__}: {e}") from e
        if r.verdict != "ok" or r.exit_code != 0:
            raise Failed(f"verdict {r.verdict}, exit {r.exit_code}: {r.stderr.strip()[-400:]!r}")
        return r

    def note_cpu(self, variant: str, **ms: float) -> None:
        d = self.cpu.setdefault(variant, {})
        for k, v in ms.items():
            d.setdefault(k, []).append(v)

    def direct_cgroup(self) -> str:
        """A cpu cgroup (v1) beside the live sandbox's, with its cpu.shares and CFS quota."""
        if self._direct_cg is None:
            sb = self.live_sandbox()
            proxy = sb._live.proxy
            if proxy is None:
                raise Failed("the live sandbox has no proxy")
            with open(f"/proc/{proxy.pid}/cgroup") as f:
                rel = next((line.split(":", 2)[2].strip() for line in f
                            if "cpu" in line.split(":", 2)[1].split(",")), None)
            src = os.path.join(CPU_V1, (rel or "").lstrip("/"))
            if not rel or rel == "/" or not os.path.isdir(src):
                raise Failed(f"no cgroup v1 cpu group for the live sandbox ({rel!r})")
            cg = os.path.join(os.path.dirname(src), f"bench-{os.getpid()}-direct")
            os.mkdir(cg)
            self._direct_cg = cg
            for name in ("cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.shares"):
                with open(os.path.join(src, name)) as f:
                    value = f.read().strip()
                with open(os.path.join(cg, name), "w") as f:
                    f.write(value)
        return self._direct_cg

    def close(self) -> None:
        if self._direct_cg is not None:
            try:
                os.rmdir(self._direct_cg)
            except OSError:
                pass
        if self._live is not None:
            try:
                self._live.kill()
            except Exception:  # noqa: BLE001 - the bench's own teardown
                pass
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def policy(self, **limits) -> dict:
        return {"network": {"mode": "allow", "allow": self.allow,
                            "allow_private": ["127.0.0.0/8"]},
                "limits": {"timeout": "120s", **limits}}

    def run(self, argv: list[str], pol: dict, check: bool = True):
        try:
            r = self.corral.run(argv, policy=pol)
        except Exception as e:  # corral failing is a result here
            raise Failed(f"corral.run raised {type(e).__name__}: {e}") from e
        if not check:
            return r
        if r.verdict != "ok" or r.exit_code != 0:
            raise Failed(f"verdict {r.verdict}, exit {r.exit_code}: {r.stderr.strip()[-400:]!r}"
                         f" events {[e for e in r.events if e['kind'] != 'net'][:5]}")
        return r

    # -- throughput: each returns MB/s ------------------------------------------------------
    def host_curl(self, argv: list[str], variant: str | None = None,
                  proxy_pid: int | None = None, preexec=None) -> float:
        """curl on the host; with `variant`, the CPU of curl, the server and (proxy_pid)
        the relay for this download is noted under it."""
        import resource

        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s0 = cpu_ms(self.srv_pid)
        p0 = cpu_ms(proxy_pid) if proxy_pid else 0.0
        p = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, env=HOST_ENV, timeout=180, preexec_fn=preexec)
        mbs = parse_curl(p.stdout, p.stderr)
        if variant is not None:
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            ms = {"curl": (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) * 1e3,
                  "server": cpu_ms(self.srv_pid) - s0}
            if proxy_pid:
                ms["proxy"] = cpu_ms(proxy_pid) - p0
            self.note_cpu(variant, **ms)
        return mbs

    def tp_direct(self) -> float:
        return self.host_curl(curl_argv(self.big_url), "direct")

    def tp_direct_cg(self) -> float:
        tasks = os.path.join(self.direct_cgroup(), "tasks")

        def join() -> None:
            with open(tasks, "w") as f:
                f.write(str(os.getpid()))

        return self.host_curl(curl_argv(self.big_url), "direct-cg", preexec=join)

    def socat_url(self, name: str) -> str:
        return f"http://{self.relay_ip}:{self.socat[name][0]}/big"

    def tp_socat(self) -> float:
        return self.host_curl(curl_argv(self.socat_url("socat")))

    def tp_socat_256k(self) -> float:
        return self.host_curl(curl_argv(self.socat_url("socat-256k")))

    def tp_proxy(self) -> float:
        mbs = self.host_curl(curl_argv(self.big_url, proxy=self.proxy_url), "proxy",
                             self.proxy_pid)
        self.proxy_cpu_ms.append(self.cpu["proxy"]["proxy"][-1])
        return mbs

    def tp_live(self) -> float:
        """curl in the run's live sandbox, through its (warm, zygote-forked) proxy."""
        sb = self.live_sandbox()
        pid = sb._live.proxy.pid if sb._live.proxy is not None else None
        s0 = cpu_ms(self.srv_pid)
        p0 = cpu_ms(pid) if pid else 0.0
        r = self.live_run(curl_argv(self.big_url, sandbox=True))
        ms = {"server": cpu_ms(self.srv_pid) - s0}
        if r.usage.cpu_s is not None:
            ms["curl"] = r.usage.cpu_s * 1e3
        if pid:
            ms["proxy"] = cpu_ms(pid) - p0
        self.note_cpu("live", **ms)
        return parse_curl(r.stdout, r.stderr)

    def tp_proxy_loop(self) -> float:
        t0 = cpu_ms(self.loop_pid)
        url = f"http://{self.proxy_ip}:{self.loop_port}"
        mbs = self.host_curl(curl_argv(self.big_url, proxy=url))
        self.loop_cpu_ms.append(cpu_ms(self.loop_pid) - t0)
        return mbs

    def tp_proxy_splice(self) -> float:
        t0 = cpu_ms(self.splice_pid)
        url = f"http://{self.proxy_ip}:{self.splice_port}"
        mbs = self.host_curl(curl_argv(self.big_url, proxy=url))
        self.splice_cpu_ms.append(cpu_ms(self.splice_pid) - t0)
        return mbs

    def sandbox_curl_cmd(self) -> str:
        """A small GET first (it waits for the fresh proxy to start; its time to the first
        byte is kept), then the timed download."""
        first = ["curl", "-sS", "-o", "/dev/null", "-f", "-w", "%{time_starttransfer}\\n",
                 self.small_url]
        return f"{shlex.join(first)} && {shlex.join(curl_argv(self.big_url, sandbox=True))}"

    def tp_sandbox(self, **limits) -> float:
        r = self.run(["/bin/sh", "-c", self.sandbox_curl_cmd()], self.policy(**limits))
        first, _, rest = r.stdout.partition("\n")
        try:
            self.first_byte_ms.append(float(first) * 1e3)
        except ValueError:
            raise Failed(f"the first curl printed {first!r}; stderr {r.stderr[-300:]!r}") \
                from None
        return parse_curl(rest, r.stderr)

    def tp_sandbox_splice(self) -> float:
        """tp_sandbox from a child supervisor (--sandbox-run) with the splicing relay."""
        argv = [sys.executable, os.path.abspath(__file__), "--sandbox-run",
                json.dumps({"argv": ["/bin/sh", "-c", self.sandbox_curl_cmd()],
                            "policy": self.policy()})]
        p = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=180,
                           env={**os.environ, "CORRAL_EGRESS_RELAY_SPLICE": "0"})
        try:
            r = json.loads(p.stdout)
        except ValueError:
            raise Failed(f"the child supervisor printed {p.stdout[-200:]!r}, stderr "
                         f"{p.stderr[-300:]!r}") from None
        if r["verdict"] != "ok" or r["exit_code"] != 0:
            raise Failed(f"verdict {r['verdict']}, exit {r['exit_code']}: "
                         f"{r['stderr'][-400:]!r}")
        first, _, rest = r["stdout"].partition("\n")
        return parse_curl(rest, r["stderr"])

    def tp_sandbox_ncpu(self) -> float:
        return self.tp_sandbox(cpus=float(self.nproc))

    def throughput_variants(self) -> dict:
        return {"direct": self.tp_direct, "direct-cg": self.tp_direct_cg,
                "live": self.tp_live, "sandbox": self.tp_sandbox,
                "sandbox-2cpu" if self.nproc == 2 else f"sandbox-{self.nproc}cpu":
                    self.tp_sandbox_ncpu,
                "sandbox-copy": self.tp_sandbox_splice,
                "socat": self.tp_socat, "socat-256k": self.tp_socat_256k,
                "proxy": self.tp_proxy, "proxy-loop": self.tp_proxy_loop,
                "proxy-copy": self.tp_proxy_splice}

    # -- latency -----------------------------------------------------------------------------
    def lat_host(self, n: int) -> tuple[list[float], list[float]]:
        """n direct and n standalone-proxy GETs, interleaved (order flipped every pair)."""
        direct_req = get_request(self.srv_ip, self.srv_port, False)
        proxy_req = get_request(self.srv_ip, self.srv_port, True)
        d_addr, p_addr = (self.srv_ip, self.srv_port), (self.proxy_ip, self.proxy_port)
        direct, proxied, ab = [], [], []
        c0 = sched_ms(self.proxy_pid)
        a0 = sched_ms(self.ab_pid) if self.ab_pid else 0.0
        for i in range(n + LAT_WARMUP):
            pair = [(direct, d_addr, direct_req), (proxied, p_addr, proxy_req)]
            if self.ab_port:                   # three: rotated, then flipped, each time
                pair.append((ab, (self.proxy_ip, self.ab_port), proxy_req))
                k = i % 3
                pair = pair[k:] + pair[:k]
            for out, addr, req in (pair if i % 2 == 0 else pair[::-1]):
                ms = timed_get(addr, req) * 1e3
                if i >= LAT_WARMUP:
                    out.append(ms)
        self.lat_cpu_us.append((sched_ms(self.proxy_pid) - c0) * 1e3 / (n + LAT_WARMUP))
        if self.ab_pid:
            self.lat_ab += ab
            self.lat_ab_cpu_us.append((sched_ms(self.ab_pid) - a0) * 1e3 / (n + LAT_WARMUP))
        return direct, proxied

    def lat_sandbox(self, n: int) -> list[float]:
        r = self.run([SANDBOX_PY, "-c", SANDBOX_LATENCY, self.srv_ip, str(self.srv_port),
                      str(n), str(LAT_WARMUP)], self.policy())
        out = json.loads(r.stdout)
        self.first_request_ms.append(out["warmup_ms"][0])
        return out["ms"]

    def lat_direct_cg(self, n: int) -> list[float]:
        """n GETs straight to the server from SANDBOX_PY on the host, in direct-cg's cgroup."""
        tasks = os.path.join(self.direct_cgroup(), "tasks")

        def join() -> None:
            with open(tasks, "w") as f:
                f.write(str(os.getpid()))

        p = subprocess.run([SANDBOX_PY, "-I", "-c", DIRECT_LATENCY, self.srv_ip,
                            str(self.srv_port), str(n), str(LAT_WARMUP)], check=False,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           env=HOST_ENV, timeout=120, preexec_fn=join)
        try:
            return json.loads(p.stdout)["ms"]
        except (ValueError, KeyError):
            raise Failed(f"the direct-cg client printed {p.stdout[-200:]!r}, stderr "
                         f"{p.stderr[-300:]!r}") from None

    def lat_live(self, n: int) -> list[float]:
        r = self.live_run([SANDBOX_PY, "-c", SANDBOX_LATENCY, self.srv_ip, str(self.srv_port),
                           str(n), str(LAT_WARMUP)])
        return json.loads(r.stdout)["ms"]

    # -- storm ------------------------------------------------------------------------------
    def storm(self, n: int, open_files: int) -> dict:
        r = self.run([SANDBOX_PY, "-c", SANDBOX_STORM, self.srv_ip, str(self.srv_port),
                      str(n)], self.policy(open_files=open_files), check=False)
        try:
            out = json.loads(r.stdout)
        except ValueError:
            out = {"n": n, "ok": 0, "errors": {f"verdict {r.verdict}, exit {r.exit_code}":
                                               n}, "stderr": r.stderr[-400:]}
        net = [e for e in r.events if e["kind"] == "net"]
        out["net_events"] = len(net)
        out["net_denied"] = sum(e["decision"] != "allow" for e in net)
        out["other_events"] = [e for e in r.events if e["kind"] != "net"][:5]
        out["verdict"] = r.verdict
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 runs instead of 9")
    ap.add_argument("--runs", type=int, help="measured runs per throughput variant, latency "
                    "batches and storms (default 9, --quick 3)")
    ap.add_argument("--requests", type=int, default=200,
                    help="small GETs per latency batch and client (default 200)")
    ap.add_argument("--storm", type=int, default=500, help="concurrent connections (500)")
    ap.add_argument("--open-files", type=int, default=2048,
                    help="limits.open_files of the storm's sandbox (2048)")
    ap.add_argument("--json", metavar="FILE", help="write every raw sample here")
    ap.add_argument("--ab-src", metavar="DIR", help="a src/ tree (holding corral/) whose "
                    "standalone proxy's small requests are interleaved with this one's in "
                    "the latency batches, CPU per request beside: an A/B of the code")
    ap.add_argument("--serve", nargs=2, metavar=("IP", "FILE"), help=argparse.SUPPRESS)
    ap.add_argument("--sandbox-run", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return 0
    if args.sandbox_run:                     # one corral.run in this (child) supervisor
        import corral

        spec = json.loads(args.sandbox_run)
        r = corral.run(spec["argv"], policy=spec["policy"])
        print(json.dumps({"verdict": r.verdict, "exit_code": r.exit_code,
                          "stdout": r.stdout, "stderr": r.stderr}))
        return 0
    runs = args.runs if args.runs is not None else (3 if args.quick else 9)
    if runs < 1 or args.requests < 1 or args.storm < 1:
        ap.error("--runs, --requests and --storm must be at least 1")
    if os.geteuid() != 0:
        print("note: corral's network mode wants root (as in scripts/test.sh)", file=sys.stderr)

    command = shlex.join([os.path.relpath(sys.executable), os.path.relpath(__file__),
                          *sys.argv[1:]])
    info = machine()
    info["curl"] = sh(["curl", "--version"])
    info["socat"] = socat_version()
    info["commit"] = sh(["git", "-C", HERE, "rev-parse", "--short", "HEAD"]) + (
        " (work tree modified)" if sh(["git", "-C", HERE, "status", "--porcelain",
                                        "--", "../src"]) not in ("exit 0", "") else "")
    a, b = os.urandom(2)
    net = f"127.{a % 200 + 50}.{b}"          # 127.50-249.x: clear of 127.0.0.x
    info["load_start"] = loadavg()
    print(f"command: {command}")
    print("machine:")
    for k in ("nproc", "cpu", "vm", "cgroup", "kernel", "python", "bwrap", "curl", "socat",
              "corral", "commit", "euid", "load_start"):
        print(f"  {k:7} {info[k]}")

    bench = Bench(net, args.ab_src)
    errors: dict[str, str] = {}
    tp: dict[str, list[float]] = {}
    tp_warm: dict[str, list[float]] = {}
    lat: dict[str, list[float]] = {"direct": [], "proxy": [], "sandbox": [], "live": [],
                                   "direct-cg": []}
    storms: list[dict] = []
    retried: list[str] = []
    t0 = time.monotonic()

    def twice(label: str, fn):
        """fn(), and once more if it fails: a sandbox that failed to start (say) is reported
        under "retried" and does not drop a whole variant; a second failure does."""
        try:
            return fn()
        except Failed as e:
            retried.append(f"{label}: {e}")
            print(f"\n  {label} failed, retried once: {e}", file=sys.stderr)
            return fn()

    try:
        print(f"  server  {bench.srv_ip}:{bench.srv_port} (python, sendfile from "
              f"{bench.big}); socat relays on {bench.relay_ip}; standalone "
              f"proxy {bench.proxy_ip}:{bench.proxy_port}")
        # 1. throughput, round robin with the first variant rotated; WARMUP rounds dropped
        funcs = bench.throughput_variants()
        names = list(funcs)
        tp = {v: [] for v in names}
        tp_warm = {v: [] for v in names}
        for rnd in range(WARMUP + runs):
            k = rnd % len(names)
            for v in names[k:] + names[:k]:
                if v in errors:
                    continue
                progress(f"throughput round {rnd + 1}/{WARMUP + runs}: {v} "
                         f"({time.monotonic() - t0:.0f}s)")
                try:
                    (tp_warm if rnd < WARMUP else tp)[v].append(
                        twice(f"throughput {v}, round {rnd}", funcs[v]))
                except (Failed, OSError, subprocess.SubprocessError) as e:
                    errors[v] = f"round {rnd}: {type(e).__name__}: {e}"
                    print(f"\n  {v} failed and is dropped: {errors[v]}", file=sys.stderr)

        # 2. latency: per round, a host batch (direct/proxy interleaved), then a sandbox batch
        for rnd in range(runs):
            progress(f"latency round {rnd + 1}/{runs} ({time.monotonic() - t0:.0f}s)")
            try:
                d, p = bench.lat_host(args.requests)
                lat["direct"] += d
                lat["proxy"] += p
            except OSError as e:
                errors["latency host"] = f"round {rnd}: {type(e).__name__}: {e}"
            for key, measure, failures in (
                    ("sandbox", bench.lat_sandbox, (Failed, ValueError, KeyError)),
                    ("live", bench.lat_live, (Failed, ValueError, KeyError)),
                    ("direct-cg", bench.lat_direct_cg,
                     (Failed, OSError, subprocess.SubprocessError))):
                name = f"latency {key}"
                if name in errors:
                    continue
                try:
                    lat[key] += twice(f"{name}, round {rnd}",
                                      functools.partial(measure, args.requests))
                except failures as e:
                    errors[name] = f"round {rnd}: {type(e).__name__}: {e}"

        # 3. storm
        for rnd in range(runs):
            progress(f"storm {rnd + 1}/{runs} ({time.monotonic() - t0:.0f}s)")
            try:
                storms.append(twice(f"storm {rnd}",
                                    lambda: bench.storm(args.storm, args.open_files)))
            except Failed as e:
                storms.append({"n": args.storm, "ok": 0, "errors": {str(e)[:200]: args.storm},
                               "net_events": 0})
        progress("")
        if sys.stderr.isatty():
            print(file=sys.stderr)
    finally:
        bench.close()

    info["load_end"] = loadavg()
    goals = []

    def goal(name: str, value: str, met: bool) -> None:
        goals.append({"goal": name, "value": value, "met": met})

    # -- report -----------------------------------------------------------------------------
    print(f"\n1. throughput: {BIG // 10**6} MB over loopback, curl's %{{speed_download}} "
          f"(1 MB = 10^6 B); median of {runs} runs per variant, round robin, {WARMUP} warm-up "
          f"round dropped")
    how = {
        "direct": shlex.join(curl_argv(bench.big_url)),
        "sandbox-copy": "the same as sandbox, in a supervisor process of its own (this "
                          "script's --sandbox-run) with CORRAL_EGRESS_RELAY_SPLICE=0, which "
                          "its proxy inherits (backends/host/launch.py PROXY_ENV_PASSED): "
                          "relay threads that copy through a 4 MiB ring, the default until "
                          "2026-12-06 (a one-shot supervisor: its proxy starts afresh, not "
                          "from the zygote)",
        "direct-cg": "the same as direct, curl started in a cpu cgroup (v1) made beside "
                     "the live sandbox's with its cpu.shares and CFS quota copied",
        "live": f"sb.commands.run({curl_argv(bench.big_url, sandbox=True)!r}) in one "
                f"corral.Sandbox.create(policy) made for the whole run (the same policy "
                f"as sandbox, its budget raised: one proxy serves every round); its proxy "
                f"forked from the zygote, warm after the first round",
        "sandbox": f"corral.run(['/bin/sh', '-c', {bench.sandbox_curl_cmd()!r}]), network "
                   f"allow={bench.allow} allow_private=['127.0.0.0/8'], default limits "
                   f"(cpus 1.0; the proxy runs in the run's cgroup); the second curl's figure",
        **{name: f"{shlex.join(curl_argv(bench.socat_url(name)))}  via  {shlex.join(argv)}"
           for name, (_, argv) in bench.socat.items()},
        "proxy": f"{shlex.join(curl_argv(bench.big_url, proxy=bench.proxy_url))}  via  "
                 f"{shlex.join(bench.proxy_argv)}",
        "proxy-loop": f"the same with CORRAL_EGRESS_RELAY_THREADS=0 in the proxy's "
                      f"environment ({shlex.join(bench.loop_argv)}): every byte relayed on "
                      f"the event loop, as before the relay threads",
        "proxy-copy": f"the same with CORRAL_EGRESS_RELAY_SPLICE=0 in the proxy's "
                      f"environment ({shlex.join(bench.splice_argv)}): relay threads "
                      f"that copy through a 4 MiB ring (the default until 2026-12-06)",
    }
    for v in names:
        if v.startswith("sandbox-") and v.endswith("cpu"):
            how[v] = f"the same as sandbox with limits.cpus = {float(bench.nproc)}"
    base = statistics.median(tp["direct"]) if tp.get("direct") and "direct" not in errors \
        else None
    print(f"  {'variant':14} {'median MB/s':>12} {'min':>9} {'max':>9} {'x direct':>9}")
    tp_summary = {}
    for v in names:
        xs = tp[v]
        if v in errors or not xs:
            print(f"  {v:14} {'failed: see below':>41}")
            continue
        s = stats(xs)
        s["ratio"] = s["median"] / base if base else None
        tp_summary[v] = s
        ratio = f"{s['ratio']:.2f}" if base else "-"
        print(f"  {v:14} {s['median']:12.0f} {s['min']:9.0f} {s['max']:9.0f} {ratio:>9}")
    cg = tp_summary.get("direct-cg")
    if cg:
        print("  like with like: the sandboxed variants against direct-cg (curl alone in "
              "a sandbox's CPU share): " + ", ".join(
                  f"{v} {tp_summary[v]['median'] / cg['median']:.2f}x"
                  for v in names if v in tp_summary and v.startswith(("live", "sandbox"))))
        for v in names:
            if v in tp_summary and v.startswith(("live", "sandbox")):
                tp_summary[v]["ratio_direct_cg"] = tp_summary[v]["median"] / cg["median"]
    print("  commands:")
    for v in names:
        print(f"    {v:14} {how[v]}")
    for label, xs in (("proxy", bench.proxy_cpu_ms), ("proxy-loop", bench.loop_cpu_ms),
                      ("proxy-copy", bench.splice_cpu_ms)):
        if xs:
            pc = stats(xs)
            print(f"  {label}: the standalone proxy's CPU time per {BIG // 10**6} MB download "
                  f"{pc['median']:.0f} ms median (min {pc['min']:.0f}, max {pc['max']:.0f}; "
                  f"user + system, every thread)")
    cpu_summary = {}
    if bench.cpu:
        print(f"  CPU ms per {BIG // 10**6} MB download, median (curl: getrusage of the "
              f"children, or the live command's usage; server and proxy: /proc/PID/stat, "
              f"10 ms ticks):")
        print(f"  {'variant':14} {'curl':>7} {'server':>7} {'proxy':>7} {'total':>7} "
              f"{'direct/total':>13}")
        tot = {}
        for v in names:
            d = bench.cpu.get(v)
            if not d:
                continue
            med = {k: statistics.median(xs) for k, xs in d.items() if xs}
            if "curl" in med and "server" in med:
                tot[v] = med["curl"] + med["server"] + med.get("proxy", 0.0)
            cpu_summary[v] = {**med, **({"total": tot[v]} if v in tot else {})}
        for v, med in cpu_summary.items():
            ratio = (f"{tot['direct'] / tot[v]:.2f}" if "direct" in tot and v in tot
                     else "")
            print(f"  {v:14} {med.get('curl', float('nan')):7.0f} "
                  f"{med.get('server', float('nan')):7.0f} "
                  f"{med.get('proxy', float('nan')):7.0f} "
                  f"{med.get('total', float('nan')):7.0f} {ratio:>13}")
    if bench.first_byte_ms:
        fb = stats(bench.first_byte_ms)
        print(f"  a fresh sandbox's first request (the small GET before each sandboxed "
              f"download) waited {fb['median']:.0f} ms median (min {fb['min']:.0f}, max "
              f"{fb['max']:.0f}) for its first byte: the proxy process is still starting "
              f"when the command runs")

    print(f"\n2. latency of a small GET ({SMALL} B body), new connection per request, "
          f"{args.requests} per batch x {runs} batches ({LAT_WARMUP} warm-up requests "
          f"dropped per batch), ms from connect to the last byte")
    print(f"  {'client':34} {'p50':>7} {'p95':>7} {'min':>7} {'+p50':>7} {'+p95':>7}")
    lat_summary = {}
    labels = {"direct": "host -> server (direct)",
              "proxy": "host -> standalone proxy -> server",
              "sandbox": "sandbox -> HTTP_PROXY -> server",
              "live": "live sandbox -> HTTP_PROXY -> srv",
              "direct-cg": "host, sandbox's CPU share -> srv"}
    if lat["direct"]:
        bd = stats(lat["direct"])
        bd["p50"] = bd["median"]
        for k in ("direct", "proxy", "sandbox", "live", "direct-cg"):
            if not lat[k]:
                print(f"  {labels[k]:34} {'failed: see below':>30}")
                continue
            s = stats(lat[k])
            s["p50"] = s["median"]
            s["added_p50"] = s["p50"] - bd["p50"]
            s["added_p95"] = s["p95"] - bd["p95"]
            lat_summary[k] = s
            add = ("" if k == "direct" else
                   f"{s['added_p50']:+7.3f} {s['added_p95']:+7.3f}")
            print(f"  {labels[k]:34} {s['p50']:7.3f} {s['p95']:7.3f} {s['min']:7.3f} {add}")
        if lat["proxy"]:
            pairs = [p - d for d, p in zip(lat["direct"], lat["proxy"])]
            lat_summary["proxy"]["paired_added_p50"] = statistics.median(pairs)
            print(f"  (host: median of the per-pair difference, proxy minus direct: "
                  f"{statistics.median(pairs):+.3f} ms)")
        if bench.lat_cpu_us:
            lat_summary["proxy"]["cpu_us_per_request"] = statistics.median(bench.lat_cpu_us)
            print(f"  the standalone proxy's CPU per request: "
                  f"{statistics.median(bench.lat_cpu_us):.0f} us median of the batches "
                  f"(schedstat, every thread)")
        if bench.lat_ab:
            s = stats(bench.lat_ab)
            lat_summary["proxy-ab"] = {**s, "p50": s["median"],
                                       "added_p50": s["median"] - bd["p50"],
                                       "cpu_us_per_request":
                                           statistics.median(bench.lat_ab_cpu_us)}
            print(f"  --ab-src {args.ab_src}: its proxy p50 {s['median']:.3f} ms "
                  f"({s['median'] - bd['p50']:+.3f} ms; this tree's "
                  f"{lat_summary['proxy']['added_p50']:+.3f}), CPU per request "
                  f"{statistics.median(bench.lat_ab_cpu_us):.0f} us (this tree's "
                  f"{statistics.median(bench.lat_cpu_us):.0f})")
    print(f"  the sandboxed client is {SANDBOX_PY} under corral's seccomp filter; its "
          f"added figures are against the host's direct client")
    if lat["direct-cg"] and lat_summary:
        cg = statistics.median(lat["direct-cg"])
        print(f"  like with like: against direct-cg ({SANDBOX_PY} on the host in a cpu cgroup "
              f"with the live sandbox's share, p50 {cg:.3f} ms): " + ", ".join(
                  f"{k} {lat_summary[k]['p50'] - cg:+.3f} ms" for k in ("sandbox", "live")
                  if k in lat_summary))
        for k in ("sandbox", "live"):
            if k in lat_summary:
                lat_summary[k]["added_p50_direct_cg"] = lat_summary[k]["p50"] - cg
    if bench.first_request_ms:
        fr = stats(bench.first_request_ms)
        print(f"  first request of each sandbox (a warm-up one, not in the table): "
              f"{fr['median']:.1f} ms median, max {fr['max']:.1f} ms (proxy start-up)")

    print(f"\n3. storm: {args.storm} connections opened at once from one sandbox "
          f"(limits.open_files = {args.open_files}, pids default) through its proxy, then "
          f"one GET each")
    print(f"  {'run':>4} {'ok':>6} {'errors':>7} {'open at once':>13} {'open s':>8} "
          f"{'wall s':>8} {'net events':>11}  error kinds")
    for i, s in enumerate(storms):
        n_err = sum(s.get("errors", {}).values())
        print(f"  {i + 1:>4} {s.get('ok', 0):>6} {n_err:>7} {s.get('opened_at_once', 0):>13} "
              f"{s.get('open_s', float('nan')):8.3f} {s.get('wall_s', float('nan')):8.3f} "
              f"{s['net_events']:>11}  {s.get('errors') or ''} {s.get('stderr', '')}")

    print(f"\nload average at the start: {info['load_start']}; at the end: {info['load_end']}"
          f"\n  (the benchmark itself keeps about one CPU busy; more means other work "
          f"shared the {info['nproc']} CPUs and moved the figures)")

    print("\ngoals (issue 3, as tightened by issue 16):")
    for v in names:
        s = tp_summary.get(v)
        if v == "direct" or not s or s["ratio"] is None:
            continue
        met = s["ratio"] >= GOAL_RATIO
        reference = (" (reference)" if v.startswith("socat") or v in ("proxy-loop",
                                                                       "proxy-copy",
                                                                       "sandbox-copy",
                                                                       "direct-cg")
                     else "")
        goal(f"throughput {v} >= {GOAL_RATIO} x direct{reference}",
             f"{s['median']:.0f} vs {base:.0f} MB/s ({s['ratio']:.2f}x)", met)
    for k in ("proxy", "sandbox", "live"):
        s = lat_summary.get(k)
        if s:
            goal(f"latency {k}: added p50 <= {GOAL_ADDED_MS:g} ms",
                 f"{s['added_p50']:+.3f} ms (p95 {s['added_p95']:+.3f} ms)",
                 s["added_p50"] <= GOAL_ADDED_MS)
    if storms:
        all_ok = all(s.get("ok") == args.storm and not s.get("errors") for s in storms)
        walls = [s["wall_s"] for s in storms if "wall_s" in s]
        goal(f"storm: {args.storm}/{args.storm} ok in every run",
             f"{sum(s.get('ok', 0) for s in storms)}/{args.storm * len(storms)} ok over "
             f"{len(storms)} runs, median wall {statistics.median(walls):.2f} s"
             if walls else "no run finished", all_ok)
    for g in goals:
        print(f"  {g['goal']:52} {g['value']:38} {'MET' if g['met'] else 'NOT MET'}")

    if retried:
        print("\nfailed once and retried (the retry is in the figures):")
        for e in retried:
            print(f"  {e}")
    if errors:
        print("\nnot measured:")
        for v, e in errors.items():
            print(f"  {v}: {e}")

    if args.json:
        out = {"command": command, "machine": info, "runs": runs, "warmup": WARMUP,
               "bytes": BIG, "commands": how, "errors": errors, "retried": retried,
               "throughput_mb_s": tp, "throughput_warmup_mb_s": tp_warm,
               "throughput_summary": tp_summary, "cpu_ms": bench.cpu,
               "cpu_summary": cpu_summary,
               "latency_ms": lat, "latency_summary": lat_summary,
               "storm": storms, "goals": goals,
               "sandbox_first_byte_ms": bench.first_byte_ms,
               "proxy_cpu_ms": bench.proxy_cpu_ms, "proxy_loop_cpu_ms": bench.loop_cpu_ms,
               "proxy_splice_cpu_ms": bench.splice_cpu_ms,
               "sandbox_first_request_ms": bench.first_request_ms}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nraw samples written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
