"""Every benchmark in one command, then docs/benchmarks.md and its plot regenerated.

    .venv/bin/python bench/all.py            # the full run (~10 min on a quiet 2-core host)
    .venv/bin/python bench/all.py --quick    # about a minute or two: fewer runs, shorter
    .venv/bin/python bench/all.py --only startup,memory --no-peers
    .venv/bin/python bench/all.py --report-only   # regenerate the docs from bench/out/

Sections, each a script of its own writing bench/out/NAME.json and NAME.txt:

  startup     bench/compare.py     corral's tiers vs bare/bwrap/runsc and the npm peers
  throughput  bench/throughput.py  short namespace runs per second at 1/2/8/32 parallel
  memory      bench/memory.py      PSS of one more idle live sandbox (1/10/100 alive)
  idle        bench/idle.py        N idle Sandbox.create sandboxes (200; --quick 50): PSS
                                   each with network none / allow (zygote) / allow (fresh
                                   proxies), and a new sandbox's first proxied request
  network     bench/network.py     the egress proxy: throughput, added latency, storm
  flood       bench/flood.py       1 GiB of output against a 1 MB cap
  wasm        bench/wasm.py        the wasm tier: print(1) vs namespace, a pure-Python
                                   loop vs native CPython, the first compile (not --quick)

Then bench/report.py runs in bench/.venv (matplotlib from requirements/bench.lock,
installed with --require-hashes on first use) and writes docs/benchmarks.md,
docs/benchmarks-startup.png and the README's benchmarks block (the same figures). stderr
gets a line as each section starts and ends. Needs root, as corral's own benchmarks do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
BENCH_VENV = os.path.join(HERE, ".venv")
LOCK = os.path.join(ROOT, "requirements", "bench.lock")
SECTIONS = {
    "startup": "compare.py",
    "throughput": "throughput.py",
    "memory": "memory.py",
    "idle": "idle.py",
    "network": "network.py",
    "flood": "flood.py",
    "wasm": "wasm.py",
}


def git(*a: str) -> str:
    p = subprocess.run(["git", "-C", ROOT, *a], check=False, capture_output=True, text=True)
    return p.stdout.strip()


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def progress(line: str) -> None:
    """One line per section on stderr (stdout carries the sections' own output and is
    usually piped to a log): where the run is, and how long each part took."""
    print(f"bench: {line}", file=sys.stderr, flush=True)


def run_section(name: str, quick: bool, no_peers: bool) -> dict:
    argv = [sys.executable, os.path.join(HERE, SECTIONS[name]), "--json",
            os.path.join(OUT, f"{name}.json")]
    if quick:
        argv.append("--quick")
        if name == "network":
            argv += ["--runs", "2"]
    if name == "idle":                  # --n, not --quick: 50 sandboxes on a quick run
        argv = [a for a in argv if a != "--quick"] + (["--n", "50"] if quick else [])
    if name == "wasm" and not quick:    # the module's first compile: ~7 s of CPU
        argv.append("--compile")
    if no_peers and name == "startup":
        argv.append("--no-peers")
    shown = " ".join(["python", os.path.relpath(argv[1], ROOT), *argv[2:]]).replace(
        OUT + "/", "bench/out/")
    print(f"\n=== {name}: {shown}", flush=True)
    t0, l0 = time.monotonic(), loadavg()
    with open(os.path.join(OUT, f"{name}.txt"), "w") as log:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=ROOT, bufsize=1)
        for line in p.stdout:
            sys.stdout.write(line)
            log.write(line)
        rc = p.wait()
    return {"command": shown, "exit": rc, "seconds": round(time.monotonic() - t0, 1),
            "loadavg_start": l0, "loadavg_end": loadavg()}


def bench_python() -> str:
    """bench/.venv's python with matplotlib, created from the hashed lock if needed."""
    py = os.path.join(BENCH_VENV, "bin", "python")
    if os.path.exists(py) and subprocess.run(check=False, args=[py, "-c", "import matplotlib"],
                                             capture_output=True).returncode == 0:
        return py
    print(f"\n=== installing matplotlib into {os.path.relpath(BENCH_VENV, ROOT)} "
          f"(--require-hashes -r {os.path.relpath(LOCK, ROOT)})", flush=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", BENCH_VENV], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--require-hashes", "--only-binary=:all:", "-r", LOCK], check=True)
    return py


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs everywhere (~1-2 min)")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--no-peers", action="store_true", help="no npm install, no peers")
    ap.add_argument("--report-only", action="store_true",
                    help="only regenerate docs/benchmarks.md from bench/out/")
    args = ap.parse_args()
    if os.geteuid() != 0 and not args.report_only:
        print("bench/all.py needs root (corral's cgroups, scratch tmpfs, network allow)",
              file=sys.stderr)
        return 2
    os.makedirs(OUT, exist_ok=True)
    names = list(SECTIONS) if not args.only else [s.strip() for s in args.only.split(",")]
    for n in names:
        if n not in SECTIONS:
            ap.error(f"unknown section {n!r}; known: {', '.join(SECTIONS)}")

    meta_path = os.path.join(OUT, "run.json")
    meta: dict = {}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    if not args.report_only:
        dirty = git("status", "--porcelain", "--", "src")
        meta.update({
            "command": " ".join([".venv/bin/python", "bench/all.py", *sys.argv[1:]]),
            "quick": args.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "commit": git("rev-parse", "--short", "HEAD"),
            "src_dirty": bool(dirty), "host": platform.node(),
        })
        meta.setdefault("sections", {})
        for i, n in enumerate(names, 1):
            progress(f"[{i}/{len(names)}] {n} ({SECTIONS[n]}) started")
            meta["sections"][n] = run_section(n, args.quick, args.no_peers)
            meta["sections"][n]["quick"] = args.quick
            sec = meta["sections"][n]
            progress(f"[{i}/{len(names)}] {n} done in {sec['seconds']:.0f} s"
                     + (f", exit {sec['exit']}" if sec["exit"] else ""))
            with open(meta_path, "w") as f:
                json.dump(meta, f, indent=1)
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        with open(meta_path, "w") as f:
            json.dump(meta, f, indent=1)

    py = bench_python()
    progress("report: docs/benchmarks.md, its plot and the README's benchmarks block")
    print("\n=== report: bench/report.py -> docs/benchmarks.md, docs/benchmarks-startup.png",
          flush=True)
    rc = subprocess.run(check=False, args=[py, os.path.join(HERE, "report.py")], cwd=ROOT).returncode
    failed = [n for n, s in meta.get("sections", {}).items() if s.get("exit")]
    if failed:
        print(f"sections that exited nonzero: {', '.join(failed)}", file=sys.stderr)
    return rc or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
