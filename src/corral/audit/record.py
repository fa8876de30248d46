"""The audit store's hook on the run path: cheap, never failing, never waiting.

Every face (corral run, corral.run, Sandbox.exec, live sandboxes and their commands, the
service, MCP, the probe) hands what it ran to `record_run` here. Nothing is written on the
caller's thread: the record (references to the Result, policy and plan, no copies) goes on
a bounded queue that one background thread per process (`corral-audit`) drains in batches
into SQLite (audit/store.py; the thread imports sqlite3, so `corral run` never does on its
own path). When the store cannot keep a record (the database locked past its busy timeout,
a full disk, a full queue, the exit deadline) the run is unaffected and its Result gets an
`audit` event (events.AuditEvent) saying the record was lost.

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
import time
from _contextvars import ContextVar  # contextvars only re-exports it
from collections import deque

from ..linux.rundir import state_dir

#: records waiting for the writer at most; past it a record is dropped (and said so).
#: Each holds its Result (up to limits.output per stream) until written.
QUEUE_MAX = 1000
#: records the writer puts in one transaction at most
BATCH_MAX = 500
#: how long the writer lets records gather before a transaction, seconds (a flush does
#: not wait for it)
LINGER_S = 0.05
#: how long the writer waits for a lock another connection holds, seconds
BUSY_TIMEOUT_S = 0.25
#: how long the process waits at exit for what is queued, seconds
EXIT_DEADLINE_S = 1.0

_face: ContextVar[str | None] = ContextVar("corral_audit_face", default=None)
_actor: ContextVar[str | None] = ContextVar("corral_audit_actor", default=None)
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
        self._tokens = (_actor.set(self.actor), _face.set(self.face or _face.get()))
        return self

    def __exit__(self, *exc) -> None:
        _actor.reset(self._tokens[0])
        _face.reset(self._tokens[1])


def origin() -> tuple[str, str | None]:
    """(face, actor) of the caller: None actor is the local user (filled in by the
    writer)."""
    return (_face.get() or os.environ.get("CORRAL_AUDIT_FACE") or "api"), _actor.get()


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
    w = _writers.get(os.getpid())
    return ok if w is None else w.flush(timeout) and ok


def _flush_spool() -> bool:
    ok = True
    while _spooled:
        item = _spooled.pop(0)
        path = item.get("db") or db_path()
        try:
            from . import spoolw  # lean: the policy's TOML is made at ingest

            f = spoolw.cli_fields(item)
            f["events"].extend(item.get("more", ()))
            spoolw.append(os.path.dirname(path), spoolw.line_of(f))
        except Exception as e:   # noqa: BLE001 - a record is never worth a run
            ok = False
            from ..events import AuditEvent

            why, where = str(e) or type(e).__name__, os.path.dirname(path)
            why = why if where in why else f"{why} ({where}/spool)"
            item["result"].events.append(AuditEvent.lost(why).to_dict())
    return ok


class _Writer:
    def __init__(self) -> None:
        import threading  # after the first run, not before it (the run path's imports)

        self.queue: deque = deque()
        self.cv = threading.Condition()
        self.busy = False
        self.flushing = 0
        self.conns: dict = {}    # database path -> connection
        self.lost = 0
        self.thread = threading.Thread(target=self._loop, daemon=True, name="corral-audit")
        self.thread.start()

    def put(self, item: dict, result) -> None:
        item["db"] = db_path()
        with self.cv:
            if len(self.queue) < QUEUE_MAX:
                self.queue.append(item)
                self.cv.notify()
                return
        self._lose([item], f"the writer's queue is full ({QUEUE_MAX} records waiting)")

    def flush(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cv:
            self.flushing += 1
            self.cv.notify_all()
            while self.queue or self.busy:
                left = end - time.monotonic()
                if left <= 0:
                    dropped = list(self.queue)
                    self.queue.clear()
                    break
                self.cv.wait(left)
            else:
                self.flushing -= 1
                return True
            self.flushing -= 1
        self._lose(dropped, f"not written within the {timeout:g}s exit deadline")
        return False

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.queue:
                    self.cv.wait()
                linger = time.monotonic() + LINGER_S   # let a batch gather
                while (not self.flushing and len(self.queue) < BATCH_MAX
                       and (left := linger - time.monotonic()) > 0):
                    self.cv.wait(left)
                batch = [self.queue.popleft() for _ in range(min(len(self.queue),
                                                                 BATCH_MAX))]
                self.busy = True
            try:
                by_db: dict[str, list] = {}
                for item in batch:
                    by_db.setdefault(item["db"], []).append(item)
                for path, items in by_db.items():
                    self._write(path, items)
            finally:
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()

    def _write(self, path: str, batch: list[dict]) -> None:
        try:
            from . import store

            conn = self.conns.get(path)
            if conn is None:
                conn = self.conns[path] = store.connect(path, busy_timeout=BUSY_TIMEOUT_S)
            store.write_batch(conn, batch)
        except Exception as e:   # noqa: BLE001 - a record is never worth a run
            self._lose(batch, f"{str(e) or type(e).__name__} ({path})")
            conn = self.conns.pop(path, None)
            if conn is not None:
                try:
                    conn.close()
                except Exception:   # noqa: BLE001
                    pass

    def _lose(self, items: list[dict], why: str) -> None:
        from ..events import AuditEvent

        self.lost += len(items)
        for item in items:
            result = item.get("result")
            if result is not None:
                result.events.append(AuditEvent.lost(why).to_dict())


_writers: dict[int, _Writer] = {}
_writers_mu = _thread.allocate_lock()


def _writer() -> _Writer:
    pid = os.getpid()
    w = _writers.get(pid)
    if w is None:
        with _writers_mu:
            w = _writers.get(pid)
            if w is None:
                w = _writers[pid] = _Writer()
    return w


def _at_exit() -> None:
    flush(EXIT_DEADLINE_S)


# registered at import, before any sandbox's own exit hook: atexit runs hooks last in,
# first out, so this flush comes after the sandboxes left open were closed (their teardown
# events are records too)
atexit.register(_at_exit)
