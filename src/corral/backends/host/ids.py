"""Which host uids and gids sandboxes run as, when corral runs as root.

Each sandbox gets ids of its own, drawn at random from [UID_BASE, UID_BASE + UID_SPAN):
far above any distribution's users (systemd reserves up to 2^31 - 2 for containers, but
nothing allocates at 1.5e9 by default) and never reused while a process still holds one
(free_uids). A fresh uid per sandbox means one sandbox's processes can never signal,
ptrace or share files with another's, and a uid left behind by a crash is found by the
sweep.
"""

from __future__ import annotations

import os

#: sandbox uids, when corral runs as root, are drawn from [UID_BASE, UID_BASE + UID_SPAN)
UID_BASE = 1_500_000_000
UID_SPAN = 1 << 20


def pick(base: int = UID_BASE, span: int = UID_SPAN) -> int:
    """A random id of [base, base + span)."""
    return base + int.from_bytes(os.urandom(4), "little") % span


def free_uids(n: int) -> list[int]:
    """n distinct uids of the sandbox range, none of them any process's now (real,
    effective, saved or filesystem uid): a live sandbox's uid is never handed out again
    while one of its processes lives. Costs a /proc scan (a few ms)."""
    used = _uids_in_use()
    picked: list[int] = []
    while len(picked) < n:
        uid = pick()
        if uid not in used and uid not in picked:
            picked.append(uid)
    return picked


def _uids_in_use() -> set[int]:
    used: set[int] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        used.update(int(u) for u in line.split()[1:])
                        break
        except OSError:
            pass
    return used
