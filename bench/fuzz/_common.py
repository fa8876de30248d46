"""What every atheris target of bench/fuzz/ shares (docs/reliability.md, "Fuzzing").

A target is a function of one bytes input that returns, or raises only what its parser
documents (the target catches that); anything else is a crash atheris reports with the
input that made it. Run a target with atheris (a separate venv, see the docs):

    /tmp/atheris-venv/bin/python bench/fuzz/fuzz_tls.py -max_total_time=600 corpus/tls/

or without atheris, as a smoke run of random inputs (what tests/fuzz/test_fuzz_atheris.py
does for each target):

    .venv/bin/python bench/fuzz/fuzz_tls.py --smoke 2000

The repository's src/ and its .venv's site-packages (h11, starlette: the same CPython
3.11) are put on sys.path, so the atheris venv needs atheris only.
"""

from __future__ import annotations

import glob
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def paths() -> None:
    for p in [os.path.join(ROOT, "src"),
              *glob.glob(os.path.join(ROOT, ".venv", "lib", "python3.*", "site-packages"))]:
        if p not in sys.path:
            sys.path.append(p)


paths()


class Input:
    """A cursor over the fuzzer's bytes (a small FuzzedDataProvider that needs no atheris)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def rest(self) -> bytes:
        return self.take(len(self.data))

    def cuts(self, data: bytes) -> list[bytes]:
        """`data` in pieces, at points the input chooses."""
        pieces, at = [], 0
        for _ in range(self.byte() % 8):
            step = 1 + self.byte() * 7 % max(1, len(data) or 1)
            if at + step >= len(data):
                break
            pieces.append(data[at:at + step])
            at += step
        pieces.append(data[at:])
        return [p for p in pieces if p]


def run(target, argv: list[str] | None = None) -> None:
    """`--smoke N [SEED]`: N random inputs without atheris; else hand over to atheris."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) >= 2 and argv[1] == "--smoke":
        n = int(argv[2]) if len(argv) > 2 else 1000
        rnd = random.Random(int(argv[3]) if len(argv) > 3 else 0)
        for _ in range(n):
            target(rnd.randbytes(rnd.randrange(0, 600)))
        print(f"{os.path.basename(argv[0])}: {n} random inputs, no crash")
        return
    import atheris

    atheris.instrument_all()        # coverage of corral's modules, imported by the target
    atheris.Setup(argv, target)
    atheris.Fuzz()
