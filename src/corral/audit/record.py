"""The audit store's hook on the run path: cheap, never failing, never waiting.

Every face (corral run, corral.run, Sandbox.exec, live sandboxes and their commands, the
service, MCP, the probe) hands what it ran to `record_run` here. Nothing is written on the
caller's thread: the record (references to the Result, policy and plan, no copies) goes on
a bounded queue that one background thread per process (`corral-audit`, audit/writer.py)
drains in batches into SQLite (audit/store.py; the thread imports sqlite3, so `corral run`
never does on its own path). When the store cannot keep a record (the database locked past
its busy timeout, a full disk, a full queue, the exit deadline) the run is unaffected and
its Result gets an `audit` event (events.AuditEvent) saying the record was lost.

A short-lived process (`corral run`: use_spool()) has no thread: flush() appends each run's
record as one JSON line to the spool (audit/spool.py), which the store ingests whenever it
is opened (a query, gc, export, the writer of a long-lived process).

    CORRAL_AUDIT=0                     no records at all (also "off", "false", "no")
    CORRAL_AUDIT_FACE=probe            the face recorded for runs of this process
    with acting_as("token:ci", "service"): ...   who asked and through which face

The database is STATE/audit/audit.db (STATE: $CORRAL_STATE_DIR, else /var/lib/corral for
root, else ~/.local/share/corral), or `set_path()` (the service's --state-dir).
"""

from __future__ import annotations

import _thread
import atexit
import os
import stat
import sys as _sys
import time

from ..linux.rundir import state_dir

#: how long the process waits at exit for what is queued, seconds
EXIT_DEADLINE_S = 1.0

#: [face, actor]: the two ContextVars, made by the first acting_as (`corral run` never
#: makes them, so it loads neither _contextvars, an extension module, nor contextvars)
_vars: list = []
_vars_mu = _thread.allocate_lock()
_path: list[str | None] = [None]
_spooling = [False]   # use_spool()
_spooled: list[dict] = []   # this process's runs for the spool, until flush()


def enabled() -> bool:
    return os.environ.get("CORRAL_AUDIT", "1").strip().lower() not in ("0", "off", "false",
                                                                         "no")


def db_path() -> str:
    return _path[0] or os.path.join(state_dir(), "audit", "audit.db")


def set_path(path: str | None) -> None:
    """Write to (and read from) this database instead of the state directory's."""
    _path[0] = path


class acting_as:
    """`with acting_as("token:NAME", "service"):` sandboxes made inside record who asked."""

    def __init__(self, actor: str | None, face: str | None = None) -> None:
        self.actor, self.face = actor, face

    def __enter__(self):
        face, actor = _context_vars()
        self._tokens = (actor.set(self.actor), face.set(self.face or face.get()))
        return self

    def __exit__(self, *exc) -> None:
        face, actor = _vars
        actor.reset(self._tokens[0])
        face.reset(self._tokens[1])


def _context_vars() -> list:
    if not _vars:
        from _contextvars import ContextVar  # contextvars only re-exports it

        with _vars_mu:
            if not _vars:
                _vars.extend([ContextVar("corral_audit_face", default=None),
                              ContextVar("corral_audit_actor", default=None)])
    return _vars


def origin() -> tuple[str, str | None]:
    """(face, actor) of the caller: None actor is the local user (filled in by the
    writer)."""
    face = actor = None
    if _vars:   # else no acting_as has run in this process: nobody set them
        face, actor = _vars[0].get(), _vars[1].get()
    return (face or os.environ.get("CORRAL_AUDIT_FACE") or "api"), actor


def new_id() -> str:
    return "r-" + os.urandom(8).hex()


