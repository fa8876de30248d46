"""Two corral builds' live-sandbox commands, interleaved command by command.

    .venv/bin/python bench/live_ab.py --baseline OLD/src [--runs 100]

OLD/src: another checkout's `src` (e.g. `git archive main src | tar -x -C OLD`). Each build
runs in a process of its own (its zygote warmed first, as corral serve does) with one
namespace-tier sandbox; the parent asks them in turn for one timed command each (the
order swapped every round), so the machine's load hits both alike, which separate runs
of bench/live.py on a busy machine do not. Medians in ms, and the calling thread's CPU
time (`_cpu`); `tree_cpu`: all the CPU each build's processes used (the process, its
zygote, the entrants and commands the zygote reaped; the sandbox's start too) over the
commands run:

  sh_true    commands.run("true") after a 20 ms pause (/bin/sh -c "true", or its program)
  sh_forced  ["/bin/sh", "-c", "true", "/bin/sh"]: always the shell
  true       commands.run(["true"]) after a 20 ms pause
  b2b        commands.run(["true"]) right after another command, no pause
  ls         commands.run("ls /") after a 20 ms pause
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _interleave import GAP_S, Sides, answer  # noqa: E402

KINDS = {"sh_true": "true", "sh_forced": ["/bin/sh", "-c", "true", "/bin/sh"],
         "true": ["true"], "b2b": ["true"], "ls": "ls /"}


def child(src: str) -> None:
    sys.path.insert(0, src)
    import corral
    from corral.linux import enter

    enter.warm()
    sb = corral.Sandbox.create(timeout=3600)
    try:
        for _ in range(5):
            sb.commands.run("true")
            time.sleep(GAP_S)

        def timed(kind: str) -> str:
            if kind == "b2b":
                sb.commands.run(["true"])
            c, t = time.thread_time(), time.perf_counter()
            r = sb.commands.run(KINDS[kind])
            dt, dc = time.perf_counter() - t, time.thread_time() - c
            if r.exit_code != 0:
                raise SystemExit(f"{kind}: {r}")
            return json.dumps([dt, dc])

        answer({kind: (lambda k=kind: timed(k)) for kind in KINDS})
    finally:
        sb.kill()
    # all the CPU this build used, every process of it: this one, its zygote and what
    # the zygote reaped (the entrants and the commands), counted once the zygote exits
    enter._close_at_exit()
    for z in enter._zygote_now:
        os.waitpid(z.pid, 0)
    import resource

    used = sum(getattr(resource.getrusage(who), f) for who in
               (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
    print(json.dumps(["cpu", used]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, metavar="SRC")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    builds = {"baseline": os.path.abspath(a.baseline),
              "this": os.path.join(os.path.dirname(HERE), "src")}
    sides = Sides({k: [sys.executable, __file__, "--baseline", "-", "--child", v]
                   for k, v in builds.items()})
    load = os.getloadavg()
    samples: dict[tuple[str, str], list[float]] = {}
    for i in range(a.runs):
        for kind in KINDS:
            for name in sides.order(i):
                dt, dc = json.loads(sides.ask(name, kind))
                samples.setdefault((kind, name), []).append(dt)
                samples.setdefault((kind + "_cpu", name), []).append(dc)
    tree = {}
    for name, p in sides.procs.items():   # "q" ends its loop; then its CPU in all
        p.stdin.write("q\n")
        p.stdin.flush()
        tree[name] = json.loads(p.stdout.readline())[1]
    sides.close()
    print(f"{a.runs} runs each, interleaved; load average {load[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")
    print(f"{'median ms':14}{'baseline':>10}{'this':>10}")
    for kind in (k for kk in KINDS for k in (kk, kk + "_cpu")):
        print(f"{kind:14}" + "".join(f"{statistics.median(samples[(kind, n)]) * 1000:10.2f}"
                                      for n in builds))
    calls = a.runs * (len(KINDS) + 1) + 5     # b2b makes two calls
    print(f"{'tree_cpu':14}" + "".join(f"{tree[n] / calls * 1000:10.2f}" for n in builds)
          + "   (ms a command: every process of the build, its start and end included)")


if __name__ == "__main__":
    main()
