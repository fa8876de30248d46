"""The egress proxy's CPU per run: bench/soak.py's `net` and `secret` kinds, alternated.

    .venv/bin/python bench/proxy_cpu.py [--rounds 30]

Runs as root from the repository root (soak.py's world: an HTTP server on a loopback /24
of its own, a dnsmasq). Per run: the CPU time its proxy had used when the supervisor
stopped it (/proc/PID/schedstat, nanoseconds on a CPU; a proxy forked from the zygote
counts its spare's warm-up under SCHED_IDLE too), and the run's wall time. Prints p50 /
p90 / mean of each kind's proxy CPU and p50 / p99 of its wall time. The CPU figure does
not depend much on the machine's load, the wall time does: to set two builds side by side,
run it alternately with the other build's interpreter (the zygote is started with
`python -I`, which ignores PYTHONPATH: give the other build a venv of its own).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "fixtures"))

import corral  # noqa: E402
from corral.backends.host import proxy as px  # noqa: E402

KINDS = ("net", "secret")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("proxy_cpu.py runs as root (soak.py's world and sandbox uids)")
        return 2
    os.environ.setdefault("CORRAL_AUDIT", "0")
    import soak

    cpu: list[float] = []
    stop = px.Proxy.stop

    def noted(self):
        with open(f"/proc/{self.pid}/schedstat") as f:
            cpu.append(int(f.read().split()[0]) / 1e6)
        return stop(self)

    px.Proxy.stop = noted
    srv, dns, port = soak.start_world()
    try:
        mix = soak.kinds_for("namespace", port, "/nonexistent")
        got: dict[str, list[float]] = {k: [] for k in KINDS}
        wall: dict[str, list[float]] = {k: [] for k in KINDS}
        for k in KINDS:     # the first proxy starts afresh, the later ones from the zygote
            for _ in range(2):
                corral.run(*mix[k][:2])
        for _ in range(a.rounds):
            for k in KINDS:
                argv, policy, check = mix[k]
                cpu.clear()
                s = time.perf_counter()
                r = corral.run(argv, policy)
                wall[k].append(time.perf_counter() - s)
                bad = check(r)
                if bad:
                    print(f"{k}: {bad}")
                    return 1
                got[k].append(cpu[0])
        for k in KINDS:
            c, w = got[k], wall[k]
            print(f"{k:7} proxy CPU ms p50 {pct(c, 50):6.2f} p90 {pct(c, 90):6.2f} "
                  f"mean {sum(c) / len(c):6.2f}   wall ms p50 {pct(w, 50) * 1e3:6.1f} "
                  f"p99 {pct(w, 99) * 1e3:6.1f}")
        print(f"load {os.getloadavg()[0]:.1f}")
    finally:
        dns.kill()
        dns.wait()
        srv.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
