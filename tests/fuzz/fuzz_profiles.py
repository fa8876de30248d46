"""Hypothesis settings for the property tests of tests/fuzz/ (docs/reliability.md, "Fuzzing"),
loaded by strategies.py, which every property test imports. (Not a conftest.py: the other
folders' tests import tests/conftest.py as `conftest`, and a second one would shadow it.)

Two profiles, chosen by CORRAL_FUZZ (default "ci"):

- ``ci``: the default suite's budget. Few examples per property and a per-example deadline,
  derandomized (the same examples on every run: a red CI run is a real regression, never
  luck) and no example database (nothing written into the checkout). The whole folder
  takes well under a minute on the 2-core CI box.
- ``long``: for local runs (``CORRAL_FUZZ=long``): many more examples, random each run,
  no deadline, failures kept in .hypothesis/ and replayed first on the next run.

A failure prints the falsifying example; it goes on the property as ``@example(...)``
(or becomes a plain test beside it), and the fix goes in with it.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

_SLOW_BOX = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci", max_examples=int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "60")),
    deadline=timedelta(seconds=5), derandomize=True, database=None,
    suppress_health_check=_SLOW_BOX, print_blob=True)
settings.register_profile(
    "long", max_examples=int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "5000")),
    deadline=None, suppress_health_check=_SLOW_BOX, print_blob=True)
_PROFILE = os.environ.get("CORRAL_FUZZ", "ci")
if _PROFILE not in ("ci", "long"):
    raise RuntimeError(f"CORRAL_FUZZ={_PROFILE!r}: use \"ci\" (the default) or \"long\"")
settings.load_profile(_PROFILE)
