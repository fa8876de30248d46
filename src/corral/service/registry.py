"""The service's sandboxes: live sandboxes (corral.Sandbox.create, runtime/live.py), one
bwrap for each sandbox's life, held by this process, each with its token's name as owner.

A sandbox object the service holds needs what runtime.live.Live has: `commands` (run,
list), `exec`, `files`, `pty`, `run_code`, `set_timeout`, `get_info`, `kill`, the review
calls (`changes`, `changes_patch`, `apply_changes`, `discard_changes`), `events`,
`isolation`, `policy`. `Registry(opener=...)` takes another opener(policy, timeout=,
metadata=) for tests of the faces.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time

from .commands import CommandTable
from .events import EventLog

log = logging.getLogger("corral.serve")

#: a sandbox's life when the request names none (seconds), as Sandbox.create's default
DEFAULT_TIMEOUT_S = 300.0


def open_sandbox(policy, *, timeout: float = DEFAULT_TIMEOUT_S, metadata=None,
                 user_account: bool = False):
    """A live sandbox for `policy`, running (`user_account`: with an unprivileged account
    beside its root, runtime/sandbox.Sandbox.create)."""
    from ..runtime.sandbox import Sandbox

    if user_account:
        return Sandbox.create(policy, timeout=timeout, metadata=metadata, user_account=True)
    return Sandbox.create(policy, timeout=timeout, metadata=metadata)


def owner_name(owner: str) -> str:
    """The token's name in an owner key ("NAME/ID"; the audit store's actor is by name)."""
    return owner.partition("/")[0]


class Entry:
    """One sandbox the service holds: its id, owner (a token's `owner`, "NAME/ID": its
    name and its own id, so a new token of a revoked one's name owns none of its
    sandboxes; `owner_name` is the name alone, for logs and pages), the object itself,
    its commands (service.commands), its event log, and the locks of the calls that must
    not overlap (code cells; files calls)."""

    def __init__(self, sid: str, owner: str, sandbox, policy) -> None:
        self.id = sid
        self.owner = owner
        self.owner_name = owner_name(owner)
        self.sandbox = sandbox
        self.policy = policy
        self.policy_json: dict | None = None   # its view (common.view), made once
        #: the sandbox's own creation (its get_info().created, where its timeout began):
        #: a token's max_lifetime counts from it, not from this entry's making after it
        born = getattr(sandbox, "created", None)
        self.created = born if isinstance(born, (int, float)) else time.time()
        self.lock = threading.Lock()          # run_code cells, one at a time
        self.files_lock = threading.Lock()    # files calls (one Files object)
        self.events = EventLog()
        self.commands = CommandTable(self)


class Registry:
    def __init__(self, opener=open_sandbox) -> None:
        self._opener = opener
        self._by_id: dict[str, Entry] = {}
        self._mu = threading.Lock()

    def create(self, owner: str, policy, *, timeout: float = DEFAULT_TIMEOUT_S,
               metadata=None, user_account: bool = False, face: str | None = None) -> Entry:
        """`face`: the audit store's name for the API it came through ("e2b"; else
        CORRAL_AUDIT_FACE, "mcp" for corral mcp, or "service")."""
        from ..audit.record import acting_as

        face = face or os.environ.get("CORRAL_AUDIT_FACE") or "service"
        with acting_as(None if face == "mcp" else f"token:{owner_name(owner)}", face):   # the audit store
            extra = {"user_account": True} if user_account else {}
            sb = self._opener(policy, timeout=timeout, metadata=metadata, **extra)
        sid = getattr(sb, "id", None) or "sb_" + secrets.token_hex(8)
        e = Entry(sid, owner, sb, policy)
        e.events.add("sandbox.created", {"id": sid, "isolation": sb.isolation})
        # its log a reader of the proxy's events from the start: a stream opened later
        # still has them (runtime/netlog.py keeps them for it, bounded)
        e.events.pull(sb)
        with self._mu:
            self._by_id[e.id] = e
        return e

    def get(self, owner: str, sid: str) -> Entry | None:
        """The sandbox `sid` if `owner` holds it and it runs; None for another owner's, as
        for none. One that ended by itself (its timeout, its init) is forgotten here."""
        with self._mu:
            e = self._by_id.get(sid)
        if e is None or e.owner != owner:
            return None
        if _ended(e):
            self._forget(e)
            return None
        return e

    def running(self, owner: str, sid: str) -> Entry | None:
        """get(owner, sid) for a sandbox that runs; None for any other (one that ended is
        left for get to forget): never blocks for more than the dict lookup, so an event
        loop may call it."""
        with self._mu:
            e = self._by_id.get(sid)
        if e is None or e.owner != owner or _ended(e):
            return None
        return e

    def list(self, owner: str) -> list[Entry]:
        with self._mu:
            mine = [e for e in self._by_id.values() if e.owner == owner]
        for e in [e for e in mine if _ended(e)]:
            self._forget(e)
        return [e for e in mine if not _ended(e)]

    def all(self) -> list[Entry]:
        with self._mu:
            return list(self._by_id.values())

    def count(self, owner: str | None = None) -> int:
        with self._mu:
            return sum(1 for e in self._by_id.values()
                       if (owner is None or e.owner == owner) and not _ended(e))

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

    def _forget(self, e: Entry) -> None:
        with self._mu:
            if self._by_id.get(e.id) is e:
                del self._by_id[e.id]
        _close(e)


def _ended(e: Entry) -> bool:
    return getattr(e.sandbox, "state", "running") == "ended"


def _close(e: Entry) -> None:
    """End it: kill first (no lock: a command or cell in flight fails at once rather than
    holding the end up), then close what the files calls hold."""
    kill = getattr(e.sandbox, "kill", None)
    if kill is not None:
        kill()
    e.events.add("sandbox.ended", {"id": e.id, "by": _ended_by(e)})
    e.events.close()
    e.commands.close()
    with e.files_lock:
        e.sandbox.close()


def _ended_by(e: Entry) -> str | None:
    try:
        return e.sandbox.get_info().ended_by
    except Exception:   # noqa: BLE001 - not a live sandbox
        return None
