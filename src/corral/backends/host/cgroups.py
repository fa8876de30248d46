"""The cgroups of a run: one per exec with the plan's limits, kept for the sandbox's next
exec, reused across sandboxes through the process's pool (cgroup v1), and the usage read
from them.

    cg = run_cgroup(run_dir, run_id, plan, check, kept=own)    # per exec: the limits' cgroup
    problems = keep_cgroup(cg, own)                      # after it: kept for the next exec
    POOL.note(own); run_dir.remove(); POOL.give(own)     # at close (cgroup v1 reuse)
    POOL.short_lived()                                   # corral run: removed at close
    usage, oom_kills = usage_of(outcome, cg)
"""

from __future__ import annotations

import atexit
import os

from ...errors import SandboxSetupError

#: tasks an egress proxy may add to its sandbox's cgroup beyond itself: its relay threads
#: (egress/relay.py MAX_RELAY_THREADS), granted on top of limits.pids so that a bulk
#: download never takes a process from the command
RELAY_TASKS = 4


def with_relay_tasks(plan, pids=lambda n: n):
    """`pids` (the policy's count -> the cgroup's), plus RELAY_TASKS when the plan starts
    an egress proxy in the run's cgroup."""
    from ...plan import EgressProxy

    if not plan.find(EgressProxy):
        return pids
    return lambda n: pids(n) + RELAY_TASKS


def run_cgroup(run_dir, run_id: str, plan, check, *, pids=lambda n: n,
               kept: list | None = None):
    """The cgroup of one exec with the plan's memory, pids and cpu limits (those that
    `check`, the tier's backends.base.TierCheck, says it enforces here), noted in the run
    dir for the stale sweep; None when there is none to set. `pids` maps the policy's
    count to the cgroup's (gvisor adds its own threads).
    Without a usable pids controller the pids limit is left to the tier's RLIMIT_NPROC
    (check() has already reported it where that is not enough).

    `kept`: the sandbox's own idle cgroups (see CgroupPool), reused first; then one of
    the process's pool; else a new one. Give it back with keep_cgroup()."""
    from ...linux import limits
    from ...plan import CpuQuota, MemoryLimit, PidsLimit

    wanted = {type(op): op for op in (*plan.find(MemoryLimit), *plan.find(PidsLimit),
                                      *plan.find(CpuQuota)) if check.enforces(op)}
    info = limits.detect()
    if not info.pids:
        wanted.pop(PidsLimit, None)
    if not wanted:
        return None
    key = (wanted[MemoryLimit].bytes if MemoryLimit in wanted else None,
           pids(wanted[PidsLimit].count) if PidsLimit in wanted else None,
           wanted[CpuQuota].cpus if CpuQuota in wanted else None)
    if kept is not None and info.version == "v1":
        for cg in list(kept):
            if cg.key != key:
                continue
            try:
                kept.remove(cg)     # atomic: two execs of one sandbox never share one
            except ValueError:
                continue            # another thread's exec took it
            if _renew(cg, max_residue=None):   # its charges are this sandbox's own
                return cg
        cg = POOL.take(key)
        if cg is not None:
            run_dir.track(cg)
            return cg
    cg = limits.RunCgroup.create(run_id, memory=key[0], pids=key[1], cpus=key[2], info=info)
    cg.key = key
    run_dir.track(cg)
    return cg


def keep_cgroup(cg, kept: list | None) -> list[str]:
    """After an exec: keep its emptied cgroup for the sandbox's next exec (cgroup v1), or
    remove it. Returns teardown problems."""
    if kept is not None and cg.version == "v1" and cg._emptied:
        kept.append(cg)
        return []
    return destroy_cgroup(cg)


def destroy_cgroup(cg) -> list[str]:
    """cg.destroy(), its failure returned as teardown problems instead of raised."""
    try:
        cg.destroy()
    except SandboxSetupError as e:
        return [str(e)]
    return []


def _renew(cg, *, max_residue: int | None) -> bool:
    try:
        if cg.renew(max_residue=max_residue):
            return True
    except SandboxSetupError:
        pass
    destroy_cgroup(cg)
    return False


