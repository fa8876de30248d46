"""The per-exec limits of a plan, as one typed record: what every tier's exec reads instead
of looking each op up by type.

    lim = ExecLimits.from_plan(plan, timeout)
    lim.wall, lim.cpu, lim.cap, lim.rlimits["nofile"], lim.memory, lim.pids
"""

from __future__ import annotations

from ..._record import Record
from ...plan import CpuTime, MemoryLimit, OutputCap, PidsLimit, Plan, Rlimit, WallClock


class ExecLimits(Record):
    wall: float                       # seconds of wall clock (the exec's timeout, if given)
    cpu: float                        # seconds of CPU time, summed over the run
    cap: int                          # bytes kept of each output stream
    rlimits: dict                     # {"nofile" | "fsize" | "core": value}
    memory: int                       # bytes, swap and scratch pages included
    pids: int                         # processes and threads alive at once

    @classmethod
    def from_plan(cls, plan: Plan, timeout: float | None = None) -> ExecLimits:
        """Every plan has exactly one op of each of these (plan.build_plan makes them)."""
        (wall,), (cpu,), (cap,) = plan.find(WallClock), plan.find(CpuTime), plan.find(OutputCap)
        (memory,), (pids,) = plan.find(MemoryLimit), plan.find(PidsLimit)
        return cls(wall=wall.seconds if timeout is None else timeout, cpu=cpu.seconds,
                   cap=cap.bytes, rlimits={op.name: op.value for op in plan.find(Rlimit)},
                   memory=memory.bytes, pids=pids.count)
