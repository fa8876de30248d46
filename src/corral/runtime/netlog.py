"""A live sandbox's events from its egress proxy, and the command each belongs to.

The proxy writes a connection's event when the connection ends (a denial at once), which
can come after the command that made it has exited: the kernel closes the command's socket
at its exit, and the proxy sees that a moment later. So the proxy also says which of its
client connections are open (egress/server.py, track_conns: {"open": N} when one starts,
{"closed": N} after its last event, and "conn": N on each event; backends/host/launch.py's
EventLines hands them over in order). With that:

- at a command's end, `pending` says whether a connection opened since it started is still
  open; only then does the command wait (at most NET_WAIT_S) for the proxy to close it, so
  a command that used no network waits for nothing;
- an event that still comes after its command's Result was made (a child kept the socket
  open past NET_WAIT_S; the proxy accepted the connection only after the command's exit)
  is not lost: it goes to the sandbox's own events (`sb.events`; the service's event
  stream, as kind "network") with "late": true, "command" (its pid inside) and "run" (its
  run id), when the command is known: the one command running when the connection opened
  (else it stays with the others, and the next Result to take its slice has it).

Everything else goes to the list every command's Result takes its slice of (`net`), which
the service's event stream reads too (`read`, for each reader its position). Positions in
it are absolute (`base` is the number of net[0]): what every taker has taken is trimmed
from its front, so a long-lived sandbox that makes many connections keeps only what some
command's Result or reader has yet to take. At most MAX_EVENTS of those are kept (memory):
past that, the oldest go if only a reader still needs them (it gets a marker of how many
it missed at its next read), else the new ones are only counted (`dropped`), and the
Results of the commands running then and the readers say how many.
"""

from __future__ import annotations

import threading

from ..events import TeardownEvent

#: at a command's end, how long it waits at most for connections it may have opened to close
NET_WAIT_S = 0.5
#: connections tracked at once: past this, new ones are not waited for (a proxy has a
#: connection cap of its own, far lower)
MAX_TRACKED = 1 << 16
#: the proxy's events a live sandbox keeps that a command's Result or a reader has yet to
#: take; and, over its life, the late ones it puts in the sandbox's events
MAX_EVENTS = 10_000


