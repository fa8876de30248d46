"""A 1 GB output flood against a 1 MB output cap: wall time and the supervisor's peak RSS.

    .venv/bin/python bench/flood.py [--quick] [--runs N] [--json FILE]

The command is `head -c 1G /dev/zero` (1 GiB on stdout). Each sample runs in a fresh
child process of this script, so that its peak RSS is the supervisor's own:

  corral.run   a child Python imports corral and calls corral.run(cmd) with
               limits.output = "1M" (namespace tier); it reports its wall time and
               VmHWM (/proc/self/status) after the run
  cli          `.venv/bin/corral run --output-limit 1M -- cmd`, stdout to /dev/null;
               peak RSS = ru_maxrss from wait4 (the largest of the CLI and its reaped
               descendants: bwrap and head are far smaller than the interpreter)
  bwrap        the floor: a child Python (with corral imported, so the interpreter is
               the same size) runs the raw bwrap argv of bench/startup.py with stdout on
               a pipe it reads and drops in 64 KiB reads; VmHWM as above

Variants alternate; the figure is the median of --runs (default 3, --quick 1).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CMD = ["/usr/bin/head", "-c", "1G", "/dev/zero"]
CAP = "1M"
HERE = os.path.dirname(os.path.abspath(__file__))

CHILD_CORRAL = r"""
import json, sys, time
import corral
t = time.perf_counter()
r = corral.run(CMD, policy={"limits": {"output": CAP}})
wall = time.perf_counter() - t
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"wall_s": wall, "peak_rss_kib": int(hwm), "verdict": r.verdict,
                  "exit_code": r.exit_code, "stdout_len": len(r.stdout),
                  "stdout_truncated": r.stdout_truncated, "events": r.events}))
"""

CHILD_BWRAP = r"""
import json, os, subprocess, sys, time
sys.path.insert(0, HERE)
import startup
b = startup.Bench(use_runsc=False)
os.lseek(b.seccomp_fd, 0, os.SEEK_SET)
kw = {"user": b.uid, "group": b.gid, "extra_groups": []} if b.switch_user else {}
t = time.perf_counter()
p = subprocess.Popen(b.bwrap_prefix + ["--", *CMD], env=b.env, pass_fds=(b.seccomp_fd,),
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, **kw)
n = 0
fd = p.stdout.fileno()
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    n += len(chunk)
rc = p.wait()
wall = time.perf_counter() - t
b.close()
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"wall_s": wall, "peak_rss_kib": int(hwm), "exit_code": rc, "bytes": n}))
"""


def prelude() -> str:
    return f"CMD = {CMD!r}\nCAP = {CAP!r}\nHERE = {HERE!r}\n"


def child_py(code: str) -> dict:
    p = subprocess.run([sys.executable, "-c", prelude() + code], check=False, capture_output=True,
                       text=True, timeout=600)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"exit {p.returncode}: {p.stderr.strip()[-500:]}"}


def cli() -> dict:
    corral = os.path.join(os.path.dirname(sys.executable), "corral")
    t = time.perf_counter()
    with open(os.devnull, "wb") as null:
        p = subprocess.Popen([corral, "run", "--output-limit", CAP, "--", *CMD],
                             stdout=null, stderr=subprocess.PIPE)
        err = p.stderr.read()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    r = {"wall_s": wall, "peak_rss_kib": ru.ru_maxrss, "exit_code": p.returncode}
    if p.returncode != 0:
        r["error"] = f"exit {p.returncode}: {err.decode(errors='replace')[-300:]}"
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    variants = {"corral.run": lambda: child_py(CHILD_CORRAL), "cli": cli,
                "bwrap": lambda: child_py(CHILD_BWRAP)}
    names = list(variants)
    raw: dict[str, list[dict]] = {v: [] for v in names}
    for rnd in range(runs):
        k = rnd % len(names)
        for v in names[k:] + names[:k]:
            res = variants[v]()
            raw[v].append(res)
            print(f"  {v:10} {json.dumps(res)[:300]}", file=sys.stderr, flush=True)
    summary = {}
    for v, xs in raw.items():
        ok = [x for x in xs if "error" not in x]
        if not ok:
            summary[v] = {"error": xs[-1].get("error")}
            continue
        summary[v] = {"n": len(ok), "wall_s": statistics.median(x["wall_s"] for x in ok),
                      "peak_rss_mb": max(x["peak_rss_kib"] for x in ok) / 1024,
                      "gb_per_s": (1 << 30) / 1e9 / statistics.median(x["wall_s"] for x in ok)}
    base = summary.get("bwrap", {})
    for v, s in summary.items():
        if "wall_s" in s and "wall_s" in base:
            s["wall_ratio_to_bwrap"] = s["wall_s"] / base["wall_s"]
            s["rss_ratio_to_bwrap"] = s["peak_rss_mb"] / base["peak_rss_mb"]
    c = raw["corral.run"][-1]
    print(f"\n{' '.join(CMD)} with limits.output = {CAP}, median of {runs}")
    for v, s in summary.items():
        if "error" in s:
            print(f"  {v:10} failed: {s['error']}")
        else:
            print(f"  {v:10} wall {s['wall_s']:6.2f} s ({s['gb_per_s']:.2f} GB/s, "
                  f"{s.get('wall_ratio_to_bwrap', 0):.2f}x bwrap)  peak RSS "
                  f"{s['peak_rss_mb']:6.1f} MB ({s.get('rss_ratio_to_bwrap', 0):.2f}x bwrap)")
    if "verdict" in c:
        print(f"  corral.run result: verdict {c['verdict']}, exit {c['exit_code']}, stdout "
              f"kept {c['stdout_len']} chars, truncated {c['stdout_truncated']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": CMD, "cap": CAP, "runs": runs, "summary": summary,
                       "raw": raw, "self_rusage_maxrss_kib":
                       resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