def record_run(run_id: str, started: float, result, *, policy, plan, argv, isolation: str,
               origin: tuple[str, str | None], sandbox: str | None = None,
               kind: str = "run", stdin=None, receipt: bool = False,
               ended: float | None = None, signed: dict | None = None) -> None:
    """Queue one run's (or one live command's) record. `result` is kept by reference:
    the writer reads it later, and appends the `audit` event to it if the record is lost;
    events the Result gets after this call (teardown) come with `record_events`.
    `ended`: when it ended (default: now); `signed`: a receipt already made and signed
    (by the node that ran a batch job), kept as it is."""
    if not enabled():
        return
    item = {"t": "run", "id": run_id, "db": db_path(), "started": started,
            "ended": time.time() if ended is None else ended,
            "result": result, "n_events": len(result.events), "policy": policy,
            "plan": plan, "argv": argv, "tier": isolation, "face": origin[0],
            "actor": origin[1], "sandbox": sandbox, "kind": kind, "stdin": stdin,
            "receipt": receipt, "signed": signed}
    if _spooling[0]:
        _spooled.append(item)
    else:
        _writer().put(item, result)


def record_refused(argv, error: str, message: str, field: str | None = None, *,
                   policy=None, isolation: str = "", who: tuple[str, str | None] | None = None
                   ) -> None:
    """Record a run corral refused before it started (verdict "refused", one
    events.RefusedEvent with the error's kind, field and message). Only on a refusal's
    path: a run that starts never comes here."""
    if not enabled():
        return
    from ..events import RefusedEvent
    from ..result import Result

    result = Result(verdict="refused", exit_code=None, signal=None,
                    isolation=isolation or getattr(policy, "isolation", "") or "",
                    events=[RefusedEvent(error, field, message).to_dict()])
    record_run(new_id(), time.time(), result, policy=policy, plan=None,
               argv=[str(a) for a in argv], isolation=result.isolation,
               origin=who or origin())


def record_events(run_id: str, events: list[dict]) -> None:
    if events and enabled():
        for item in _spooled:
            if item["id"] == run_id:   # a spooled run's teardown: in its own line
                item.setdefault("more", []).extend(events)
                return
        _writer().put({"t": "events", "id": run_id, "events": list(events)}, None)


def record_sandbox(sandbox_id: str, *, created: float, policy, isolation: str,
                   origin: tuple[str, str | None]) -> None:
    if enabled():
        _writer().put({"t": "sandbox", "id": sandbox_id, "created": created,
                       "policy": policy, "tier": isolation, "face": origin[0],
                       "actor": origin[1]}, None)


def record_sandbox_end(sandbox_id: str, ended_by: str, events: list[dict]) -> None:
    if enabled():
        _writer().put({"t": "sandbox_end", "id": sandbox_id, "ended": time.time(),
                       "ended_by": ended_by, "events": list(events)}, None)


def use_spool() -> None:
    """This process is short-lived (`corral run`): its runs' records are appended to the
    spool (audit/spool.py) at flush(), one line each, with no thread and no SQLite; the
    store ingests them when it is next opened."""
    _spooling[0] = True


def flush(timeout: float = EXIT_DEADLINE_S) -> bool:
    """Wait up to `timeout` s for every queued record to be written (or lost). False when
    some were still waiting: those are marked lost on their Results. Spooled records are
    appended now (a failed append: lost, and said on the Result)."""
    ok = _flush_spool()
    mod = _sys.modules.get("corral.audit.writer")   # no writer module: no writer
    w = mod.current() if mod is not None else None
    return ok if w is None else w.flush(timeout) and ok


def _flush_spool() -> bool:
    ok = True
    while _spooled:
        item = _spooled.pop(0)
        path = item.get("db") or db_path()
        try:
            f = cli_fields(item)
            f["events"].extend(item.get("more", ()))
            append(os.path.dirname(path), line_of(f))
        except Exception as e:   # noqa: BLE001 - a record is never worth a run
            ok = False
            from ..events import AuditEvent

            why, where = str(e) or type(e).__name__, os.path.dirname(path)
            why = why if where in why else f"{why} ({where}/spool)"
            item["result"].events.append(AuditEvent.lost(why).to_dict())
    return ok


