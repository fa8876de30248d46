"""The service's sandboxes, behind a small interface, so the live sandbox (one bwrap for
a sandbox's life, background commands) slots in by replacing `open_sandbox`.

A sandbox object the service holds needs: `exec(argv, stdin=bytes|None, timeout=s) ->
Result`, `files` (read/write/list as runtime.files.Files), `run_code(code, language=,
timeout=) -> Execution`, `isolation`, `policy`, `close()`. corral.Sandbox has all of them.
"""

from __future__ import annotations

import secrets
import threading
import time


def open_sandbox(policy):
    """A sandbox for `policy`, open. Replace this (or pass `opener` to Registry) with the
    live sandbox's Sandbox.create when it lands."""
    from ..runtime.sandbox import Sandbox

    return Sandbox(policy).open()


class Entry:
    """One sandbox the service holds: its id, owner (a token's name), the object itself,
    and a lock that serializes the calls into it."""

    def __init__(self, sid: str, owner: str, sandbox, policy) -> None:
        self.id = sid
        self.owner = owner
        self.sandbox = sandbox
        self.policy = policy
        self.created = time.time()
        self.lock = threading.Lock()          # commands and code, one at a time
        self.files_lock = threading.Lock()    # files calls: they need not wait for a command


class Registry:
    def __init__(self, opener=open_sandbox) -> None:
        self._opener = opener
        self._by_id: dict[str, Entry] = {}
        self._mu = threading.Lock()

    def create(self, owner: str, policy) -> Entry:
        sb = self._opener(policy)
        e = Entry("sb_" + secrets.token_hex(8), owner, sb, policy)
        with self._mu:
            self._by_id[e.id] = e
        return e

    def get(self, owner: str, sid: str) -> Entry | None:
        """The sandbox `sid` if `owner` holds it; None for another owner's, as for none."""
        with self._mu:
            e = self._by_id.get(sid)
        return e if e is not None and e.owner == owner else None

    def list(self, owner: str) -> list[Entry]:
        with self._mu:
            return [e for e in self._by_id.values() if e.owner == owner]

    def count(self, owner: str | None = None) -> int:
        with self._mu:
            return sum(1 for e in self._by_id.values() if owner is None or e.owner == owner)

    def remove(self, owner: str, sid: str) -> bool:
        with self._mu:
            e = self._by_id.get(sid)
            if e is None or e.owner != owner:
                return False
            del self._by_id[sid]
        _close(e)
        return True

    def close_all(self) -> int:
        with self._mu:
            entries, self._by_id = list(self._by_id.values()), {}
        for e in entries:
            _close(e)
        return len(entries)


def _close(e: Entry) -> None:
    with e.lock, e.files_lock:
        e.sandbox.close()
