"""Two builds side by side, call by call: what bench/live_ab.py and
bench/service_interleaved.py share.

Each build runs in a child process of its own (`Sides` starts them from their argv and
waits for each to print "ready"); the parent asks them in turn for one call each (`ask`:
a line with the call's kind, answered with one line), in an order that changes every round
(`order`), so a load spike on the machine hits both builds alike. A child answers with
`answer(calls)`: after the same pause before each call, one line of what the call returned.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable

#: the pause before each call (an agent thinks between calls), the same on both sides
GAP_S = 0.02


class Sides:
    """The builds' child processes, by name, each up and ready."""

    def __init__(self, argvs: dict[str, list[str]],
                 envs: dict[str, dict[str, str]] | None = None) -> None:
        """`envs`: each side's environment, by name (default: this process's)."""
        self.procs = {name: subprocess.Popen(argv, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True,
                                             env=(envs or {}).get(name))
                      for name, argv in argvs.items()}
        for name, p in self.procs.items():
            if p.stdout.readline().strip() != "ready":
                self.close()
                raise SystemExit(f"the {name} side did not come up")

    def order(self, i: int, shuffle: bool = False) -> list[str]:
        """The names in round `i`'s order: swapped every other round, or shuffled."""
        names = list(self.procs)
        if shuffle:
            random.shuffle(names)
            return names
        return names if i % 2 == 0 else names[::-1]

    def ask(self, name: str, kind: str) -> str:
        """One call of `kind` on side `name`: its answer line."""
        p = self.procs[name]
        p.stdin.write(kind + "\n")
        p.stdin.flush()
        return p.stdout.readline()

    def close(self, timeout: float = 120) -> None:
        """Each side told to quit, and waited for."""
        for p in self.procs.values():
            try:
                p.stdin.write("q\n")
                p.stdin.flush()
            except OSError:
                pass
        for p in self.procs.values():
            p.wait(timeout)


def answer(calls: dict[str, Callable[[], str]], gap_s: float = GAP_S) -> None:
    """A side's loop: "ready", then per line of stdin naming a call (anything else ends
    it), the pause, the call, and the line it returns."""
    print("ready", flush=True)
    for line in sys.stdin:
        call = calls.get(line.strip())
        if call is None:
            break
        time.sleep(gap_s)
        print(call(), flush=True)
