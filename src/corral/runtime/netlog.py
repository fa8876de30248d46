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

Everything else goes to the list every command's Result takes its slice of (`net`).
"""

from __future__ import annotations

#: at a command's end, how long it waits at most for connections it may have opened to close
NET_WAIT_S = 0.5
#: connections tracked at once: past this, new ones are not waited for (a proxy has a
#: connection cap of its own, far lower)
MAX_TRACKED = 1 << 16


class NetLog:
    """The proxy's records, sorted: events into `net` (Results take slices) or, late ones,
    into `own` (the sandbox's events). Not thread-safe: the live sandbox's lock guards it."""

    def __init__(self, net: list[dict], own: list[dict]) -> None:
        self.net, self.own = net, own
        #: open connections: number -> (how many had opened before it, its command or None)
        self.conns: dict[int, tuple[int, object]] = {}
        self.opened = 0
        #: commands whose Result has not yet taken its events: handle -> (len(net), opened,
        #: dropped) when it started
        self.window: dict[object, tuple[int, int, int]] = {}
        #: the proxy's events not kept so far (EventLines.dropped, past its MAX_EVENTS over
        #: the sandbox's life): set by the reader; a Result whose command saw some says so
        self.dropped = 0

    def mark(self) -> tuple[int, int, int]:
        """Where a command about to start begins: pass it to `begin` once it started."""
        return len(self.net), self.opened, self.dropped

    def begin(self, handle, mark: tuple[int, int, int]) -> None:
        self.window[handle] = mark

    def take(self, records: list) -> None:
        """The proxy's records read so far (EventLines.records), in order; empties it."""
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
                    self.own.append(dict(ev, late=True, command=owner.pid, run=owner.run_id))
                else:
                    self.net.append(ev)
        records.clear()

    def pending(self, handle) -> bool:
        """Whether a connection opened since `handle` started, by it or by a command not
        known, is still open."""
        since = self.window.get(handle, (0, self.opened))[1]
        return any(seq >= since and owner in (None, handle)
                   for seq, owner in self.conns.values())

    def end(self, handle) -> list[dict]:
        """Copies of the events since `handle` started; later ones of its connections go
        to the sandbox's events."""
        start, _, dropped = self.window.pop(handle, (len(self.net), 0, self.dropped))
        out = [dict(e) for e in self.net[start:]]
        if self.dropped > dropped:    # never silently: the Result says events are missing
            from ..backends.host.launch import EventLines
            from ..events import TeardownEvent

            out.append(TeardownEvent(
                f"{self.dropped - dropped} events of the egress proxy while this command ran "
                f"were not kept (a live sandbox keeps at most {EventLines.MAX_EVENTS} over its "
                "life); the proxy enforced the policy on them all the same").to_dict())
        return out

    def drop(self, handle) -> None:
        """`handle` ended without taking its events (its supervision failed)."""
        self.window.pop(handle, None)
