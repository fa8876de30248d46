"""The audit store's writer thread (one per process), for the long-lived faces: records
queued by audit/record.py are written into SQLite in batches, off the caller's thread.
`corral run` never loads this module (its record goes to the spool at exit)."""

from __future__ import annotations

import _thread
import os
import threading
import time
from collections import deque

from .record import db_path

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


class _Writer:
    def __init__(self) -> None:
        self.queue: deque = deque()
        self.cv = threading.Condition()
        self.busy = False
        self.flushing = 0
        self.conns: dict = {}    # database path -> connection
        self.lost = 0
        self.thread = threading.Thread(target=self._loop, daemon=True, name="corral-audit")
        self.thread.start()

    def put(self, item: dict, result) -> None:
        if "db" not in item:    # record_run's has it already
            item["db"] = db_path()
        with self.cv:
            if len(self.queue) < QUEUE_MAX:
                self.queue.append(item)
                # the writer waits for a first record, or lingers for a batch until
                # BATCH_MAX or its deadline: waking it at every record in between (a
                # thread switch and the GIL handed over twice) cost a batch's driver
                # ~0.1 ms a job
                if len(self.queue) == 1 or len(self.queue) >= BATCH_MAX:
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


def current() -> _Writer | None:
    """This process's writer, if it started one (a forked child has none of its own)."""
    return _writers.get(os.getpid())


def writer() -> _Writer:
    pid = os.getpid()
    w = _writers.get(pid)
    if w is None:
        with _writers_mu:
            w = _writers.get(pid)
            if w is None:
                w = _writers[pid] = _Writer()
    return w
