"""Whose CPU cgroup should a sandbox's egress proxy be in? An experiment, not a feature.

    .venv/bin/python bench/network_cgroup.py [--rounds N]      (root, cgroup v1 only)

One live sandbox (network allow, default limits: cpus 1.0) and a server of bench/network.py
on a random 127.x/24. Each round, the proxy's threads are moved by hand into the run's cpu
cgroup (where corral puts it), into a sibling cpu cgroup of its own made for this
bench (`/corral/ID-proxy`, the run's own CPU quota copied: what a proxy cgroup per run
would be), or into the root cpu cgroup (outside any quota and any run's group weight), in
rotating order; then, inside the sandbox, 150 small GETs (the latency client of
network.py, 10 warm-up ones dropped) and a 200 MB curl download. Each round also times
the same download by curl on the host, direct (the reference of the 0.9x goal). Only the
cpu hierarchy changes: memory and pids stay the run's. Prints the medians per placement
and their ratios to direct. docs/network.md (Whose CPU is the proxy's) has what it
measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from network import BIG, SANDBOX_LATENCY  # noqa: E402

CPU = "/sys/fs/cgroup/cpu"


def proxy_of_sandbox() -> tuple[int, str]:
    """(pid, cpu cgroup) of this process's egress proxy: a child of ours in a corral cgroup."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cgroup") as f:
                cg = [ln.split(":", 2)[2] for ln in f.read().splitlines()
                      if ln.split(":")[1] == "cpu"]
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"egress" in cmd and cg and cg[0].startswith("/corral/"):
            return int(d), cg[0]
    raise SystemExit("no egress proxy found below this process")


def move(pid: int, cgroup: str) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(os.path.join(CPU + cgroup, "tasks"), "w") as f:
            f.write(tid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(CPU, "corral")):
        raise SystemExit(f"needs cgroup v1 with corral's cgroups under {CPU}/corral (root)")
    import corral

    a, b = os.urandom(2)
    net = f"127.{a % 200 + 50}.{b}"
    big = f"/dev/shm/corral-bench-cg-{os.getpid()}"
    with open(big, "wb") as f:             # as network.py's: not a sparse file of zeros
        chunk = os.urandom(1 << 20)
        left = BIG
        while left:
            left -= f.write(chunk[:min(left, len(chunk))])
    srv = subprocess.Popen([sys.executable, os.path.join(HERE, "network.py"), "--serve",
                            f"{net}.1", big], stdout=subprocess.PIPE)
    try:
        port = int(srv.stdout.readline())
        pol = {"network": {"mode": "allow", "allow": [f"{net}.1:{port}"],
                           "allow_private": ["127.0.0.0/8"],
                           "budget": {"requests": 100000, "bytes_in": "100G"}},
               "limits": {"timeout": "600s"}}
        sb = corral.Sandbox.create(pol, timeout=600)
        try:
            sb.exec(["/bin/sh", "-c", f"curl -sS -o /dev/null http://{net}.1:{port}/small"])
            pid, run_cg = proxy_of_sandbox()
            sibling = run_cg.rstrip("/") + "-proxy"
            os.mkdir(CPU + sibling)
            for name in ("cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.shares"):
                with open(os.path.join(CPU + run_cg, name)) as f:
                    value = f.read().strip()
                with open(os.path.join(CPU + sibling, name), "w") as f:
                    f.write(value)
            places = {"run": run_cg, "sibling": sibling, "root": ""}
            lat: dict[str, list[float]] = {k: [] for k in places}
            tp: dict[str, list[float]] = {k: [] for k in (*places, "direct")}
            order = list(places)
            for i in range(args.rounds):
                d = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}",
                                    f"http://{net}.1:{port}/big"], capture_output=True,
                                   text=True, timeout=120)
                tp["direct"].append(float(d.stdout) / 1e6)
                for where in order[i % 3:] + order[:i % 3]:
                    move(pid, places[where])
                    r = sb.exec(["/usr/bin/python3", "-c", SANDBOX_LATENCY, f"{net}.1",
                                 str(port), "150", "10"], timeout=120)
                    lat[where] += json.loads(r.stdout)["ms"]
                    r = sb.exec(["/bin/sh", "-c", "curl -sS -o /dev/null -w "
                                 f"'%{{speed_download}}' http://{net}.1:{port}/big"],
                                timeout=120)
                    tp[where].append(float(r.stdout) / 1e6)
        finally:
            sb.close()
            try:
                os.rmdir(CPU + sibling)
            except (NameError, OSError):
                pass
    finally:
        srv.terminate()
        os.unlink(big)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    direct = statistics.median(tp["direct"])
    print(f"direct (curl on the host){'':25} 200 MB {direct:.0f} MB/s "
          f"(runs {[round(x) for x in tp['direct']]})")
    for w, label in (("run", "the run's cpu cgroup (corral's choice)"),
                     ("sibling", "a sibling cgroup, the run's quota"),
                     ("root", "the root cpu cgroup")):
        m = statistics.median(tp[w])
        print(f"proxy in {label:40} latency p50 {statistics.median(lat[w]):.3f} ms; "
              f"200 MB {m:.0f} MB/s = {m / direct:.2f}x direct "
              f"(runs {[round(x) for x in tp[w]]})")
    print(f"load average at the end: {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
