"""The wasm tier's costs, side by side with the namespace tier and native CPython in one run.

    .venv/bin/python bench/wasm.py [--quick] [--runs N] [--compile] [--json FILE]

  print(1)       `corral run --isolation wasm -- python3 -c 'print(1)'` (compiled module
                 cached) vs `corral run -- python3 -c 'print(1)'` (namespace), alternating,
                 N runs each (default 20, --quick 5): median wall time of the whole command
                 and the ratio (issue 20's goal: wasm at most 3x namespace)
  live command   `sb.commands.run(["python3", "-c", "print(1)"])` in a live sandbox
                 (Sandbox.create) of the wasm tier vs one of the namespace tier,
                 alternating, N runs each: median and ratio
  first compile  (--compile) the module compiled from scratch into a fresh cache directory,
                 as the first run on a host does: wall and CPU seconds
  loop           a pure-Python loop of 10^6 iterations: on wasm (corral run) vs native
                 Debian CPython (/usr/bin/python3, no sandbox); the time of the loop itself,
                 measured inside each interpreter with perf_counter, and the ratio

Figures on a shared, loaded machine are indicative; the ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")
PY = "/usr/bin/python3"
LOOP = ("import time\n"
        "t = time.perf_counter()\n"
        "s = 0\n"
        "for i in range(10 ** 6):\n"
        "    s += i\n"
        "print((time.perf_counter() - t) * 1000)\n")


def wall(argv: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    ms = (time.perf_counter() - t) * 1000
    if p.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({p.returncode}): {p.stderr[-500:]}")
    return ms, p.stdout


def print1(runs: int) -> dict:
    cmds = {"wasm": [CORRAL, "run", "--isolation", "wasm", "--", "python3", "-c", "print(1)"],
            "namespace": [CORRAL, "run", "--", PY, "-c", "print(1)"]}
    for argv in cmds.values():   # warm: the compiled module exists, pages are cached
        wall(argv)
    got = {k: [] for k in cmds}
    for _ in range(runs):
        for k, argv in cmds.items():
            got[k].append(wall(argv)[0])
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"runs": runs, "median_ms": med, "ratio": med["wasm"] / med["namespace"],
            "goal_ratio": 3.0}


def live(runs: int) -> dict:
    import corral

    boxes = {"wasm": corral.Sandbox.create({"isolation": "wasm"}, timeout=600),
             "namespace": corral.Sandbox.create({}, timeout=600)}
    argv = {"wasm": ["python3", "-c", "print(1)"], "namespace": [PY, "-c", "print(1)"]}
    got = {k: [] for k in boxes}
    try:
        for k, sb in boxes.items():   # warm
            sb.commands.run(argv[k])
        for _ in range(runs):
            for k, sb in boxes.items():
                t = time.perf_counter()
                r = sb.commands.run(argv[k])
                got[k].append((time.perf_counter() - t) * 1000)
                if r.verdict != "ok":
                    raise SystemExit(f"live {k}: {r.verdict} {r.stderr[-300:]}")
    finally:
        for sb in boxes.values():
            sb.kill()
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"runs": runs, "median_ms": med, "ratio": med["wasm"] / med["namespace"]}


def first_compile() -> dict:
    from corral.backends.wasm import MODULE_SHA256, WasmBackend
    from corral.backends.wasm_cache import ModuleCache

    module, wt = WasmBackend()._parts()
    with tempfile.TemporaryDirectory() as d:
        cache = ModuleCache(os.path.join(d, "wasm"))
        c0, t0 = time.process_time(), time.perf_counter()
        cache.compile(module, MODULE_SHA256, wt)
        return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def loop(runs: int) -> dict:
    wasm = [CORRAL, "run", "--isolation", "wasm", "--cpu-time", "10m", "--timeout", "10m",
            "--", "python3", "-c", LOOP]
    native = [PY, "-c", LOOP]
    got = {"wasm": [], "native": []}
    for _ in range(runs):
        for k, argv in (("wasm", wasm), ("native", native)):
            got[k].append(float(wall(argv)[1].strip()))
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"runs": runs, "loop_ms": med, "ratio": med["wasm"] / med["native"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--compile", action="store_true", help="time a first compile too")
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = a.runs or (5 if a.quick else 20)
    load0 = [round(x, 2) for x in os.getloadavg()]
    out = {"command": " ".join([".venv/bin/python", "bench/wasm.py", *sys.argv[1:]]),
           "print1": print1(runs), "live": live(runs), "loop": loop(max(3, runs // 4))}
    if a.compile:
        out["first_compile"] = first_compile()
    out["load"] = {"start": load0, "end": [round(x, 2) for x in os.getloadavg()]}
    p, lp = out["print1"], out["loop"]
    lines = [f"print(1): wasm {p['median_ms']['wasm']:.0f} ms, namespace "
             f"{p['median_ms']['namespace']:.0f} ms (median of {p['runs']}): "
             f"{p['ratio']:.2f}x (goal <= {p['goal_ratio']:g}x)",
             f"live command print(1): wasm {out['live']['median_ms']['wasm']:.0f} ms, "
             f"namespace {out['live']['median_ms']['namespace']:.0f} ms: "
             f"{out['live']['ratio']:.2f}x",
             f"10^6-iteration loop: wasm {lp['loop_ms']['wasm']:.0f} ms, native "
             f"{lp['loop_ms']['native']:.0f} ms: {lp['ratio']:.2f}x"]
    if "first_compile" in out:
        fc = out["first_compile"]
        lines.append(f"first compile: {fc['wall_s']:.1f} s wall, {fc['cpu_s']:.1f} s CPU")
    sys.stdout.write("\n".join(lines) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
