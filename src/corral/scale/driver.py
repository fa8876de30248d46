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
from .node import NodeRunner, error_line, node_name

#: jobs at once, at most, on one machine
MAX_CONCURRENCY = 1024
#: jobs handed to the local workers per slot: one running, one waiting in the pool's
#: queue, so a worker that finishes a job starts the next at once instead of waiting for
#: the driver to take the result and send another (~1 ms a job of the slot's time)
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
    """This machine: `concurrency` forked worker processes, each running one job at a time
    in sandboxes of a NodeRunner of its own (its warm pool keeps one ready), with a next
    job queued for it (QUEUED_PER_SLOT). Processes, not threads: each job's supervision is
    Python, and on a busy host threads of one process queue behind one another for the
    GIL. When a worker dies (the OOM killer, a signal), the pool cannot say which job it
    had: the jobs in flight (running or queued) run again on a new set of workers (their
    lines say `attempt` 2), and a job in flight at a second death gets an error line
    instead."""
    from collections import deque
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context

    todo = deque((j, 1) for j in jobs)
    node = node_name()
    slots = max(1, min(concurrency, len(jobs)))
    pool = None
    running: dict = {}
    try:
        while todo or running:
            if pool is None:
                pool = ProcessPoolExecutor(slots, mp_context=get_context("fork"),
                                           initializer=_worker_init, initargs=(node,))
            while todo and len(running) < slots * QUEUED_PER_SLOT:
                job, attempt = todo.popleft()
                try:
                    f = pool.submit(_worker_run, (job.to_wire(), base, attempt))
                except BrokenProcessPool:
                    todo.appendleft((job, attempt))
                    break
                running[f] = (job, attempt)
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            broken = False
            for f in done:
                job, attempt = running.pop(f)
                try:
                    yield f.result()
                except BrokenProcessPool:
                    broken = True
                    if attempt < 2:
                        todo.appendleft((job, attempt + 1))
                    else:
                        yield error_line(job.id, node, attempt, CorralError(
                            "a worker process died twice while the job was in flight "
                            "(killed, perhaps by the OOM killer); not run again",
                            field="job"))
            if broken:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = None
    finally:
        if pool is not None:
            # the workers close their sandboxes (a finalizer) as they exit; interrupted,
            # what a killed one left is removed by corral's stale sweep
            pool.shutdown(wait=True, cancel_futures=True)
        from . import slotcg

        slotcg.sweep()     # the slot cgroups of workers that were killed


_RUNNER: list = []


def _worker_init(node: str) -> None:
    from multiprocessing.util import Finalize

    from . import slotcg

    moved = slotcg.enter()     # this slot's sandboxes weigh as one process (slotcg.py)
    runner = NodeRunner(node, slots=1)
    _RUNNER.append(runner)
    Finalize(runner, _worker_end, args=(runner, moved), exitpriority=10)


def _worker_end(runner: NodeRunner, moved) -> None:
    """At the worker's exit (a forked multiprocessing worker runs no atexit hooks): its
    sandboxes closed, their cgroups removed, then its slot's cpu cgroup."""
    from ..backends.host.cgroups import POOL
    from . import slotcg

    runner.close()
    POOL.drain()
    slotcg.leave(moved)


def _worker_run(task) -> dict:
    wire, base, attempt = task
    runner = _RUNNER[0]
    try:
        return runner.run(wire, base, attempt)
    except Exception as e:  # noqa: BLE001 - one job's failure is its own line
        return error_line(wire.get("id"), runner.node, attempt, CorralError(
            f"the job failed on this node: {type(e).__name__}: {e}", field="job"))


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