def _writer():
    """This process's writer thread (audit/writer.py: threading and collections are
    imported there, off `corral run`'s path), started by the first record."""
    from .writer import writer

    return writer()


def _at_exit() -> None:
    flush(EXIT_DEADLINE_S)


# registered at import, before any sandbox's own exit hook: atexit runs hooks last in,
# first out, so this flush comes after the sandboxes left open were closed (their teardown
# events are records too)
atexit.register(_at_exit)


# The spool's writer side (audit/spool.py has the reader, `ingest`), here because this
# module is loaded anyway: `corral run` pays for what it imports and computes after its
# command has ended, so its line is made with what is already loaded. No json or _json
# (strings are quoted here; only one with a quote, a backslash or a non-printable
# character loads the C encoder), no hashlib, no policy.dump, no pwd: the policy goes in
# the cheap form `policy_form` gives ({} for the default policy) and the local user as
# its uid; `ingest` prints the TOML and digest every record holds and names the user,
# with the corral version that wrote the line (a record of another version says so in an
# `audit` event). A policy whose TOML this process made already (`--receipt` needs its
# digest) is written as that text.

#: the longest line one run writes (and ingest reads), bytes
LINE_MAX = 1 << 20
#: a long argv keeps this many bytes of it in a truncated record
ARGV_KEEP = 4096
SPOOL_NAME = "runs.jsonl"
#: the digest of no policy (a run refused before its policy was read): sha256 of b""
EMPTY_DIGEST = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def private_dir(path: str) -> str:
    """Make (0700) and check a directory of ours: a link, another owner or a group- or
    world-writable mode is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.makedirs(path, 0o700, exist_ok=True)
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory of this user (a link?): refused")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


_USERS: dict[int, str] = {}


def local_user(uid: int | None = None) -> str:
    uid = os.geteuid() if uid is None else uid
    name = _USERS.get(uid)
    if name is None:
        try:
            import pwd

            name = "user:" + pwd.getpwuid(uid).pw_name
        except (KeyError, ImportError, OverflowError):
            name = f"user:{uid}"
        _USERS[uid] = name
    return name


def _quote(s: str) -> str:
    """A JSON string, ASCII only (what _json.encode_basestring_ascii gives)."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    from _json import encode_basestring_ascii

    return encode_basestring_ascii(s)


