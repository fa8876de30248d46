"""The audit database: SQLite in WAL mode, owner-only, in corral's state directory.

    STATE/audit/            0700, refused if it is a link or not ours
      audit.db              0600 (with audit.db-wal, audit.db-shm)
      receipt.key           the host's Ed25519 key (audit/receipt.py)

Tables (the typed events of events.py are the schema of `events.data`):

    runs       id, kind ("run" | "command" | "cell": an E2B run_code cell), sandbox (a
               live sandbox's id, for its commands), started, ended, tier, image, image_digest, policy_digest,
               policy (TOML), argv (JSON), verdict, exit_code, signal, usage (JSON),
               actor ("token:NAME" | "user:NAME"), face (cli | api | service | mcp |
               probe), receipt (JSON, service runs)
    sandboxes  id, created, ended, ended_by, tier, policy_digest, policy, actor, face
    events     run_id (a run's or a live sandbox's id), seq, kind, data (the event's
               to_dict() as JSON)

The writer thread (audit/record.py) writes during runs of long-lived processes; `corral run`
appends its record to the spool (audit/spool.py), which every connect() ingests; queries
(audit/query.py) and `corral gc` open their own connections.
"""

from __future__ import annotations

import os
import stat
import time

# The writer thread of `corral run` imports this module after the command: what it imports
# delays the process's exit (the record is flushed before the Result is shown). So the C
# modules are used directly: `sqlite3` would import datetime, `hashlib` OpenSSL, `json` re
# and enum (~9 ms together). Queries (audit/query.py) use the full modules.
try:
    from _sqlite3 import connect as _sqlite_connect
except ImportError:     # pragma: no cover - an interpreter without the C module's connect
    from sqlite3 import connect as _sqlite_connect

from .spool import digest, image_digest, ingest, local_user, policy_toml, private_dir, run_fields
from .spool import dumps as _dumps

__all__ = ["connect", "digest", "image_digest", "ingest", "local_user", "policy_toml",
           "private_dir", "run_row", "write_batch"]

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, sandbox TEXT, started REAL NOT NULL,
    ended REAL, tier TEXT, image TEXT, image_digest TEXT, policy_digest TEXT, policy TEXT,
    argv TEXT, verdict TEXT, exit_code INTEGER, signal INTEGER, usage TEXT, actor TEXT,
    face TEXT, receipt TEXT);
CREATE INDEX IF NOT EXISTS runs_started ON runs(started);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY, created REAL NOT NULL, ended REAL, ended_by TEXT, tier TEXT,
    policy_digest TEXT, policy TEXT, actor TEXT, face TEXT);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (run_id, seq));
CREATE INDEX IF NOT EXISTS events_kind ON events(kind);
"""


def private_file(path: str) -> None:
    """Create the file 0600 if missing; refuse a link or another owner's file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{path} is not a file of this user: refused")
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def connect(path: str, *, busy_timeout: float = 5.0, create: bool = True,
            spool: bool = True):
    if create:
        private_dir(os.path.dirname(path))
        private_file(path)
    elif not os.path.exists(path):
        raise FileNotFoundError(path)
    elif os.path.islink(path):
        raise PermissionError(f"{path} is a link: refused")
    conn = _sqlite_connect(path, timeout=busy_timeout, isolation_level=None,
                           check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
        conn.executescript(SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION};")
    if spool:
        take_spool(conn, os.path.dirname(path))
    return conn


#: what ingesting the spool did in this process: runs taken, malformed lines skipped, the
#: last error
last_ingest: dict = {"runs": 0, "skipped": 0, "error": None}


def take_spool(conn, audit_dir: str) -> dict:
    """Ingest the spool (audit/spool.py) into the store; a spool that cannot be read is
    said in last_ingest["error"], never an error of the caller."""
    try:
        got = ingest(conn, audit_dir)
        last_ingest["runs"] += got["runs"]
        last_ingest["skipped"] += got["skipped"]
    except Exception as e:   # noqa: BLE001 - the store stays readable
        last_ingest["error"] = str(e) or type(e).__name__
    return last_ingest


def run_row(item: dict) -> tuple[tuple, list[dict], str | None]:
    """(the runs row, its events, its receipt JSON or None) of one queued run."""
    f = run_fields(item)
    receipt = None
    if item.get("signed"):
        receipt = _receipt_json(item["signed"])
    elif item.get("receipt"):
        from . import receipt as rc

        r, stdin = item["result"], item.get("stdin")
        body = rc.body(run_id=f["id"], started=f["started"], ended=f["ended"],
                       tier=f["tier"], policy_toml=f["policy"],
                       image_digest=f["image_digest"], argv=item["argv"],
                       stdin=stdin if isinstance(stdin, (bytes, bytearray)) else b"",
                       stdout=r.stdout.encode("utf-8", "surrogateescape"),
                       stderr=r.stderr.encode("utf-8", "surrogateescape"),
                       changes=None, events=f["events"], verdict=r.verdict,
                       exit_code=r.exit_code, signal=r.signal, usage=f["usage"],
                       actor=f["actor"])
        receipt = _dumps(rc.sign(body, os.path.dirname(item["db"])))
    row = tuple(_dumps(v) if k in ("argv", "usage") else v
                for k, v in f.items() if k != "events") + (receipt,)
    return row, f["events"], receipt


def _receipt_json(signed: dict) -> str:
    """A node's signed receipt as spool.dumps writes it (compact, ASCII), by the C encoder
    (a batch's driver stores one a job; spool.dumps, in Python, took twice as long); what
    that cannot write as dumps would (NaN, a value that is not JSON) goes through dumps."""
    import json  # a batch's driver has it loaded: its output lines are JSON

    try:
        return json.dumps(signed, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return _dumps(signed)


def write_batch(conn, batch: list[dict]) -> None:
    """Every record of the batch in one transaction: all kept, or (an error) none."""
    runs, events, sandboxes, ends = [], [], [], []
    for item in batch:
        # let a run that waits for the GIL have it between records: this thread's Python
        # work would otherwise hold it for up to the switch interval (5 ms)
        time.sleep(0)
        t = item["t"]
        if t == "run":
            row, evs, _ = run_row(item)
            runs.append(row)
            events.append((item["id"], evs))
        elif t == "events":
            events.append((item["id"], item["events"]))
        elif t == "sandbox":
            toml = policy_toml(item["policy"])
            sandboxes.append((item["id"], item["created"], item["tier"],
                              digest(toml.encode()), toml,
                              item["actor"] or local_user(), item["face"]))
        elif t == "sandbox_end":
            ends.append((item["ended"], item["ended_by"], item["id"]))
            events.append((item["id"], item["events"]))
    conn.execute("BEGIN IMMEDIATE")
    try:
        if runs:
            conn.executemany("INSERT OR REPLACE INTO runs VALUES "
                             "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", runs)
        if sandboxes:
            conn.executemany("INSERT OR IGNORE INTO sandboxes (id, created, tier, "
                             "policy_digest, policy, actor, face) VALUES (?,?,?,?,?,?,?)",
                             sandboxes)
        if ends:
            conn.executemany("UPDATE sandboxes SET ended = ?, ended_by = ? WHERE id = ?",
                             ends)
        for run_id, evs in events:
            if not evs:
                continue
            (base,) = conn.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE "
                                   "run_id = ?", (run_id,)).fetchone()
            conn.executemany("INSERT INTO events VALUES (?,?,?,?)",
                             [(run_id, base + i, str(e.get("kind", "")), _dumps(e))
                              for i, e in enumerate(evs)])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
