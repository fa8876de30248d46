"""The last probe matrix of this host, kept in corral's state directory for the dashboard
(docs/dashboard.md, "Probe"):

    STATE/probe/            0700
      last.json             0600: {"probe": 1, "date", "host", "corral_version",
                                   "cells": [{id, category, description, tier, expected,
                                              contained, reason, status, label, failing,
                                              seconds, date}]}

Each `corral probe` merges its cells in, by (case, tier): a run of one case replaces that
case's cells and keeps the rest, each cell with the date it was measured. The file is
replaced atomically and read without following a link, at most MAX bytes, strictly.
"""

from __future__ import annotations

import json
import os
import stat
import time

VERSION = 1
MAX = 8 << 20
CELLS_MAX = 20000
_FIELDS = {"id": str, "category": str, "description": str, "tier": str, "expected": bool,
           "reason": str, "status": str, "label": str, "failing": bool,
           "seconds": (int, float), "date": (int, float)}


def path(state: str | None = None) -> str:
    from ..linux.rundir import state_dir

    return os.path.join(state or state_dir(), "probe", "last.json")


def save(cells, *, state: str | None = None, now: float | None = None) -> str:
    """Merge this probe's cells into the stored matrix; returns the file's path."""
    from ..audit.spool import private_dir
    from .report import label

    now = time.time() if now is None else now
    p = path(state)
    # the state directory itself is not made private: the image store's trees below it
    # must stay reachable by the sandboxes' uids (images/resolve.py checks o+x)
    os.makedirs(os.path.dirname(os.path.dirname(p)), 0o711, exist_ok=True)
    private_dir(os.path.dirname(p))
    old = load(state) or {}
    kept = {(c["id"], c["tier"]): c for c in old.get("cells", [])}
    for c in cells:
        kept[(c.case.id, c.tier)] = {**c.to_dict(), "description": c.case.description,
                                     "label": label(c), "failing": c.failing, "date": now}
    from ..audit.receipt import corral_version

    doc = {"probe": VERSION, "date": now, "host": os.uname().nodename,
           "corral_version": corral_version(), "cells": list(kept.values())[-CELLS_MAX:]}
    tmp = f"{p}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p


def load(state: str | None = None) -> dict | None:
    """The stored matrix, or None when there is none (or it is not one: a link, too big,
    malformed). Cells that do not parse are left out."""
    try:
        fd = os.open(path(state), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("probe") != VERSION or not isinstance(
            doc.get("cells"), list) or not isinstance(doc.get("date"), (int, float)):
        return None
    cells = []
    for c in doc["cells"]:
        if isinstance(c, dict) and all(isinstance(c.get(k), t) for k, t in _FIELDS.items()) \
                and (c.get("contained") is None or isinstance(c.get("contained"), bool)):
            cells.append(c)
    return {"date": float(doc["date"]), "host": str(doc.get("host", "")),
            "corral_version": str(doc.get("corral_version", "")), "cells": cells}
