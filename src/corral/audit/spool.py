"""The audit spool: how a short-lived process (`corral run`) keeps its record without
SQLite.

    STATE/audit/spool/          0700, refused if it is a link or not ours
      runs.jsonl                0600, one JSON line per run, appended (O_APPEND)
      ingest-<hex>.jsonl        a spool file renamed aside by an ingest under way (or
                                interrupted: the next ingest takes it again)

The writer side (`append`, `cli_fields`, in audit/record.py: loaded on the run path
anyway, so `corral run` imports nothing for its record) is one os.write of one line per
run: no sqlite3 import, no thread, no policy TOML (the line has the policy's form and the
local user's uid; ingest prints the TOML and digest and names the user). The line is bounded (LINE_MAX): a bigger record keeps its essentials and drops its
events (and a long argv's tail) with a note saying so. The reader side (`ingest`, called by
audit/store.py whenever the store is opened: `corral runs/logs/denials/gc/audit`, the
service's writer) renames the spool file aside, inserts its lines in one transaction, then
unlinks it; runs are inserted by id (INSERT OR IGNORE, their events only with a new row),
so a file ingested twice (a crash between the commit and the unlink) keeps each run once.
Lines are parsed strictly and bounded; a malformed one is skipped and counted.

The helpers the SQLite writer shares (the record's fields, compact JSON) live here too: this
module imports no sqlite3, json, hashlib or re.
"""

from __future__ import annotations

import os
import stat

try:
    from _sha256 import sha256 as _sha256
except ImportError:     # pragma: no cover - Python 3.12 renamed it
    from hashlib import sha256 as _sha256

from .record import (
    ARGV_KEEP,
    EMPTY_DIGEST,
    LINE_MAX,
    SPOOL_NAME,
    append,
    dumps,
    image_digest,
    local_user,
    private_dir,
)

#: the most lines one spool file gives an ingest (the rest are skipped and counted)
LINES_MAX = 100_000
__all__ = ["ARGV_KEEP", "EMPTY_DIGEST", "LINE_MAX", "LINES_MAX", "SPOOL_NAME", "append",
           "digest", "dumps", "image_digest", "ingest", "line_of", "local_user",
           "policy_toml", "private_dir", "run_fields"]

#: the fields of a run's line and their types (ingest checks each)
FIELDS = {"id": str, "kind": str, "sandbox": (str, type(None)), "started": (int, float),
          "ended": (int, float), "tier": str, "image": str, "image_digest": str,
          "policy_digest": str, "policy": str, "argv": list, "verdict": str,
          "exit_code": (int, type(None)), "signal": (int, type(None)), "usage": dict,
          "actor": str, "face": str, "events": list}
#: what a short-lived process's line has in place of the policy's text and digest and
#: its user's name (audit/record.py): ingest prints the TOML and names the user
OPTIONAL = {"policy_form": dict, "version": str, "uid": int}


_TOML: dict[int, tuple] = {}   # id(policy) -> (policy, its TOML, the TOML's digest):
                               # policies are frozen


def policy_toml(policy) -> str:
    return policy_text(policy)[0]


def policy_text(policy) -> tuple[str, str]:
    """(the policy's TOML, its digest), made once a policy (a batch records one policy
    for every job)."""
    hit = _TOML.get(id(policy))
    if hit is not None and hit[0] is policy:
        return hit[1], hit[2]
    from ..policy.dump import dump_toml

    text = dump_toml(policy)
    if len(_TOML) >= 64:
        _TOML.clear()
    _TOML[id(policy)] = (policy, text, digest(text.encode()))
    return text, _TOML[id(policy)][2]


def digest(data: bytes) -> str:
    return "sha256:" + _sha256(data).hexdigest()


