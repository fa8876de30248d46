"""N live sandboxes at once, each running a command every second: errors, command latency,
memory per sandbox, and nothing left afterwards.

    .venv/bin/python bench/concurrency.py [--n 200] [--seconds 60] [--modes none,allow]
                                          [--json FILE]

Runs as root from the repository root. Each mode runs in a fresh supervisor process
(this script with --one MODE):

  1. creates N live sandboxes (corral.Sandbox.create, namespace tier) one after another,
     network.mode "none", or "allow" (one allowed name, a local dnsmasq as the proxy's
     resolver: every sandbox gets its egress proxy);
  2. starts one thread per sandbox; sandbox i runs `sb.commands.run(["/bin/true"])` at
     t0 + i/N + k seconds for k = 0, 1, ... until --seconds are over (a command that
     ends late makes the next one start late, never two at once in one sandbox);
  3. halfway through, sums the PSS (/proc/PID/smaps_rollup) of every process below the
     supervisor (bwrap, the sandboxes' inits and holders, the proxies, the zygote) plus the
     supervisor's own PSS growth since before the first sandbox, divided by N; also the
     memory charged to the sandboxes' cgroups (v1 memory.usage_in_bytes, v2
     memory.current) over N;
  4. kills every sandbox, then bench/leaks.py's counts (as in bench/soak.py) before the
     first sandbox and after the last: processes of sandbox uids and below the
     supervisor, proxies, mounts, cgroups, run directories, registry entries, fds.

Reported per mode: commands run, errors (a Result that is not ok, an exception), commands
that started more than 1 s late, p50/p99/max command latency (the call's wall time),
memory per sandbox, the leak counts. Exit status 1 on any error or anything left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "fixtures"))

MB = 1024 * 1024


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def cgroup_charge(sbs) -> int:
    """Bytes charged to the memory cgroups of every process below this one."""
    from memory import descendants

    seen, total = set(), 0
    for pid, _ in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            _, ctrl, path = line.split(":", 2)
            if "/corral/" not in path:
                continue
            if ctrl == "memory":
                f = f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"
            elif ctrl == "":
                f = f"/sys/fs/cgroup{path}/memory.current"
                if not os.path.exists(f):
                    f = f"/sys/fs/cgroup/unified{path}/memory.current"
            else:
                continue
            if f in seen:
                continue
            seen.add(f)
            try:
                with open(f) as fh:
                    total += int(fh.read())
            except (OSError, ValueError):
                pass
    return total


def one(mode: str, n: int, seconds: float) -> dict:
    import leaks

    tracker = leaks.Tracker().install()
    from memory import descendants, smaps

    import corral

    policy: dict = {"isolation": "namespace"}
    dns = None
    if mode == "allow":
        from netfix import start_dnsmasq

        dns, port = start_dnsmasq({"conc.test": "127.0.0.1"})
        policy["network"] = {"mode": "allow", "allow": ["conc.test"],
                             "nameservers": [f"127.0.0.1:{port}"]}
    warm = corral.Sandbox.create(policy, timeout=600)    # the zygotes, the cgroup pool
    warm.commands.run(["/bin/true"])
    warm.kill()
    before = leaks.settle(tracker, {}, 3)
    own0 = smaps(os.getpid()).get("Pss", 0)
    sbs = []
    t0 = time.monotonic()
    errors: list[str] = []
    try:
        for _ in range(n):
            sbs.append(corral.Sandbox.create(policy, timeout=seconds + 600))
        create_s = time.monotonic() - t0
        print(f"  {mode}: {n} sandboxes created in {create_s:.1f} s", flush=True)
        lat: list[list[float]] = [[] for _ in range(n)]
        late = [0] * n
        start = time.monotonic() + 1.0
        end = start + seconds

        def worker(i: int) -> None:
            sb, k = sbs[i], 0
            while True:
                due = start + i / n + k
                if due >= end:
                    return
                now = time.monotonic()
                if now < due:
                    time.sleep(due - now)
                elif now - due > 1.0:
                    late[i] += 1
                s = time.perf_counter()
                try:
                    r = sb.commands.run(["/bin/true"])
                    if r.exit_code != 0:
                        errors.append(f"sandbox {i}: exit {r.exit_code} {r.stderr[-200:]!r}")
                except Exception as e:  # noqa: BLE001 - counted and reported
                    errors.append(f"sandbox {i}: {type(e).__name__}: {e}"[:300])
                lat[i].append(time.perf_counter() - s)
                k = max(k + 1, int(time.monotonic() - start - i / n) + 1)

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        time.sleep(max(0.0, start + seconds / 2 - time.monotonic()))
        pss = sum(smaps(p).get("Pss", 0) for p, _ in descendants(os.getpid()))
        own = smaps(os.getpid()).get("Pss", 0) - own0
        charge = cgroup_charge(sbs)
        for t in threads:
            t.join()
    finally:
        for sb in sbs:
            try:
                sb.kill()
            except Exception as e:  # noqa: BLE001
                errors.append(f"kill: {type(e).__name__}: {e}"[:300])
        if dns is not None:
            dns.kill()
            dns.wait()
    after = leaks.settle(tracker, before, 30)
    allv = [x for xs in lat for x in xs]
    out = {"mode": mode, "n": n, "seconds": seconds, "create_s": create_s,
           "commands": len(allv), "errors": len(errors), "first_errors": errors[:10],
           "late": sum(late), "p50_ms": pct(allv, 50) * 1e3, "p99_ms": pct(allv, 99) * 1e3,
           "max_ms": max(allv, default=float("nan")) * 1e3,
           "pss_per_sandbox_mb": (pss + own) / n / MB, "cgroup_per_sandbox_mb": charge / n / MB,
           "before": before, "after": after, "grew": leaks.grown(before, after)}
    print(f"== {mode}: {n} sandboxes x {seconds:g} s: {out['commands']} commands, "
          f"{out['errors']} errors, {out['late']} started > 1 s late")
    print(f"  command latency p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms, "
          f"max {out['max_ms']:.1f} ms")
    print(f"  memory per sandbox: PSS {out['pss_per_sandbox_mb']:.2f} MB, cgroup charge "
          f"{out['cgroup_per_sandbox_mb']:.2f} MB")
    for e in errors[:5]:
        print(f"  ERROR {e}")
    leaks.show(before, after)
    leaks.describe(tracker, out["grew"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--modes", default="none,allow")
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("concurrency.py runs as root")
        return 2
    os.environ.setdefault("CORRAL_AUDIT", "0")
    if a.one:
        out = one(a.one, a.n, a.seconds)
        with open(a.json, "w") as f:
            json.dump(out, f)
        return 0
    results, bad = [], False
    for mode in a.modes.split(","):
        tmp = f"/tmp/corral-concurrency-{os.getpid()}-{mode}.json"
        p = subprocess.run([sys.executable, __file__, "--one", mode, "--n", str(a.n),
                            "--seconds", str(a.seconds), "--json", tmp])
        if p.returncode != 0:
            print(f"  {mode}: the supervisor failed (exit {p.returncode})")
            bad = True
            continue
        with open(tmp) as f:
            r = json.load(f)
        os.unlink(tmp)
        results.append(r)
        bad = bad or bool(r["errors"] or r["grew"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "results": results}, f, indent=1)
    print("\nFAILED" if bad else "\nno errors, nothing left")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
