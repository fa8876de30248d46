"""Soak: many sequential corral.run calls of a mix of kinds, then nothing may be left.

    .venv/bin/python bench/soak.py [--runs 10000] [--tier T] [--json FILE] [--until HH:MM]

Runs as root from the repository root. For each tier asked for (default: namespace,
gvisor, process and wasm where this host has them; microvm only with `--tier microvm`),
one supervisor (this process) makes `--runs` corral.run calls back to back, cycling
through the kinds below (each kind a tier refuses, with UnsupportedRule or
BackendUnavailable on its first try, is dropped from that tier's mix and listed):

  true      /bin/true, default policy
  python    /usr/bin/python3 -c "print(6*7)"
  fork      sh: a background child, a double-forked setsid daemon (sleep 30) left behind,
            and a foreground child: the daemon must not outlive the run
  timeout   python sleeping 30 s under limits.timeout = 0.3s: verdict "timeout"
  oom       python allocating 1 GB under limits.memory = 64M: verdict "oom"
  net       network.mode = "allow" for soak.test (a real HTTP server on a loopback /24 of
            its own, allow_private for it, names from a local dnsmasq): urllib GET through
            the sandbox's egress proxy
  secret    the same with a secret grant (plain_http) for soak.test: the proxy puts the
            value into the Authorization header; the server checks it arrived
  review    filesystem.workspace mode "review" on a directory of the host: the command
            writes a file, which must not reach the host

Every run's Result is checked (verdict and output as above); a wrong one counts as an
error (the first few are printed). Before the loop (after one warm-up run of each kind)
and after it, bench/leaks.py counts what this supervisor made and left: processes of
its sandbox uids and below it, proxies (not the zygote), runsc and QEMU processes, mounts
and idmapped mounts under corral's run directory, cgroups below corral's parents (v1
memory/pids/cpu hierarchies and v2) named after its runs, run directories and registry
entries, and its own fds. Both columns are printed; the exit status is 1 if any grew (or
any run was wrong).

Speed: runs/s and p50/p99 latency of each kind; beside them p99/p50 of the "calm" runs
only, those during which tasks waited for a CPU (the kernel's CPU pressure, /proc/pressure/
cpu "some") for less than CALM of the run's wall time, so that a tail from the machine's
other work can be told from corral's own; and the collections of Python's cyclic garbage
collector that fell inside timed runs (count and milliseconds, by generation). On the namespace tier each `true` run is
followed by the same command under raw bwrap (bench/startup.py's argv: corral's own bwrap
line and seccomp program, same uid) in the same loop, so the two share the machine's
load: the ratio is `true` runs/s of corral.run over raw bwrap's. Goals (issue 23):
namespace >= 0.95x raw bwrap on `true`, and each kind's p99 <= 1.5x its own p50.
"""

from __future__ import annotations

import argparse
import gc
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "fixtures"))

import leaks  # noqa: E402  (before corral's tiers: it wraps the uid pickers)

TRACKER = leaks.Tracker().install()

import corral  # noqa: E402
from corral.errors import BackendUnavailable, UnsupportedRule  # noqa: E402

