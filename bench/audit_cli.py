"""What the audit record costs `corral run` (the spool, docs/audit.md): a paired loop.

    .venv/bin/python bench/audit_cli.py [--rounds 60] [--baseline-cli LAUNCHER] [--aa]
        [--run-args "--net allow --allow-domain example.test"]

Each round runs `corral run -- /bin/true` once per variant, in a shuffled order: with
CORRAL_AUDIT=0, with recording on (the spool), and, given --baseline-cli (another build's
launcher), that build with recording on; given --aa, CORRAL_AUDIT=0 a second time (an
A/A pair: its paired difference is the machine's noise floor). Reports the medians and the median of the paired
differences against CORRAL_AUDIT=0 (the figure to read on a loaded machine). Each variant
has its own temporary state directory.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--baseline-cli", metavar="LAUNCHER")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-args", default="", metavar="ARGS",
                    help="options for corral run (a policy other than the default)")
    ap.add_argument("--aa", action="store_true", help="also CORRAL_AUDIT=0 again (noise)")
    a = ap.parse_args()
    cli = os.path.join(os.path.dirname(sys.executable), "corral")
    state = tempfile.mkdtemp(prefix="corral-audit-bench-")
    base = {k: v for k, v in os.environ.items() if k != "CORRAL_AUDIT"}
    variants = {"CORRAL_AUDIT=0": (cli, dict(base, CORRAL_AUDIT="0")),
                "recorded": (cli, dict(base, CORRAL_AUDIT="1"))}
    if a.aa:
        variants["CORRAL_AUDIT=0 again"] = (cli, dict(base, CORRAL_AUDIT="0"))
    if a.baseline_cli:
        variants["baseline recorded"] = (a.baseline_cli, dict(base, CORRAL_AUDIT="1"))
    for i, (_, env) in enumerate(variants.values()):
        env["CORRAL_STATE_DIR"] = os.path.join(state, str(i))
    times: dict[str, list[float]] = {k: [] for k in variants}
    rng = random.Random(a.seed)

    def once(name: str) -> float:
        argv = [variants[name][0], "run", *a.run_args.split(), "--", "/bin/true"]
        env = variants[name][1]
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        return (time.perf_counter() - t) * 1000

    for name in variants:    # warm-up
        once(name)
    for _ in range(a.rounds):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            times[name].append(once(name))
    off = times["CORRAL_AUDIT=0"]
    print(f"corral run {a.run_args + ' ' if a.run_args else ''}-- /bin/true, {a.rounds} paired rounds (indicative on a loaded host)")
    for name, xs in times.items():
        d = statistics.median(x - y for x, y in zip(xs, off))
        print(f"  {name:20s} median {statistics.median(xs):7.2f} ms   paired vs "
              f"CORRAL_AUDIT=0 {d:+6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