def run_fields(item: dict) -> dict:
    """The runs row of one queued run as a dict (FIELDS), with its events."""
    r = item["result"]
    toml, pdig = ("", EMPTY_DIGEST) if item["policy"] is None else policy_text(item["policy"])
    usage = r.usage.to_dict() if hasattr(r.usage, "to_dict") else dict(r.usage)
    return {"id": item["id"], "kind": item["kind"], "sandbox": item["sandbox"],
            "started": item["started"], "ended": item["ended"], "tier": item["tier"],
            "image": str(getattr(item["policy"], "image", "") or "host"),
            "image_digest": image_digest(item["plan"], item["policy"]),
            "policy_digest": pdig, "policy": toml,
            "argv": list(item["argv"]), "verdict": r.verdict, "exit_code": r.exit_code,
            "signal": r.signal, "usage": usage, "actor": item["actor"] or local_user(),
            "face": item["face"], "events": list(r.events[:item["n_events"]])}


def line_of(fields: dict) -> bytes:
    """One spool line (newline included) of at most LINE_MAX bytes: past it, the events
    and the argv's tail give way to a note."""
    line = (dumps(fields) + "\n").encode("ascii")
    if len(line) <= LINE_MAX:
        return line
    cut = dict(fields)
    argv, kept, size = [], 0, 0
    for a in fields["argv"]:
        a = str(a)
        if size + len(a) > ARGV_KEEP:
            break
        argv.append(a)
        size += len(a)
        kept += 1
    cut["argv"] = argv
    cut["events"] = [{"kind": "audit", "message": (
        f"this record was truncated to fit the audit spool's {LINE_MAX} byte line: "
        f"{len(fields['events'])} events and {len(fields['argv']) - kept} of "
        f"{len(fields['argv'])} arguments dropped (docs/audit.md)")}]
    line = (dumps(cut) + "\n").encode("ascii")
    if len(line) > LINE_MAX:    # the policy is bounded by its schema: not expected
        cut["policy"] = ""
        cut.pop("policy_form", None)
        line = (dumps(cut) + "\n").encode("ascii")
    return line


def _valid(d) -> bool:
    if not isinstance(d, dict) or not set(FIELDS) <= set(d) <= set(FIELDS) | set(OPTIONAL):
        return False
    if not all(isinstance(d[k], t) and not isinstance(d[k], bool)
               for k, t in OPTIONAL.items() if k in d):
        return False
    if not 0 <= d.get("uid", 0) < (1 << 32):
        return False
    for k, t in FIELDS.items():
        v = d[k]
        if not isinstance(v, t) or (isinstance(v, bool) and k != "usage"):
            return False
    if not d["id"] or len(d["id"]) > 64 or not all(isinstance(a, str) for a in d["argv"]):
        return False
    # what SQLite cannot hold (a 64-bit integer column, no NaN) ends the line, not the
    # ingest (tests/fuzz: an exit code of 10**30 failed the whole file, at every ingest)
    for k in ("started", "ended", "exit_code", "signal"):
        v = d[k]
        if v is not None and not (-(1 << 63) <= v < (1 << 63)):
            return False
    return all(isinstance(e, dict) and isinstance(e.get("kind"), str) for e in d["events"])


def _policy_of_form(rec: dict) -> None:
    """Fill in the policy's TOML and digest of a line that has its form (audit/record.py); a
    record of another corral version, or a form this one cannot print, says so in an
    `audit` event."""
    from ..policy.dump import dump_form
    from .record import corral_version

    form, version = rec.pop("policy_form"), rec.pop("version", None)
    note = None
    try:
        text = dump_form(form)
        rec["policy"], rec["policy_digest"] = text, digest(text.encode())
        if version != corral_version():
            note = (f"this record was written by corral {version} and its policy printed "
                    f"by corral {corral_version()}: the text may differ from the one that "
                    f"ran")
    except Exception as e:   # noqa: BLE001 - a line's form is data: it never ends the ingest
        rec["policy"], rec["policy_digest"] = "", ""
        note = f"the policy of this record could not be printed ({type(e).__name__}: {e})"
    if note:
        rec["events"] = [*rec["events"], {"kind": "audit", "message": note}]