def dumps(v) -> str:
    """Compact JSON of what records hold (dict, list, str, int, float, bool, None; any
    other value as its str), without importing json."""
    if isinstance(v, str):
        return _quote(v)
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return "null"
        return float.__repr__(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{_quote(str(k))}:{dumps(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    return _quote(str(v))


_DEFAULT: list = []   # [Policy()]


def corral_version() -> str:
    """corral.__version__: the package (a layer above this one) is loaded before any of
    its modules, so it is read, not imported."""
    return str(getattr(_sys.modules.get("corral"), "__version__", "unknown"))


def default_policy():
    """The default Policy(), one per process (a face that uses it, `corral run` without
    policy flags, has its record's policy_form found by identity, not by comparison)."""
    if not _DEFAULT:
        from ..policy.schema import Policy

        _DEFAULT.append(Policy())
    return _DEFAULT[0]


def policy_form(policy) -> dict:
    """The policy as ingest needs it to print its TOML (policy/dump.py `dump_form`): {}
    for the default policy, else {"values": {dotted key: value}, "secrets": [[name,
    source, hosts, ttl, plain_http], ...]} (a literal secret's value is never in it)."""
    if _DEFAULT and policy is _DEFAULT[0]:
        return {}
    from ..policy.schema import FIELDS

    # a policy with keys set by the user is written whole (making a Policy() to compare
    # it with costs ~0.1 ms cold); the API's Policy() is found by comparison
    if not policy.explicit and policy == default_policy():
        return {}
    values = {}
    for spec in FIELDS:
        obj = policy
        for part in spec.path.split("."):
            obj = getattr(obj, "pass_" if part == "pass" else part)
        if spec.kind == "workspace" and obj is not None:
            obj = [obj.path, obj.mode, obj.mount_at]
        elif isinstance(obj, (tuple, list, frozenset, set)):
            obj = [list(x) if isinstance(x, tuple) else x for x in obj]
        values[spec.path] = obj
    values.setdefault("image", policy.image)
    return {"values": values,
            "secrets": [[s.name, s.source, list(s.hosts), s.ttl, s.plain_http]
                        for s in policy.secrets]}


def image_digest(plan, policy) -> str:
    from ..plan import ImageRoot

    if plan is not None:
        roots = plan.find(ImageRoot)
        if roots and roots[0].digest:
            return roots[0].digest
    return "host" if getattr(policy, "image", "host") in (None, "host") else ""


def cli_fields(item: dict) -> dict:
    """The spool line's fields of one run of a short-lived process (spool.FIELDS, the
    policy text and digest left to ingest: "policy_form" and "version" in their place)."""
    r, policy = item["result"], item["policy"]
    spool = _sys.modules.get("corral.audit.spool")
    hit = spool._TOML.get(id(policy)) if spool is not None else None
    if policy is None:
        text, dig, form = "", EMPTY_DIGEST, None
    elif hit is not None and hit[0] is policy:   # made already (--receipt): as it is
        text, dig, form = hit[1], spool.digest(hit[1].encode()), None
    else:
        text, dig, form = "", "", policy_form(policy)
    usage = r.usage.to_dict() if hasattr(r.usage, "to_dict") else dict(r.usage)
    idig = image_digest(item["plan"], policy)
    f = {"id": item["id"], "kind": item["kind"], "sandbox": item["sandbox"],
         "started": item["started"], "ended": item["ended"], "tier": item["tier"],
         "image": str(getattr(policy, "image", "") or "host"),
         "image_digest": idig, "policy_digest": dig, "policy": text,
         "argv": list(item["argv"]), "verdict": r.verdict, "exit_code": r.exit_code,
         "signal": r.signal, "usage": usage, "actor": item["actor"] or "",
         "face": item["face"], "events": list(r.events[:item["n_events"]])}
    if form is not None:
        f["policy_form"] = form
        f["version"] = corral_version()
    if not item["actor"]:   # the local user: named by ingest (pwd costs ~0.1 ms here)
        f["uid"] = os.geteuid()
    return f


def line_of(fields: dict) -> bytes:
    """One spool line (newline included); past LINE_MAX, spool.line_of cuts it."""
    line = (dumps(fields) + "\n").encode("ascii")
    if len(line) <= LINE_MAX:
        return line
    from .spool import line_of as cut

    return cut(fields)


def append(audit_dir: str, line: bytes) -> None:
    """Append one line to the spool file: one write, on a regular file of ours, never
    through a link; raises OSError (or PermissionError) if it cannot."""
    import fcntl  # a C module: cheap

    d = private_dir(os.path.join(private_dir(audit_dir), "spool"))
    path = os.path.join(d, SPOOL_NAME)
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
             | os.O_NONBLOCK)
    for _ in range(8):
        fd = os.open(path, flags, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise PermissionError(f"{path} is not a regular file of this user: refused")
            # an ingest renames the file aside and then takes it exclusively: a writer
            # holds it shared and checks the name still leads to it, else takes the new one
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:   # an ingest has it (renamed aside): a new file
                continue
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                continue
            if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
                continue
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)
            n = os.write(fd, line)
            if n != len(line):
                raise OSError(f"a short write to {path} ({n} of {len(line)} bytes)")
            return
        finally:
            os.close(fd)
    raise OSError(f"{path} kept being renamed under this writer")
