"""The driver of a batch: hands jobs to this machine's worker processes (each with a
pool of warm sandboxes) or to a Ray cluster (scale/ray.py), yields each job's output line
as it finishes, at most once per job id, and records every job that ran in this machine's audit
store (audit/record.py: face "batch", the receipt signed by the node that ran it).

    for line in run_batch(jobs, base_policy, concurrency=4): ...
"""

from __future__ import annotations

import os

from ..errors import CorralError, UsageError
from .jobs import Job, job_policy

#: jobs at once, at most, on one machine
MAX_CONCURRENCY = 1024
#: jobs in flight per slot (a local worker, a Ray node's slot): one running, one waiting,
#: so a slot that finishes a job starts the next at once instead of waiting for the
#: driver to take the result and send another (~1 ms a job of the slot's time)
QUEUED_PER_SLOT = 2


def check_concurrency(n) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_CONCURRENCY:
        raise UsageError(f"expected a whole number from 1 to {MAX_CONCURRENCY}, not {n!r}",
                         field="concurrency")
    return n


def run_batch(jobs: list[Job], base: dict, *, ray_address: str | None = None,
              concurrency: int | None = None, skip: frozenset | set = frozenset()):
    """Yield one output line (dict) per job not in `skip` (id keys), as each finishes."""
    concurrency = check_concurrency(concurrency)
    todo = [j for j in jobs if j.key() not in skip]
    if ray_address is not None:
        from .ray import run_on_ray

        lines = run_on_ray(todo, base, ray_address, concurrency)
    else:
        lines = run_local(todo, base, concurrency or os.cpu_count() or 1)
    recorder = _Recorder(base)
    seen: set[str] = set()
    by_key = {j.key(): j for j in todo}
    try:
        for line in lines:
            from .jobs import id_key

            key = id_key(line.get("id"))
            if key is None or key not in by_key or key in seen:
                continue       # never two lines for one job, never a line for no job
            seen.add(key)
            recorder.record(by_key[key], line)
            yield line
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()


def run_local(jobs: list[Job], base: dict, concurrency: int):
    """This machine: `concurrency` forked worker processes (scale/local.py)."""
    from .local import run_local as run

    return run(jobs, base, concurrency)


class _Recorder:
    """Each job that ran, into this machine's audit store, with the node's receipt."""

    def __init__(self, base: dict) -> None:
        from ..audit import record

        self.record_run = record.record_run
        self.enabled = record.enabled()
        self.base = base
        self.policies: dict = {}

    def record(self, job: Job, line: dict) -> None:
        if not self.enabled or "verdict" not in line or not line.get("run_id"):
            return
        from ..result import Result, Usage

        try:
            policy = self.policies.get(job.key() if job.policy else None)
            if policy is None:
                policy = job_policy(self.base, job)
                self.policies[job.key() if job.policy else None] = policy
            usage = line.get("usage") or {}
            result = Result(verdict=line["verdict"], exit_code=line.get("exit_code"),
                            signal=line.get("signal"), stdout=line.get("stdout", ""),
                            stderr=line.get("stderr", ""),
                            stdout_truncated=bool(line.get("stdout_truncated")),
                            stderr_truncated=bool(line.get("stderr_truncated")),
                            usage=Usage(**{k: usage.get(k) for k in
                                           ("wall_s", "cpu_s", "memory_peak_bytes")
                                           if k in usage}),
                            events=list(line.get("events") or []),
                            isolation=line.get("isolation", ""))
            self.record_run(line["run_id"], float(line["started"]), result, policy=policy,
                            plan=None, argv=list(job.argv), isolation=result.isolation,
                            origin=("batch", None), kind="run", ended=float(line["ended"]),
                            signed=line.get("receipt"))
        except (CorralError, KeyError, TypeError, ValueError):
            pass    # a line the store cannot take is still in the output


__all__ = ["check_concurrency", "run_batch", "run_local"]
