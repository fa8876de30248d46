"""The batch's output file (one JSON object per line, appended as each job finishes),
resuming from it, and progress on a terminal.

A line is done, and its job skipped by a re-run with the same output file, when the job
ran (it has a `verdict`, whatever it is) or was refused for itself (an `error` of kind
`policy` or `usage`: the same job would be refused again). A job that was not run (its
node was lost too often, no node offers its tier, a node could not enforce its policy)
is run again. A torn last line (the batch killed mid-write) is ignored and ended with a
newline before anything more is appended.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ..errors import UsageError
from .jobs import id_key

#: error kinds that are the job's own fault: a re-run would be refused again
FINAL_ERRORS = ("policy", "usage")


def is_final(line: dict) -> bool:
    if "verdict" in line:
        return True
    err = line.get("error")
    return isinstance(err, dict) and err.get("kind") in FINAL_ERRORS


def done_ids(path: str) -> set[str]:
    """The id keys (jobs.id_key) of the jobs the output file already has final lines of."""
    done: set[str] = set()
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return done
    except OSError as e:
        raise UsageError(f"cannot read {path!r}: {e.strerror}", field="--out") from None
    with f:
        for raw in f:
            try:
                line = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                continue      # a torn line: its job runs again
            if isinstance(line, dict) and is_final(line):
                key = id_key(line.get("id"))
                if key is not None:
                    done.add(key)
    return done


class Output:
    """Appends result lines to a file, one write each (O_APPEND), never through a link."""

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise UsageError(f"cannot write {path!r}: {e.strerror}", field="--out") from None
        st = os.fstat(self.fd)
        if st.st_size:
            with open(path, "rb") as f:
                f.seek(st.st_size - 1)
                if f.read(1) != b"\n":
                    os.write(self.fd, b"\n")   # end a torn line: the next stands alone
        self.path = path

    def write(self, line: dict) -> None:
        data = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode(
            "utf-8", "surrogateescape")
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Progress:
    """`done/total, rate, errors, ETA` on one line of a terminal, at most every
    `every` seconds; silent when the stream is not a terminal."""

    def __init__(self, total: int, stream=None, every: float = 0.5) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.on = _isatty(self.stream)
        self.total, self.done, self.errors = total, 0, 0
        self.every = every
        self.t0 = time.monotonic()
        self.shown = 0.0

    def add(self, line: dict) -> None:
        self.done += 1
        if "verdict" not in line:
            self.errors += 1
        now = time.monotonic()
        if self.on and (now - self.shown >= self.every or self.done == self.total):
            self.shown = now
            self.stream.write("\r" + self.text(now) + "\x1b[K")
            self.stream.flush()

    def text(self, now: float | None = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self.t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        eta = _duration(left / rate) if rate > 0 and left else ("-" if left else "0s")
        return (f"corral batch: {self.done}/{self.total} done, {rate:.1f}/s, "
                f"{self.errors} error{'s' * (self.errors != 1)}, ETA {eta}")

    def finish(self) -> None:
        if self.on:
            self.stream.write("\r" + self.text() + "\x1b[K\n")
            self.stream.flush()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _duration(s: float) -> str:
    s = int(s + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


__all__ = ["FINAL_ERRORS", "Output", "Progress", "done_ids", "is_final"]
