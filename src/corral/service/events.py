"""A sandbox's events as the service streams them (GET /sandboxes/{id}/events, SSE).

Three sources, in one numbered sequence: the service's own (sandbox.created,
command.started, command.ended with its verdict, sandbox.ended), the egress proxy's events
of the sandbox (each connection allowed or denied, with the rule; one whose event came
after its command's Result was made says so, "late": true, and names the command: "command",
its pid, and "run"),
and the sandbox's own (its teardown, and why it ended). Everything from the proxy and the sandbox is data the
sandbox's code influenced: it goes out as JSON only, never as an SSE field of its own. At
most MAX_EVENTS are kept (the oldest then go, counted in `dropped`). The proxy's come from
the live sandbox's NetLog (runtime/netlog.py), which keeps them for this log, one of its
readers, until it pulls them (bounded: past its cap a marker says how many it missed).
"""

from __future__ import annotations

import threading
import time

from .notify import Notifier

MAX_EVENTS = 10_000


class EventLog:
    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._items: list[tuple[int, str, dict]] = []
        self._next = 0
        self.dropped = 0
        self.closed = False
        self.notifier = Notifier()
        self._pull_mu = threading.Lock()
        self._own_seen = 0

    def add(self, kind: str, data: dict) -> None:
        with self._mu:
            if self.closed:
                return
            self._items.append((self._next, kind, dict(data, time=time.time())))
            self._next += 1
            if len(self._items) > MAX_EVENTS:
                del self._items[0]
                self.dropped += 1
        self.notifier.notify()

    def pull(self, sb) -> None:
        """Take in what the sandbox's proxy and the sandbox itself logged since the last
        pull (runtime.live keeps both; a non-live sandbox has neither). The first pull
        makes this log a reader of the proxy's events (runtime/netlog.py): the live
        sandbox keeps them until it has read them (at most netlog.MAX_EVENTS not read;
        past that a marker says how many it missed). Registry.create pulls once at once."""
        netlog = getattr(sb, "_netlog", None)
        own = getattr(sb, "events", None)
        with self._pull_mu:     # one pull at a time: their events in order
            new = [("network", e) for e in netlog.read(self)] if netlog is not None else []
            if isinstance(own, list) and len(own) > self._own_seen:
                # a proxy event that came after its command's Result (runtime/netlog.py)
                # is the sandbox's own now, but still a "network" event
                new += [("network" if e.get("late") is True else "sandbox", dict(e))
                        for e in own[self._own_seen:]]
                self._own_seen = len(own)
            for kind, e in new:
                self.add(kind, e)

    def since(self, seq: int) -> list[tuple[int, str, dict]]:
        with self._mu:
            return [x for x in self._items if x[0] >= seq]

    def close(self) -> None:
        with self._mu:
            self.closed = True
        self.notifier.notify()
