"""Where `corral run` spends its import time: `python -X importtime`, sorted by cumulative.

    .venv/bin/python bench/imports.py [--top 25] [--runs 5] [-- CMD...]

Runs the venv's own `corral` launcher script under `-X importtime`, with the interpreter
and flags of its #! line (so `-I` and the like count), as `corral run -- /bin/true` (or
CMD); the imports made lazily inside `main()` (the sandbox, the backend, seccomp, ...) are
counted too. If the launcher is not a Python script, `python -c "from corral.cli import
main; ..."` stands in for it. One warm-up run (to write .pyc files), then --runs measured runs; each module's
self and cumulative times are the medians over those runs. Times are in ms.

`depth` is the nesting level printed by -X importtime: 0 is an import made by the
top-level code, deeper ones were imported by the module above them, so cumulative times
of different depths overlap and do not add up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

# Stands in for the launcher when that is not a Python script.
ENTRY = "import sys; from corral.cli import main; sys.argv[0] = 'corral'; sys.exit(main())"


def launcher_argv(python: str) -> list[str]:
    """How to start `corral` under -X importtime: the launcher's #! interpreter and flags,
    -X importtime, the launcher itself."""
    launcher = os.path.join(os.path.dirname(python), "corral")
    try:
        with open(launcher, "rb") as f:
            first = f.readline().decode(errors="replace")
    except OSError:
        first = ""
    if first.startswith("#!"):
        interp, *flags = first[2:].split()
        if os.path.basename(interp).startswith("python"):
            return [interp, *flags, "-X", "importtime", launcher]
    return [python, "-X", "importtime", "-c", ENTRY]


def run_once(start_argv: list[str], cmd: list[str]) -> tuple[list[tuple[str, int, int, int]],
                                                             float]:
    """[(module, depth, self_us, cumulative_us)] in import order, and the process wall ms."""
    argv = [*start_argv, "run", "--", *cmd]
    start = time.perf_counter()
    p = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = (time.perf_counter() - start) * 1000
    if p.returncode != 0:
        tail = "\n".join(line for line in p.stderr.splitlines()
                         if not line.startswith("import time:"))
        raise SystemExit(f"corral run exited {p.returncode}:\n{tail}")
    rows = []
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "[us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append((name.strip(), depth, int(self_us), int(cum_us)))
    return rows, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25, help="modules to show (default 25)")
    ap.add_argument("--runs", type=int, default=5, help="measured runs (default 5)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter of corral's venv (default: this one)")
    ap.add_argument("cmd", nargs="*", default=["/bin/true"],
                    help="what `corral run` runs (default /bin/true); put it after --")
    args = ap.parse_args()

    start_argv = launcher_argv(args.python)
    run_once(start_argv, args.cmd)  # warm-up: .pyc files written, page cache warm
    selfs: dict[str, list[int]] = {}
    cums: dict[str, list[int]] = {}
    depth: dict[str, int] = {}
    walls, totals = [], []
    for _ in range(max(args.runs, 1)):
        rows, wall = run_once(start_argv, args.cmd)
        walls.append(wall)
        totals.append(sum(c for _, d, _, c in rows if d == 0))
        for name, d, s, c in rows:
            selfs.setdefault(name, []).append(s)
            cums.setdefault(name, []).append(c)
            depth.setdefault(name, d)

    med = {n: (statistics.median(selfs[n]) / 1000, statistics.median(cums[n]) / 1000)
           for n in cums}
    corral_self = sum(s for n, (s, _) in med.items() if n == "corral" or n.startswith("corral."))
    print(" ".join(start_argv + ["run", "--", *args.cmd]))
    print(f"{len(walls)} runs after 1 warm-up; medians.  process wall "
          f"{statistics.median(walls):.1f} ms; all imports (sum of depth-0 cumulative) "
          f"{statistics.median(totals) / 1000:.1f} ms; corral's own modules (self) "
          f"{corral_self:.1f} ms; {len(med)} modules\n")
    print(f"{'cumul ms':>9} {'self ms':>8} {'depth':>5}  module")
    for name, (s, c) in sorted(med.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{c:9.2f} {s:8.2f} {depth[name]:5}  {'  ' * depth[name]}{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
