"""Refused syscalls as events: a seccomp_notify.Tally (linux/seccomp_notify.py) made the
"syscall" events of a Result (events.SyscallEvent), for the tiers that observe them
(backends/namespace_live.py, backends/process.py)."""

from __future__ import annotations

import errno as _errno

from ...events import SyscallEvent
from ...linux.seccomp_notify import MAX_DISTINCT, syscall_name


def syscall_events(tally) -> list[dict]:
    """One SyscallEvent a refused syscall number, most counted first, then one for the
    numbers past seccomp_notify.MAX_DISTINCT, counted together."""
    out = [SyscallEvent(syscall_name(nr), nr, _errno.errorcode.get(e, str(e)), n).to_dict()
           for nr, e, n in tally.entries()]
    if tally.other:
        out.append(SyscallEvent.others(tally.other, MAX_DISTINCT).to_dict())
    return out
