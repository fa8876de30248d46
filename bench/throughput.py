"""Short namespace runs per second at 1, 2, 8 and 32 in parallel, against raw bwrap.

    .venv/bin/python bench/throughput.py [--quick] [--seconds S] [--rounds N] [--json FILE]

Each contender runs `/usr/bin/python3 -c pass` as fast as it can with P workers for S
seconds (default 8, --quick 2): every worker starts a new run as soon as its last one
ended, until the deadline; runs/s = runs finished / time until the last one finished.

  corral.run threads     P threads in this process calling corral.run (default policy,
                         namespace tier, a fresh Sandbox each run)
  corral.run processes   P forked worker processes, each calling corral.run in a loop (no
                         shared GIL, no shared supervisor)
  sb.exec threads        P threads, each with its own Sandbox kept open, calling
                         sb.exec in a loop: the per-exec cost only (cgroup, bwrap,
                         supervision), without the per-sandbox run dir and scratch mount
  bwrap threads          P threads each calling subprocess.run on the raw bwrap argv of
                         bench/startup.py (corral's argv, its seccomp program on a memfd
                         per thread, same uid and environment): the baseline of the ratio

Rounds (default 3, --quick 1) alternate the contenders in rotated order at each
parallelism; the figure is the median over rounds. Goal (issue 7): >= 100 runs/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import startup

CMD = ["/usr/bin/python3", "-c", "pass"]
PARALLEL = (1, 2, 8, 32)
GOAL = 100.0


def _loop_threads(p: int, seconds: float, one) -> tuple[int, int, float, list[str]]:
    done = [0] * p
    errs: list[str] = []
    deadline = time.monotonic() + seconds

    def worker(i: int) -> None:
        while time.monotonic() < deadline:
            try:
                one(i)
                done[i] += 1
            except Exception as e:  # noqa: BLE001 - counted and reported
                errs.append(f"{type(e).__name__}: {e}"[:300])

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(p)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done), len(errs), time.monotonic() - t0, errs[:3]


class Runner:
    def __init__(self) -> None:
        import corral
        from corral.linux import seccomp

        self.corral = corral
        self.seccomp = seccomp
        self.base = startup.Bench(use_runsc=False)
        self.fds: dict[int, int] = {}
        self.sbs: dict[int, object] = {}

    def close(self) -> None:
        for sb in self.sbs.values():
            sb.close()
        for fd in self.fds.values():
            os.close(fd)
        self.base.close()

    def corral_one(self, _i: int) -> None:
        startup.check_result(self.corral.run(CMD))

    def sb_exec_one(self, i: int) -> None:
        sb = self.sbs.get(i)
        if sb is None:
            sb = self.sbs[i] = self.corral.Sandbox().open()
        startup.check_result(sb.exec(CMD))

    def bwrap_one(self, i: int) -> None:
        b = self.base
        fd = self.fds.get(i)
        if fd is None:
            fd = self.fds[i] = self.seccomp.bpf_fd(self.seccomp.bpf_bytes(None))
        os.lseek(fd, 0, os.SEEK_SET)
        prefix = list(b.bwrap_prefix)
        prefix[prefix.index("--seccomp") + 1] = str(fd)
        kw = {"user": b.uid, "group": b.gid, "extra_groups": []} if b.switch_user else {}
        startup.run_checked(prefix + ["--", *CMD], env=b.env, pass_fds=(fd,), **kw)

    def threads(self, p: int, seconds: float, fn) -> dict:
        n, nerr, wall, errs = _loop_threads(p, seconds, fn)
        return {"runs": n, "errors": nerr, "wall_s": wall, "per_s": n / wall,
                "error_samples": errs}

    def processes(self, p: int, seconds: float) -> dict:
        """P forked workers, each corral.run in a loop; counts come back through a pipe."""
        deadline_in = seconds
        pipes, pids = [], []
        t0 = time.monotonic()
        for _ in range(p):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: only corral.run in a loop, then report and _exit
                os.close(r)
                code = 0
                try:
                    n, nerr, _, errs = _loop_threads(1, deadline_in - (time.monotonic() - t0),
                                                     self.corral_one)
                    os.write(w, json.dumps({"n": n, "e": nerr, "s": errs}).encode())
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            os.close(w)
            pipes.append(r)
            pids.append(pid)
        n = nerr = 0
        errs: list[str] = []
        for r, pid in zip(pipes, pids):
            data = b""
            while chunk := os.read(r, 65536):
                data += chunk
            os.close(r)
            os.waitpid(pid, 0)
            if data:
                d = json.loads(data)
                n, nerr, errs = n + d["n"], nerr + d["e"], errs + d["s"]
            else:
                nerr += 1
                errs.append("worker died without a report")
        wall = time.monotonic() - t0
        return {"runs": n, "errors": nerr, "wall_s": wall, "per_s": n / wall,
                "error_samples": errs[:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--parallel", default=",".join(map(str, PARALLEL)))
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 8.0)
    rounds = args.rounds or (1 if args.quick else 3)
    par = [int(x) for x in args.parallel.split(",")]

    info = startup.machine()
    r = Runner()
    contenders = {
        "corral.run threads": lambda p: r.threads(p, seconds, r.corral_one),
        "corral.run processes": lambda p: r.processes(p, seconds),
        "sb.exec threads": lambda p: r.threads(p, seconds, r.sb_exec_one),
        "bwrap threads": lambda p: r.threads(p, seconds, r.bwrap_one),
    }
    names = list(contenders)
    raw: dict[str, list[dict]] = {f"{c} {p}": [] for c in names for p in par}
    load0 = os.getloadavg()
    try:
        r.threads(2, 1.0, r.corral_one)   # warm-up: imports, seccomp cache, page cache
        r.threads(2, 1.0, r.bwrap_one)
        for rnd in range(rounds):
            for p in par:
                k = (rnd + p) % len(names)
                for c in names[k:] + names[:k]:
                    res = contenders[c](p)
                    raw[f"{c} {p}"].append(res)
                    print(f"  round {rnd + 1} P={p:<3} {c:22} {res['per_s']:7.1f}/s "
                          f"({res['runs']} runs, {res['errors']} errors)", file=sys.stderr,
                          flush=True)
    finally:
        r.close()
    load1 = os.getloadavg()

    summary = {}
    for c in names:
        for p in par:
            xs = raw[f"{c} {p}"]
            summary[f"{c} {p}"] = {
                "contender": c, "parallel": p,
                "per_s": statistics.median(x["per_s"] for x in xs),
                "errors": sum(x["errors"] for x in xs), "runs": sum(x["runs"] for x in xs)}
    for s in summary.values():
        base = summary[f"bwrap threads {s['parallel']}"]["per_s"]
        s["ratio_to_bwrap"] = s["per_s"] / base if base else None

    print(f"\n/usr/bin/python3 -c pass, runs per second, median of {rounds} round(s) of "
          f"{seconds:g} s; load average {load0[0]:.2f} -> {load1[0]:.2f}")
    print(f"  {'contender':22}" + "".join(f"{'P=' + str(p):>16}" for p in par))
    for c in names:
        cells = "".join(f"{summary[f'{c} {p}']['per_s']:9.1f} ({summary[f'{c} {p}']['ratio_to_bwrap']:.2f}x)"
                        for p in par)
        print(f"  {c:22}{cells}")
    best = max((s for s in summary.values() if s["contender"].startswith("corral.run")),
               key=lambda s: s["per_s"])
    goal = {"goal": f">= {GOAL:g} short namespace runs/s", "value": best["per_s"],
            "at": f"{best['contender']}, P={best['parallel']}", "met": best["per_s"] >= GOAL}
    print(f"\ngoal {goal['goal']}: best {goal['value']:.1f}/s ({goal['at']})  "
          f"{'MET' if goal['met'] else 'NOT MET'}")
    errs = {k: x["error_samples"] for k, v in raw.items() for x in v if x["errors"]}
    if errs:
        print("errors:", json.dumps(errs, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "command": CMD, "seconds": seconds, "rounds": rounds,
                       "parallel": par, "loadavg": [load0, load1], "summary": summary,
                       "goal": goal, "raw": raw}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
