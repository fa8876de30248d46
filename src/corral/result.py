"""What one command in a sandbox produced: the Result and its parts. Plain data.

Verdicts, first match wins: "oom" (the memory cgroup killed for memory), "timeout" (wall
clock or cpu_time; an event says which), "killed" (ended by any other signal), "error"
(nonzero exit), "ok". Output truncation never changes the verdict.
"""

from __future__ import annotations

from ._record import Default, Record

VERDICTS = ("ok", "error", "killed", "timeout", "oom")


class Usage(Record, mutable=True):
    """What one command used: wall and CPU seconds, peak memory (None: not measured)."""

    wall_s: float = 0.0
    cpu_s: float | None = None
    memory_peak_bytes: int | None = None


class Result(Record, mutable=True):
    """What one command produced: verdict, exit code or signal, output, usage, events."""

    verdict: str
    exit_code: int | None
    signal: int | None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    usage: Usage = Default(Usage)
    events: list[dict] = Default(list)
    isolation: str = "namespace"

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def cli_exit_status(self) -> int:
        """The exit status `corral run` returns for this result."""
        if self.verdict == "oom":
            return 137
        if self.verdict == "timeout":
            return 124
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code if self.exit_code is not None else 125

    def to_json(self, **kw) -> str:
        import json

        return json.dumps(self.to_dict(), **kw)


def decide_verdict(*, exit_code: int | None, signal: int | None, oom_kills: int,
                   timed_out: str | None) -> str:
    """The verdict from what was observed. `timed_out` is "timeout"/"cpu_time" or None."""
    if oom_kills > 0:
        return "oom"
    if timed_out:
        return "timeout"
    if signal is not None:
        return "killed"
    if exit_code:
        return "error"
    return "ok"