class NetLog:
    """The proxy's records, sorted: events into `net` (Results take slices, readers read
    on) or, late ones, into `own` (the sandbox's events). Thread-safe: a lock of its own,
    held only for list work (a reader on an event loop never waits for the sandbox's)."""

    def __init__(self, own: list[dict]) -> None:
        self._mu = threading.Lock()
        self.net: list[dict] = []
        self.own = own
        #: the absolute number of net[0]: the events before it were taken by all
        self.base = 0
        #: open connections: number -> (how many had opened before it, its command or None)
        self.conns: dict[int, tuple[int, object]] = {}
        self.opened = 0
        #: commands whose Result has not yet taken its events: handle -> (the absolute
        #: number of the first event it may take, opened, dropped) when it started
        self.window: dict[object, tuple[int, int, int]] = {}
        #: who else reads them (the service's event stream): key -> (the absolute number
        #: of the next event it reads, dropped when it last read)
        self.readers: dict[object, tuple[int, int]] = {}
        #: the proxy's events not kept so far (past MAX_EVENTS): the Results of commands
        #: that saw some, and the readers, say so
        self.dropped = 0
        #: late events put in `own` (never trimmed: it is the sandbox's public list)
        self.late = 0

    def begin(self, handle) -> None:
        """`handle` is about to start: its Result takes the events from here on (its
        start fails: `drop`)."""
        with self._mu:
            self.window[handle] = (self.base + len(self.net), self.opened, self.dropped)

    def tell(self, ev: dict) -> None:
        """An event of the sandbox for the Results of the commands running now and the
        readers (the proxy died): always kept."""
        with self._mu:
            self.net.append(ev)

    def take(self, records: list) -> None:
        """The proxy's records read so far (EventLines.records), in order; empties it."""
        with self._mu:
            for op, n, ev in records:
                if op == "open":
                    if len(self.conns) < MAX_TRACKED:
                        owner = next(iter(self.window)) if len(self.window) == 1 else None
                        self.conns[n] = (self.opened, owner)
                    self.opened += 1
                elif op == "closed":
                    self.conns.pop(n, None)
                else:
                    owner = self.conns.get(n, (0, None))[1] if n is not None else None
                    if owner is not None and owner not in self.window:
                        # its command's Result is made: the sandbox's events get it
                        self._keep_late(dict(ev, late=True, command=owner.pid,
                                             run=owner.run_id))
                    else:
                        self._keep(ev)
            records.clear()

    def _keep(self, ev: dict) -> None:
        if len(self.net) >= MAX_EVENTS:
            # the oldest goes if no command's Result needs it (a reader is told at its next
            # read), else this one is only counted (and said by the Results and readers)
            held = min((w[0] for w in self.window.values()), default=None)
            if held is not None and held <= self.base:
                self.dropped += 1
                return
            del self.net[0]
            self.base += 1
        self.net.append(ev)

    def _keep_late(self, ev: dict) -> None:
        if self.late < MAX_EVENTS:
            self.own.append(ev)
        elif self.late == MAX_EVENTS:
            self.own.append(TeardownEvent(
                "further events of the egress proxy that came after their command's Result "
                f"are not kept (a live sandbox keeps at most {MAX_EVENTS} over its life); "
                "the proxy enforced the policy on them all the same").to_dict())
        self.late += 1

    def pending(self, handle) -> bool:
        """Whether a connection opened since `handle` started, by it or by a command not
        known, is still open."""
        with self._mu:
            since = self.window.get(handle, (0, self.opened))[1]
            return any(seq >= since and owner in (None, handle)
                       for seq, owner in self.conns.values())

    def end(self, handle) -> list[dict]:
        """Copies of the events since `handle` started; later ones of its connections go
        to the sandbox's events."""
        with self._mu:
            start, _, dropped = self.window.pop(handle, (self.base + len(self.net), 0,
                                                         self.dropped))
            out = [dict(e) for e in self.net[start - self.base:]]
            if self.dropped > dropped:   # never silently: the Result says events are missing
                out.append(TeardownEvent(
                    f"{self.dropped - dropped} events of the egress proxy while this command "
                    f"ran were not kept (a live sandbox keeps at most {MAX_EVENTS} that a "
                    "command's Result or the event stream has yet to take); the proxy "
                    "enforced the policy on them all the same").to_dict())
            self._trim()
            return out

    def drop(self, handle) -> None:
        """`handle` ended without taking its events (its supervision failed)."""
        with self._mu:
            self.window.pop(handle, None)
            self._trim()

    def read(self, reader) -> list[dict]:
        """Copies of the events `reader` has not read yet (its first read: all there are),
        after a marker of how many went before it read them, and before one of how many
        were not kept since its last read."""
        with self._mu:
            pos, seen = self.readers.get(reader, (0, 0))
            out = []
            if pos < self.base:
                out.append(TeardownEvent(
                    f"{self.base - pos} events of the egress proxy went before this stream "
                    f"read them (a live sandbox keeps at most {MAX_EVENTS} that a command's "
                    "Result or the event stream has yet to take, and the oldest go first if "
                    "only the stream needs them)").to_dict())
                pos = self.base
            out += [dict(e) for e in self.net[pos - self.base:]]
            if self.dropped > seen:
                out.append(TeardownEvent(
                    f"{self.dropped - seen} events of the egress proxy were not kept (a live "
                    f"sandbox keeps at most {MAX_EVENTS} that a command's Result or the event "
                    "stream has yet to take); the proxy enforced the policy on them all the "
                    "same").to_dict())
            self.readers[reader] = (self.base + len(self.net), self.dropped)
            self._trim()
            return out

    def _trim(self) -> None:
        """Drop what every command's Result and every reader has taken."""
        upto = min([w[0] for w in self.window.values()]
                   + [r[0] for r in self.readers.values()],
                   default=self.base + len(self.net))
        if upto > self.base:
            del self.net[:upto - self.base]
            self.base = upto