def _text(v):
    """A string SQLite can store (UTF-8): a lone surrogate (a non-UTF-8 byte of an argv or
    an env value, decoded with surrogateescape, comes back from the line's JSON escapes as
    one) is kept as its escape, "\\udcff", rather than failing the file's transaction."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return v.encode("utf-8", "backslashreplace").decode("utf-8")
    return v


def _lines(fd: int):
    """The lines of a spool file, each at most LINE_MAX bytes (a longer one: None)."""
    with os.fdopen(os.dup(fd), "rb") as f:
        for _ in range(LINES_MAX):
            line = f.readline(LINE_MAX + 1)
            if not line:
                return
            if len(line) > LINE_MAX or not line.endswith(b"\n"):
                if not line.endswith(b"\n"):   # skip to the end of an overlong line
                    while (rest := f.readline(LINE_MAX)) and not rest.endswith(b"\n"):
                        pass
                yield None
                continue
            yield line
        if f.readline(1):
            yield None   # past LINES_MAX: counted once, the rest left


def _remove(path: str) -> None:
    """Take what is not a spool file out of the way (never following it): unlinked, an
    empty directory removed, else renamed to junk-* (which no ingest reads)."""
    try:
        os.unlink(path)
    except IsADirectoryError:
        try:
            os.rmdir(path)
        except OSError:
            os.rename(path, os.path.join(os.path.dirname(path),
                                         f"junk-{os.urandom(8).hex()}"))
    except FileNotFoundError:
        pass


def ingest(conn, audit_dir: str) -> dict:
    """Move every spool file's runs into the store (see the module's doc). Returns
    {"runs": inserted, "skipped": malformed lines}."""
    import json

    d = os.path.join(audit_dir, "spool")
    out = {"runs": 0, "skipped": 0}
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return out
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{d} is not a directory of this user (a link?): refused")
    names = sorted(n for n in os.listdir(d) if n.startswith("ingest-")
                   and n.endswith(".jsonl"))
    if os.path.lexists(os.path.join(d, SPOOL_NAME)):
        aside = f"ingest-{os.urandom(8).hex()}.jsonl"
        try:
            os.rename(os.path.join(d, SPOOL_NAME), os.path.join(d, aside))
            names.append(aside)
        except FileNotFoundError:   # another ingest took it
            pass
    import fcntl

    for name in names:
        path = os.path.join(d, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError:   # a link or worse, planted in our directory: not read, removed
            _remove(path)
            continue
        try:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.geteuid():
                _remove(path)
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)   # writers that opened it before the rename
            rows = []
            for line in _lines(fd):
                try:
                    rec = json.loads(line) if line is not None else None
                    if not _valid(rec):
                        raise ValueError("not a run's record")
                    if "policy_form" in rec:
                        _policy_of_form(rec)
                    if "uid" in rec:
                        uid = rec.pop("uid")
                        rec["actor"] = rec["actor"] or local_user(uid)
                    row = tuple(dumps(rec[k]) if k in ("argv", "usage") else _text(rec[k])
                                for k in FIELDS if k != "events")
                    evs = [(_text(e["kind"]), dumps(e)) for e in rec["events"]]
                except (ValueError, RecursionError):
                    out["skipped"] += 1
                    continue
                rows.append((rec["id"], row, evs))
            conn.execute("BEGIN IMMEDIATE")
            try:
                for run_id, row, evs in rows:
                    cur = conn.execute("INSERT OR IGNORE INTO runs VALUES "
                                       "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,NULL)", row)
                    if cur.rowcount != 1:
                        continue   # already in: a file ingested twice keeps it once
                    out["runs"] += 1
                    (base,) = conn.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM events "
                                           "WHERE run_id = ?", (run_id,)).fetchone()
                    conn.executemany("INSERT INTO events VALUES (?,?,?,?)",
                                     [(run_id, base + i, kind, data)
                                      for i, (kind, data) in enumerate(evs)])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        finally:
            os.close(fd)
    return out
