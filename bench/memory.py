"""What one more idle live sandbox costs in memory, with 1, 10 and 100 alive at once.

    .venv/bin/python bench/memory.py [--quick] [--counts 1,10,100] [--json FILE]

"Idle live sandbox" in corral's API: a `Sandbox` opened and running a long command with
`Sandbox.exec` (a Sandbox with nothing running holds no process: only its run directory,
an empty scratch tmpfs and, after its first command, an empty cgroup kept for the next). Here each of N threads of one supervisor
process opens a Sandbox (namespace tier, default policy) and calls
`sb.exec(["/bin/sleep", "3600"])` (the N Sandboxes are opened one after another first,
so their start-up does not race). When all N `sleep`s are running, the script measures:

  descendants   the PSS (/proc/PID/smaps_rollup) of every process below the supervisor:
                per sandbox bubblewrap's monitor, bubblewrap's init (the sandbox's pid 1),
                `sleep`, and with network allow the egress proxy (a Python process)
  supervisor    the supervisor's own PSS growth over its state after one warm-up run
                (threads, their stacks, buffers, Sandbox objects): its share
  cgroups       the sum of memory.usage_in_bytes (v1) / memory.current (v2) of the runs'
                cgroups: what the kernel charges them, kernel memory included (informative)

Per sandbox = (descendants + supervisor growth) / N. Each (N, network) point runs in a
fresh supervisor process (this script with --one). Then the sleeps are killed, the
threads joined, the Sandboxes closed. Goal (issue 7): one more idle namespace sandbox
<= 10 MB (network none).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

GOAL_MB = 10.0
MB = 1024 * 1024
POLICIES = {
    "none": {},
    # the proxy corral starts per exec; allowed host never contacted (no traffic is made)
    "allow": {"network": {"mode": "allow", "allow": ["pypi.org"]}},
}


def smaps(pid: int) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                    out[k] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def descendants(root: int) -> list[tuple[int, str]]:
    kids: dict[int, list[int]] = {}
    comm: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                s = f.read()
        except OSError:
            continue
        c = s[s.index("(") + 1:s.rindex(")")]
        ppid = int(s[s.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
        comm[int(name)] = c
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append((k, comm[k]))
            todo.append(k)
    return out


def cgroup_usage(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for ln in lines:
        _hid, ctrl, path = ln.split(":", 2)
        if "memory" in ctrl.split(","):
            p = f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"
            break
    else:
        p = f"/sys/fs/cgroup{lines[-1].split(':', 2)[2]}/memory.current"
    try:
        with open(p) as f:
            return p, int(f.read())
    except (OSError, ValueError):
        return None


def one(n: int, mode: str) -> dict:
    """Runs in a fresh supervisor process: N idle sandboxes, measured, then ended."""
    import corral

    pol = POLICIES[mode]
    me = os.getpid()
    r = corral.run(["/bin/true"], policy=pol)  # warm-up: lazy imports, seccomp cache
    if r.verdict != "ok":
        return {"error": f"warm-up run: {r.verdict} {r.stderr[-300:]} {r.events}"}
    time.sleep(0.3)
    base = smaps(me)
    sbs = []
    errors: list[str] = []
    t0 = time.monotonic()
    for _ in range(n):  # opened one after another: run dir, scratch tmpfs
        try:
            sbs.append(corral.Sandbox(pol).open())
        except Exception as e:  # noqa: BLE001 - recorded; the rest are measured
            errors.append(f"open: {type(e).__name__}: {e}"[:300])
    results: list = [None] * len(sbs)

    def idle(i: int) -> None:
        try:
            results[i] = sbs[i].exec(["/bin/sleep", "3600"], timeout=3600)
        except Exception as e:  # noqa: BLE001
            errors.append(f"exec: {type(e).__name__}: {e}"[:300])

    threads = [threading.Thread(target=idle, args=(i,)) for i in range(len(sbs))]
    for t in threads:
        t.start()
    while time.monotonic() - t0 < 300:
        d = descendants(me)
        sleeps = [p for p, c in d if c == "sleep"]
        proxies = [p for p, c in d if c not in ("sleep", "bwrap")]
        alive = len(sleeps) if mode == "none" else min(len(sleeps), len(proxies))
        if alive + len(errors) >= n:
            break
        time.sleep(0.2)
    started_s = time.monotonic() - t0
    time.sleep(1.0 if mode == "none" else 3.0)  # settle: the proxies finish importing
    d = descendants(me)
    sup = smaps(me)
    by: dict[str, dict] = {}
    for pid, c in d:
        m = smaps(pid)
        e = by.setdefault(c, {"count": 0, "pss": 0, "rss": 0})
        e["count"] += 1
        e["pss"] += m.get("Pss", 0)
        e["rss"] += m.get("Rss", 0)
    cg = {}
    for pid, c in d:
        if c == "sleep":
            u = cgroup_usage(pid)
            if u:
                cg[u[0]] = u[1]
    sleeps = [p for p, c in d if c == "sleep"]
    while any(t.is_alive() for t in threads):  # end every sleep, also any started late
        for p, c in descendants(me):
            if c == "sleep":
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for t in threads:
            t.join(0.2)
    problems = []
    for sb in sbs:
        problems += sb.close()
    live = max(len(sleeps), 1)  # per sandbox = per live one (an open/exec error is listed)
    desc_pss = sum(e["pss"] for e in by.values())
    sup_growth = sup.get("Pss", 0) - base.get("Pss", 0)
    verdicts: dict[str, int] = {}
    for x in results:
        k = x.verdict if x is not None else "no result"
        verdicts[k] = verdicts.get(k, 0) + 1
    return {
        "n": n, "network": mode, "sleeps_seen": len(sleeps), "start_all_s": started_s,
        "descendants": by, "descendants_pss": desc_pss,
        "supervisor_pss_before": base.get("Pss", 0), "supervisor_pss_after": sup.get("Pss", 0),
        "supervisor_growth": sup_growth,
        "per_sandbox_bytes": (desc_pss + sup_growth) / live,
        "per_sandbox_descendants_bytes": desc_pss / live,
        "per_sandbox_supervisor_bytes": sup_growth / live,
        "cgroups": len(cg), "cgroup_usage_per_sandbox_bytes": (sum(cg.values()) / len(cg))
        if cg else None,
        "verdicts_after_kill": verdicts, "errors": errors[:5], "teardown_problems": problems[:5],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="network allow only at 1 and 10")
    ap.add_argument("--counts", default="1,10,100")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--one", nargs=2, metavar=("N", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1])))
        return 0
    counts = [int(x) for x in args.counts.split(",")]
    points = [(n, "none") for n in counts] + [
        (n, "allow") for n in counts if not (args.quick and n > 10)]
    out = []
    for n, mode in points:
        p = subprocess.run(check=False, args=[sys.executable, __file__, "--one", str(n), mode],
                           capture_output=True, text=True, timeout=900)
        try:
            res = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            res = {"n": n, "network": mode,
                   "error": f"exit {p.returncode}: {p.stderr.strip()[-600:]}"}
        out.append(res)
        if "error" in res:
            print(f"  N={n:<4} network {mode:5} failed: {res['error']}")
            continue
        kinds = ", ".join(f"{c} x{e['count']} {e['pss'] / max(res['sleeps_seen'], 1) / MB:.2f}"
                          for c, e in sorted(res["descendants"].items()))
        cgu = res["cgroup_usage_per_sandbox_bytes"]
        print(f"  N={n:<4} network {mode:5} per sandbox {res['per_sandbox_bytes'] / MB:6.2f} MB "
              f"= processes {res['per_sandbox_descendants_bytes'] / MB:.2f} ({kinds}) + "
              f"supervisor {res['per_sandbox_supervisor_bytes'] / MB:.2f}; cgroup charge "
              f"{(cgu or 0) / MB:.2f} MB; all up in {res['start_all_s']:.1f}s "
              f"{res['errors'] or ''}", flush=True)
    ok = [r for r in out if r.get("network") == "none" and "error" not in r]
    worst = max(ok, key=lambda r: r["per_sandbox_bytes"]) if ok else None
    goal = {"goal": f"one more idle namespace sandbox <= {GOAL_MB:g} MB (network none)",
            "value_mb": worst["per_sandbox_bytes"] / MB if worst else None,
            "at_n": worst["n"] if worst else None,
            "met": bool(worst) and worst["per_sandbox_bytes"] / MB <= GOAL_MB}
    if worst:
        print(f"\ngoal {goal['goal']}: worst {goal['value_mb']:.2f} MB (N={goal['at_n']})  "
              f"{'MET' if goal['met'] else 'NOT MET'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"points": out, "goal": goal, "policies": POLICIES,
                       "command": ["/bin/sleep", "3600"]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
