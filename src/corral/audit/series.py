"""Denials over time, for the dashboard's chart (docs/dashboard.md): what query.denials
groups, counted in equal time buckets instead, per kind."""

from __future__ import annotations

import json
import time

from . import query


def denials_over_time(*, since: float, buckets: int = 24, actor: str | None = None,
                      path: str | None = None, now: float | None = None) -> dict:
    """{"start", "step", "buckets", "kinds": {kind: [count per bucket]}}: the refusals (as
    query.denials counts them) of the runs that started in the last `since` seconds, in
    `buckets` equal buckets from oldest to newest, each dated by its run's start."""
    now = time.time() if now is None else now
    buckets = max(1, int(buckets))
    step = since / buckets
    start = now - since
    out: dict[str, list[int]] = {}
    conn = query.open_db(path)
    if conn is not None:
        sql = ("SELECT e.data, r.started FROM events e JOIN runs r ON r.id = e.run_id "
               "WHERE r.started >= ? AND e.kind NOT IN ('unenforced', 'teardown', 'audit')")
        args: list = [start]
        if actor is not None:
            sql += " AND r.actor = ?"
            args.append(actor)
        try:
            for data, started in conn.execute(sql, args):
                e = json.loads(data)
                if not query._denied(e):
                    continue
                i = min(buckets - 1, max(0, int((started - start) // step)))
                out.setdefault(str(e.get("kind")), [0] * buckets)[i] += 1
        finally:
            conn.close()
    return {"start": start, "step": step, "buckets": buckets, "kinds": out}


def verdicts(*, since: float, actor: str | None = None, path: str | None = None,
             now: float | None = None) -> dict[str, int]:
    """{verdict: runs} of the runs that started in the last `since` seconds (a run still
    going, or whose end was not recorded, counts as "running")."""
    now = time.time() if now is None else now
    conn = query.open_db(path)
    if conn is None:
        return {}
    sql = "SELECT COALESCE(verdict, 'running'), COUNT(*) FROM runs WHERE started >= ?"
    args: list = [now - since]
    if actor is not None:
        sql += " AND actor = ?"
        args.append(actor)
    try:
        return dict(conn.execute(sql + " GROUP BY 1", args).fetchall())
    finally:
        conn.close()
