"""Reading the audit store: runs, one run's events, denials grouped, retention, export.

Every query takes `actor` (None: everyone's; the service passes "token:NAME", so a token
sees only its own runs) and reads through a connection of its own (WAL: readers never
block the writer, nor the writer them).
"""

from __future__ import annotations

import json
import os
import re
import time

from ..errors import UsageError
from . import store
from .record import db_path

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str, field: str) -> float:
    """"90s", "15m", "1h", "30d", "2w" -> seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", text.strip()) if isinstance(text, str) else None
    if not m:
        raise UsageError(f"{field} {text!r} is not an age such as 90s, 15m, 1h, 30d or 2w",
                         field=field)
    return float(m.group(1)) * _UNITS[m.group(2)]


def open_db(path: str | None = None):
    """A reading connection, or None when there is no store yet."""
    path = path or db_path()
    if not os.path.exists(path):
        spooled = os.path.join(os.path.dirname(path), "spool")
        if not os.path.isdir(spooled) or not os.listdir(spooled):
            return None
        return store.connect(path)   # runs of `corral run` only in the spool so far
    return store.connect(path, create=False)


def _run(row) -> dict:
    (rid, kind, sandbox, started, ended, tier, image, image_digest, pdig, _policy, argv,
     verdict, exit_code, signal, usage, actor, face, receipt) = row
    return {"id": rid, "kind": kind, "sandbox": sandbox, "started": started, "ended": ended,
            "tier": tier, "image": image, "image_digest": image_digest,
            "policy_digest": pdig, "argv": json.loads(argv or "[]"), "verdict": verdict,
            "exit_code": exit_code, "signal": signal, "usage": json.loads(usage or "{}"),
            "actor": actor, "face": face, "receipt": receipt is not None}


def runs(*, since: float | None = None, verdict: str | None = None, tier: str | None = None,
         actor: str | None = None, limit: int = 1000, path: str | None = None) -> list[dict]:
    """Runs and commands, newest first. since: seconds back from now."""
    conn = open_db(path)
    if conn is None:
        return []
    where, args = [], []
    if since is not None:
        where.append("started >= ?")
        args.append(time.time() - since)
    for col, v in (("verdict", verdict), ("tier", tier), ("actor", actor)):
        if v is not None:
            where.append(f"{col} = ?")
            args.append(v)
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY started DESC LIMIT ?"
    try:
        return [_run(r) for r in conn.execute(sql, (*args, int(limit)))]
    finally:
        conn.close()


def get_run(run_id: str, *, actor: str | None = None, path: str | None = None):
    """(the run, its policy TOML, its receipt dict or None), or None if unknown (or not
    the actor's)."""
    conn = open_db(path)
    if conn is None:
        return None
    try:
        row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    finally:
        conn.close()
    if row is None or (actor is not None and row[15] != actor):
        return None
    return _run(row), row[9], (json.loads(row[17]) if row[17] else None)


def events(run_id: str, *, actor: str | None = None, path: str | None = None):
    """One run's (or live sandbox's) events in order, or None if it is unknown."""
    conn = open_db(path)
    if conn is None:
        return None
    try:
        owner = conn.execute("SELECT actor FROM runs WHERE id = ? UNION ALL SELECT actor "
                             "FROM sandboxes WHERE id = ?", (run_id, run_id)).fetchone()
        if owner is None or (actor is not None and owner[0] != actor):
            return None
        return [json.loads(d) for (d,) in conn.execute(
            "SELECT data FROM events WHERE run_id = ? ORDER BY seq", (run_id,))]
    finally:
        conn.close()


def allowing_rule(e: dict) -> str | None:
    """The policy change that would have let a refused event through."""
    kind = e.get("kind")
    if kind == "net":
        host, port = e.get("host", ""), e.get("port")
        rule = host if port in (None, 80, 443) else f"{host}:{port}"
        if "private" in str(e.get("reason", "")):
            return f'network.allow_private += "{host}"'
        return f'network.allow += "{rule}"'
    if kind == "secret":
        return f'secrets.{e.get("name")}.hosts += "{e.get("host")}"'
    if kind == "limit":
        return f"raise limits.{e.get('limit')}"
    if kind in ("exec", "syscall"):   # no policy key widens the seccomp profile
        return None
    if kind == "refused":        # the run never started: the field to fix, if one
        field = e.get("field")
        return f"fix {field}" if field else None
    return None


def _denied(e: dict) -> bool:
    k = e.get("kind")
    if k in ("net", "secret"):
        return e.get("decision") in ("deny", "withheld")
    return k in ("limit", "refused", "syscall")


def denials(*, since: float | None = None, kind: str | None = None,
            actor: str | None = None, path: str | None = None) -> list[dict]:
    """What was refused, grouped: kind, what (host:port, secret@host, limit), count, the
    rule that would allow it, runs, last seen; most frequent first."""
    conn = open_db(path)
    if conn is None:
        return []
    where, args = ["e.kind IN ('net', 'secret', 'limit', 'refused', 'syscall')"], []
    if kind is not None:
        where.append("e.kind = ?")
        args.append(kind)
    if since is not None:
        where.append("r.started >= ?")
        args.append(time.time() - since)
    if actor is not None:
        where.append("r.actor = ?")
        args.append(actor)
    sql = ("SELECT e.data, e.run_id, r.started FROM events e JOIN runs r ON r.id = "
           "e.run_id WHERE " + " AND ".join(where))
    groups: dict[tuple, dict] = {}
    try:
        for data, run_id, started in conn.execute(sql, args):
            e = json.loads(data)
            if not _denied(e):
                continue
            if e["kind"] == "net":
                what = f"{e.get('host')}:{e.get('port')}"
            elif e["kind"] == "secret":
                what = f"{e.get('name')}@{e.get('host')}"
            elif e["kind"] == "refused":
                what = f"{e.get('error')}: {e.get('field') or '-'}"
            elif e["kind"] == "syscall":   # one event counts many calls of one command
                what = f"{e.get('name')} ({e.get('errno') or '-'})"
                e.setdefault("message", "refused by the seccomp profile")
            else:
                what = str(e.get("limit"))
            g = groups.setdefault((e["kind"], what), {
                "kind": e["kind"], "what": what, "count": 0, "runs": set(),
                "reason": e.get("reason") or e.get("message"), "rule": allowing_rule(e),
                "last": started})
            n = e.get("count") if e["kind"] == "syscall" else 1
            g["count"] += n if isinstance(n, int) and 0 < n < 1 << 62 else 1
            g["runs"].add(run_id)
            g["last"] = max(g["last"], started)
    finally:
        conn.close()
    out = sorted(groups.values(), key=lambda g: (-g["count"], g["what"]))
    for g in out:
        g["runs"] = len(g["runs"])
    return out


def gc(older_than: float, *, path: str | None = None) -> dict:
    """Delete runs (and their events) that started, and live sandboxes that were created,
    more than `older_than` seconds ago. Returns the counts removed."""
    conn = open_db(path)
    if conn is None:
        return {"runs": 0, "sandboxes": 0, "events": 0}
    cut = time.time() - older_than
    try:
        conn.execute("BEGIN IMMEDIATE")
        ev = conn.execute("DELETE FROM events WHERE run_id IN (SELECT id FROM runs WHERE "
                          "started < ?) OR run_id IN (SELECT id FROM sandboxes WHERE "
                          "created < ?)", (cut, cut)).rowcount
        n = conn.execute("DELETE FROM runs WHERE started < ?", (cut,)).rowcount
        s = conn.execute("DELETE FROM sandboxes WHERE created < ?", (cut,)).rowcount
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"runs": n, "sandboxes": s, "events": ev}
    finally:
        conn.close()


def export(*, since: float | None = None, actor: str | None = None,
           path: str | None = None):
    """Each run with its policy TOML, events and receipt: dicts for JSON lines, oldest
    first."""
    rows = runs(since=since, actor=actor, limit=10**9, path=path)
    for r in reversed(rows):
        got = get_run(r["id"], path=path)
        if got is None:
            continue
        run, policy, receipt = got
        yield {**run, "policy": policy, "events": events(r["id"], path=path) or [],
               "receipt": receipt}