PY = "/usr/bin/python3"
TIERS = ("namespace", "gvisor", "process", "wasm")
KINDS = ("true", "python", "fork", "timeout", "oom", "net", "secret", "review")
TOKEN = "soak-secret-7f3a9c0e55d14b2b"
GOAL_RATIO = 0.95
GOAL_TAIL = 1.5
#: a run is "calm" if tasks waited for a CPU for less than this share of its wall time
CALM = 0.3
PSI_CPU = "/proc/pressure/cpu"
NET = "127.{}.{}".format(*os.urandom(2))
SRV = f"{NET}.2"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/secret":
            ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
            body = b"granted" if ok else b"no-grant"
        else:
            body = b"soak-ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_world():
    """The HTTP server on SRV:80 and a dnsmasq answering soak.test with it."""
    from netfix import start_dnsmasq

    srv = http.server.ThreadingHTTPServer((SRV, 80), _Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    dns, port = start_dnsmasq({"soak.test": SRV})
    return srv, dns, port


def kinds_for(tier: str, dns_port: int, ws: str, image: str | None = None) -> dict:
    """kind -> (argv, policy, check(Result) -> problem or None)."""
    net = {"mode": "allow", "allow": ["soak.test"], "allow_private": [f"{NET}.0/24"],
           "nameservers": [f"127.0.0.1:{dns_port}"]}
    get = ("import os, urllib.request as u; "
           "print(u.urlopen('http://soak.test/{}', timeout=20).read().decode())")

    def ok_out(want):
        def check(r):
            if r.verdict != "ok" or r.exit_code != 0 or want not in r.stdout:
                return f"verdict {r.verdict} exit {r.exit_code} out {r.stdout[-200:]!r} " \
                       f"err {r.stderr[-300:]!r}"
            return None
        return check

    def verdict(want):
        def check(r):
            return None if r.verdict == want else \
                f"verdict {r.verdict}, wanted {want}: {r.stderr[-200:]!r}"
        return check

    def review_check(r):
        bad = ok_out("wrote")(r)
        if bad:
            return bad
        return "review write reached the host" if os.listdir(ws) != ["keep.txt"] else None

    base = {"isolation": tier, "limits": {"timeout": "60s"}}
    if image:
        base["image"] = image
    fork = ("(sleep 0.01 &); (setsid sleep 30 > /dev/null 2>&1 &); "
            f"{PY} -c 'import os; pid = os.fork(); os._exit(0) if pid == 0 else "
            "os.waitpid(pid, 0); print(\"forked\")'")
    return {
        "true": (["/bin/true"], base, ok_out("")),
        "python": ([PY, "-c", "print(6*7)"], base, ok_out("42")),
        "fork": (["/bin/sh", "-c", fork], base, ok_out("forked")),
        "timeout": ([PY, "-c", "import time; time.sleep(30)"], {**base, "limits": {"timeout": "0.3s"}},
                    verdict("timeout")),
        "oom": ([PY, "-c", "b = bytearray(1 << 30); print('allocated')"],
                {**base, "limits": {"timeout": "60s",
                                    "memory": "256M" if tier == "microvm" else "64M"}},
                verdict("oom")),
        "net": ([PY, "-c", get.format("plain")], {**base, "network": net}, ok_out("soak-ok")),
        "secret": ([PY, "-c", "import os, urllib.request as u; print(u.urlopen(u.Request("
                    "'http://soak.test/secret', headers={'Authorization': 'Bearer ' + "
                    "os.environ['SOAK_TOKEN']}), timeout=20).read().decode())"],
                   {**base, "network": net,
                    "secrets": {"SOAK_TOKEN": {"value": TOKEN, "hosts": ["soak.test"],
                                               "plain_http": True}}},
                   ok_out("granted")),
        "review": (["/bin/sh", "-c", "echo x > /workspace/new.txt && cat keep.txt && "
                    "echo wrote"],
                   {**base, "filesystem": {"workspace": {"path": ws, "mode": "review"}}},
                   review_check),
    }


def cpu_stall_us() -> int | None:
    """The kernel's total of microseconds some task waited for a CPU (PSI), or None."""
    try:
        with open(PSI_CPU) as f:
            return int(f.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


class GcTimes:
    """The cyclic collector's collections while `on` (count and ms by generation)."""

    def __init__(self) -> None:
        self.on = False
        self.start = 0
        self.by_gen: dict[int, list[float]] = {}

    def __call__(self, phase, info) -> None:
        if phase == "start":
            self.start = time.perf_counter_ns()
        elif self.on:
            self.by_gen.setdefault(info["generation"], []).append(
                (time.perf_counter_ns() - self.start) / 1e6)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def soak_tier(tier: str, runs: int, dns_port: int, raw, image: str | None = None,
              until: float | None = None) -> dict:
    ws = tempfile.mkdtemp(prefix="corral-soak-ws-", dir="/var/tmp")
    os.chmod(ws, 0o755)
    with open(os.path.join(ws, "keep.txt"), "w") as f:
        f.write("kept\n")
    os.chmod(os.path.join(ws, "keep.txt"), 0o644)
    mix = kinds_for(tier, dns_port, ws, image)
    dropped: dict[str, str] = {}
    errors: list[str] = []
    lat: dict[str, list[float]] = {k: [] for k in mix}
    calm: dict[str, list[float]] = {k: [] for k in mix}
    raw_lat: list[float] = []
    raw_calm: list[float] = []
    gct = GcTimes()
    gc.callbacks.append(gct)
    try:
        for kind in list(mix):          # the warm-up: one of each, and what the tier refuses
            argv, policy, check = mix[kind]
            try:
                r = corral.run(argv, policy)
            except (UnsupportedRule, BackendUnavailable) as e:
                dropped[kind] = str(e).splitlines()[0][:160]
                del mix[kind], lat[kind]
                continue
            bad = check(r)
            if bad:
                errors.append(f"warm-up {kind}: {bad}")
        if raw:
            raw(["/bin/true"])
        if not mix:
            return {"tier": tier, "skipped": dropped}
        before = leaks.settle(TRACKER, {}, 3)
        order = list(mix)
        t0 = time.monotonic()
        done = 0
        for i in range(runs):
            if until is not None and time.time() >= until:
                print(f"  {tier}: stopped at the --until time after {i} of {runs} runs",
                      flush=True)
                break
            done = i + 1
            kind = order[i % len(order)]
            argv, policy, check = mix[kind]
            stall = cpu_stall_us()
            gct.on = True
            s = time.perf_counter()
            try:
                r = corral.run(argv, policy)
            except Exception as e:  # noqa: BLE001 - counted and reported
                r, bad = None, f"{type(e).__name__}: {e}"[:300]
            took = time.perf_counter() - s
            gct.on = False
            if r is not None:
                try:
                    bad = check(r)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    bad = f"check: {type(e).__name__}: {e}"[:300]
            lat[kind].append(took)
            if _calm(stall, took):
                calm[kind].append(took)
            if bad:
                errors.append(f"run {i} {kind}: {bad}")
                if len(errors) <= 5:
                    print(f"  ERROR {errors[-1]}", flush=True)
            if raw and kind == "true":
                stall = cpu_stall_us()
                s = time.perf_counter()
                try:
                    raw(["/bin/true"])
                except Exception as e:  # noqa: BLE001
                    errors.append(f"raw bwrap: {e}"[:300])
                raw_lat.append(time.perf_counter() - s)
                if _calm(stall, raw_lat[-1]):
                    raw_calm.append(raw_lat[-1])
            if (i + 1) % 500 == 0:
                print(f"  {tier}: {i + 1}/{runs} runs, {len(errors)} errors, "
                      f"{(i + 1) / (time.monotonic() - t0):.1f} runs/s", flush=True)
        wall = time.monotonic() - t0
        runs = done
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        if gct in gc.callbacks:
            gc.callbacks.remove(gct)
    after = leaks.settle(TRACKER, before)
    print(f"\n== {tier}: {runs} runs in {wall:.1f} s ({runs / wall:.1f} runs/s, raw bwrap "
          f"runs not counted), {len(errors)} errors")
    if dropped:
        for k, why in dropped.items():
            print(f"  not in this tier's mix: {k}: {why}")
    grew = leaks.show(before, after)
    leaks.describe(TRACKER, grew)
    per_kind = {}
    print(f"  {'kind':10} {'runs':>6} {'runs/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'p99/p50':>8} {'calm':>5} {'p99/p50':>8}")
    rows = [(k, v, calm[k]) for k, v in lat.items() if v]
    if raw_lat:
        rows.append(("raw bwrap", raw_lat, raw_calm))
    for k, v, c in rows:
        p50, p99 = pct(v, 50) * 1e3, pct(v, 99) * 1e3
        per_kind[k] = {"runs": len(v), "runs_per_s": len(v) / sum(v), "p50_ms": p50,
                       "p99_ms": p99, "tail": p99 / p50, "calm_runs": len(c),
                       "calm_tail": pct(c, 99) / pct(c, 50) if c else None}
        calm_tail = f"{pct(c, 99) / pct(c, 50):8.2f}" if c else f"{'-':>8}"
        print(f"  {k:10} {len(v):6} {len(v) / sum(v):8.1f} {p50:8.2f} {p99:8.2f} "
              f"{p99 / p50:8.2f} {len(c):5} {calm_tail}"
              + ("  > goal 1.5" if p99 / p50 > GOAL_TAIL else ""))
    print(f"  (calm: runs during which tasks waited for a CPU less than {CALM:.0%} of the "
          f"time, {PSI_CPU})")
    gcs = {g: {"n": len(v), "ms": sum(v), "max_ms": max(v)} for g, v in
           sorted(gct.by_gen.items())}
    print("  gc collections inside timed runs: " + (", ".join(
        f"gen {g}: {x['n']} ({x['ms']:.1f} ms, max {x['max_ms']:.1f})" for g, x in gcs.items())
        or "none"))
    out = {"tier": tier, "runs": runs, "wall_s": wall, "errors": len(errors),
           "first_errors": errors[:10], "dropped": dropped, "before": before,
           "after": after, "grew": grew, "kinds": per_kind, "gc": gcs}
    if raw_lat and "true" in per_kind:
        ratio = per_kind["true"]["runs_per_s"] / per_kind["raw bwrap"]["runs_per_s"]
        out["true_vs_raw_bwrap"] = ratio
        print(f"  true: corral.run {ratio:.2f}x raw bwrap's runs/s (goal >= {GOAL_RATIO})")
    return out


def raw_bwrap(bench):
    """bench/startup.py's raw bwrap (its argv, seccomp program and uid) as a function of
    argv, as its Bench.bwrap() ran it before it made this process a subreaper: the init
    bwrap leaves goes to the host's init, as in the earlier soaks. (Bench.bwrap() now
    leaves it to this process, to be reaped by Bench.reap_orphans(), which waits for every
    child, the dnsmasq here too; without it each raw run left a zombie.)"""
    import startup

    kw = ({"user": bench.uid, "group": bench.gid, "extra_groups": []}
          if bench.switch_user else {})

    def raw(argv: list[str]) -> None:
        os.lseek(bench.seccomp_fd, 0, os.SEEK_SET)   # bwrap reads from the current offset
        startup.run_checked(bench.bwrap_prefix + ["--", *argv], env=bench.env,
                            pass_fds=(bench.seccomp_fd,), **kw)
    return raw


def _calm(stall_before: int | None, took: float) -> bool:
    after = cpu_stall_us()
    if stall_before is None or after is None:
        return False
    return (after - stall_before) / 1e6 < CALM * took


def _until(hhmm: str) -> float:
    """The epoch time of HH:MM UTC today."""
    import calendar

    h, m = (int(x) for x in hhmm.split(":"))
    day = time.gmtime()
    return calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, h, m, 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--tier", action="append", choices=TIERS + ("microvm",),
                    help="this tier only (repeatable); default: every available one but microvm")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--until", help="stop each tier's loop at this UTC time (HH:MM, today): "
                    "the runs done by then are the ones counted and checked for leaks")
    ap.add_argument("--image", help="run every kind on this image (the microvm tier needs "
                    "one; CORRAL_STATE_DIR names its store)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("soak.py runs as root (sandbox uids, cgroups, the run directory)")
        return 2
    until = _until(a.until) if a.until else None
    os.environ.setdefault("CORRAL_AUDIT", "0")
    srv, dns, dns_port = start_world()
    results = []
    try:
        for tier in a.tier or TIERS:
            raw = None
            if tier == "namespace":
                import startup
                bench = startup.Bench(use_runsc=False)
                raw = raw_bwrap(bench)
            try:
                results.append(soak_tier(tier, a.runs, dns_port, raw, a.image, until))
            finally:
                if raw:
                    bench.close()
    finally:
        dns.kill()
        dns.wait()
        srv.shutdown()
    failed = [r["tier"] for r in results if r.get("grew") or r.get("errors")]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "results": results}, f, indent=1)
    print("\nFAILED: " + ", ".join(failed) if failed else "\nnothing leaked, no errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
