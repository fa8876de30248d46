"""The atheris targets of bench/fuzz/ (docs/reliability.md, "Fuzzing"), each run on a few
hundred random inputs without atheris, so a target that no longer imports or whose
invariant no longer holds on plain input shows up here before a long local run."""

from __future__ import annotations

import importlib
import os
import random
import shutil
import sys

import pytest

BENCH_FUZZ = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench", "fuzz")
TARGETS = sorted(n[:-3] for n in os.listdir(BENCH_FUZZ) if n.startswith("fuzz_")
                 and n.endswith(".py"))


def test_there_is_a_target_per_parser():
    assert set(TARGETS) >= {"fuzz_policy", "fuzz_hosts", "fuzz_tls", "fuzz_conn",
                            "fuzz_scrubber", "fuzz_archive", "fuzz_microvm", "fuzz_runner",
                            "fuzz_supervisor", "fuzz_connect", "fuzz_spool", "fuzz_api"}


@pytest.mark.parametrize("name", TARGETS)
def test_target_survives_random_inputs(name):
    if BENCH_FUZZ not in sys.path:
        sys.path.insert(0, BENCH_FUZZ)
    mod = importlib.import_module(name)
    try:
        rnd = random.Random(name)
        n = 15 if name in ("fuzz_archive", "fuzz_spool", "fuzz_scrubber") else 100
        for _ in range(n):
            mod.one_input(rnd.randbytes(rnd.randrange(0, 600)))
    finally:
        top = getattr(mod, "TOP", None)
        if top:
            shutil.rmtree(top, ignore_errors=True)