class CgroupPool:
    """This process's emptied run cgroups (cgroup v1), by the limits they were made with,
    for later sandboxes with the same limits: making and removing one costs the kernel about
    1 ms of CPU over its five hierarchies, and the next run's first write into a new
    cgroup is slow too; reusing one is a few small writes (RunCgroup.renew).

    A sandbox keeps the cgroups of its execs while it is open (`kept`: their memory charge
    includes its scratch files, which must not follow them into another sandbox) and gives
    them here when it closes, after its scratch tmpfs is gone. One is reused only if at
    most RESIDUE bytes are still charged to it. The pool notes what it holds in a run dir
    of its own, so if this process dies, the next corral start removes them like any dead
    run's; at a normal exit they are removed. A forked child starts with an empty pool and
    never touches its parent's."""

    SIZE = 8
    RESIDUE = 4 << 20

    def __init__(self) -> None:
        import _thread

        self._lock = _thread.allocate_lock()
        self._pid = os.getpid()
        self._idle: list = []
        self._dir = None          # the pool's RunDir, made on first use
        self._noted: set[str] = set()
        #: False once short_lived() said no later sandbox will take what is given back
        self.keeps = True

    def short_lived(self) -> None:
        """This process ends after the sandbox it runs (`corral run`): nothing it would
        keep here could be reused, so remove_run() removes a sandbox's cgroups at once
        instead (no pool run dir made, nothing renewed; the exit handler finds nothing to
        drain). A forked child inherits it."""
        self.keeps = False

    def _mine(self) -> bool:
        """False in a forked child (the parent's cgroups and run dir are not its own)."""
        if os.getpid() == self._pid:
            return True
        self._pid, self._idle, self._dir, self._noted = os.getpid(), [], None, set()
        return False

    def take(self, key):
        """An idle cgroup made with these limits, ready for a run (renewed when it was
        given back), or None."""
        with self._lock:
            self._mine()
            for i, cg in enumerate(self._idle):
                if cg.key == key:
                    del self._idle[i]
                    return cg
        return None

    def note(self, cgs: list) -> None:
        """Record cgroups in the pool's run dir (before the run dir that recorded them goes)."""
        if not cgs:
            return
        with self._lock:
            self._mine()
            if self._dir is None:
                from ...linux import rundir

                self._dir = rundir.RunDir()
            if len(self._noted) > 4 * self.SIZE:
                # the record lists every cgroup ever noted, removed ones too: start it
                # again from what is idle now (those in use are in their sandboxes' records)
                self._dir.retrack([*self._idle, *cgs])
                self._noted = {cg.run_id for cg in (*self._idle, *cgs)}
            for cg in cgs:
                if cg.run_id not in self._noted:
                    self._dir.track(cg)
                    self._noted.add(cg.run_id)

    def give(self, cgs: list) -> list[str]:
        """Keep what fits (note() them first), renewed for their next run here (off the
        next run's path when a one-shot run's teardown thread gives them: host/deferred.py;
        nothing runs in an idle one, so its counters stay at their start); remove the rest
        (and any that cannot be renewed: see RunCgroup.renew). Returns teardown
        problems."""
        with self._lock:
            room = self.SIZE - len(self._idle) if self._mine() else 0
            fits = [cg for cg in cgs if cg.run_id in self._noted][:max(room, 0)]
        ready = [cg for cg in fits if _renew(cg, max_residue=self.RESIDUE)]
        with self._lock:
            room = self.SIZE - len(self._idle) if self._mine() else 0
            kept = ready[:max(room, 0)]
            self._idle += kept
        problems: list[str] = []
        for cg in cgs:
            if all(cg is not k for k in kept):
                problems += destroy_cgroup(cg)   # idempotent: those _renew removed too
        return problems

    def drain(self) -> None:
        """Remove every idle cgroup and the pool's run dir (at exit)."""
        with self._lock:
            if not self._mine():
                return
            idle, self._idle = self._idle, []
            pool_dir, self._dir = self._dir, None
            self._noted = set()
        for cg in idle:
            destroy_cgroup(cg)
        if pool_dir is not None:
            pool_dir.remove()


POOL = CgroupPool()


# registered at import, before any Sandbox registers its own close at exit (sandbox.py):
# atexit runs the latest first, so sandboxes still open give their cgroups to the pool
# before it is drained
atexit.register(POOL.drain)


def usage_of(outcome, cg):
    """(Usage, oom kills) of one exec: wall time from the supervisor; CPU, peak memory and
    the OOM counter from the run's cgroup when there is one."""
    from ...result import Usage

    usage = Usage(wall_s=round(outcome.wall_s, 6))
    if cg is None:
        return usage, 0
    u = cg.usage()
    usage.cpu_s = round(u.cpu_s, 6) if u.cpu_s is not None else None
    usage.memory_peak_bytes = u.memory_peak_bytes
    return usage, u.oom_kills or 0


def remove_run(run_dir, kept: list) -> list[str]:
    """Remove an emptied sandbox's run dir, then give its cgroups to the pool (note()d
    there first: the run dir that recorded them goes). In a short-lived process
    (POOL.short_lived()) the cgroups are removed first, while the run dir still records
    them for the stale sweep, then the run dir. Returns teardown problems.

    A run dir that would not go is left with its lock free: any corral start's sweep
    takes it for a dead supervisor's and removes the cgroups named after it (linux/
    rundir.sweep_stale), so they are removed now instead of pooled, where a later run
    would take one the sweep may remove under it."""
    if not POOL.keeps:
        problems = [p for cg in kept for p in destroy_cgroup(cg)]
        return problems + run_dir.remove()
    POOL.note(kept)                   # recorded there before this run dir goes
    problems = run_dir.remove()       # the scratch tmpfs, charged to them, goes too
    if problems:
        for cg in kept:
            problems += destroy_cgroup(cg)
        return problems
    return problems + POOL.give(kept)
