"""The execs of a one-shot sandbox running now, so that its close() ends them.

    inflight = Inflight()
    with inflight.run() as slot:      # in exec(): one slot per running exec
        ...; slot.kill = kill          # once the exec's processes exist
    inflight.end_all()                # in close(), before the run dir goes

An exec runs in its caller's thread; the sandbox may be closed from another while it
runs (a code context's interpreter, one long exec in a thread of its own, that outlived
its context: runtime/channels.ExecChannel). end_all() calls each running exec's kill()
and waits until each has returned: its processes, its cgroup and its hold on the
caller's child-subreaper flag go before the sandbox does."""

from __future__ import annotations

import _thread
import time

#: how long end_all() waits for the execs it killed to finish their teardown
CLOSE_WAIT_S = 10.0


class Slot:
    __slots__ = ("done", "kill")

    def __init__(self) -> None:
        self.kill = None
        self.done = _thread.allocate_lock()
        self.done.acquire()


class _Run:
    __slots__ = ("inflight", "slot")

    def __init__(self, inflight: Inflight) -> None:
        self.inflight, self.slot = inflight, Slot()

    def __enter__(self) -> Slot:
        self.inflight._slots[id(self.slot)] = self.slot
        return self.slot

    def __exit__(self, *exc) -> None:
        self.inflight._slots.pop(id(self.slot), None)
        self.slot.done.release()


class Inflight:
    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: dict[int, Slot] = {}

    def run(self) -> _Run:
        return _Run(self)

    def end_all(self, wait: float = CLOSE_WAIT_S) -> None:
        slots = list(self._slots.values())
        for slot in slots:
            if slot.kill is not None:
                slot.kill()
        deadline = time.monotonic() + wait
        for slot in slots:
            if slot.done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                slot.done.release()
