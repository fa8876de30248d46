"""Progress lines for long image work (builds, installs), on a terminal only."""

from __future__ import annotations

import sys
import time


def progress_printer(stream=None, force: bool = False):
    """A callback that prints one line per build step with the time, or None when stderr
    is not a terminal (and not `force`)."""
    stream = stream or sys.stderr
    if not (force or stream.isatty()):
        return None
    start = time.monotonic()

    def say(msg: str) -> None:
        stream.write(f"corral: [{time.monotonic() - start:6.1f}s] {msg}\n")
        stream.flush()
    return say
