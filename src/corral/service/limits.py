"""Per-token request rates for `corral serve`: a token bucket for each token.

A token with `rate` R (requests a second) and `burst` B may send B requests at once, then
R a second on average; the request past that is answered 429 with `Retry-After` (whole
seconds until the bucket holds a request again). Every authenticated request counts, on
the REST API and on /mcp alike, before its handler runs (a /metrics scrape too); /health and the OpenAPI
document carry no token and are not counted.

The other two limits of a token live where they are enforced: `max_sandboxes` (live
sandboxes at once) at create, `max_concurrent` (commands and cells running at once)
around each command (app.py). All three may be given per token (`corral token create
--rate 20/s --burst 40 --max-sandboxes K --max-concurrent C`) or for every token that
sets none in the server config's `[limits]` (config.py). Three bounds are the whole
server's, whatever the token: its open terminals (`[server] max_terminals`) and its
commands and cells running (`[server] max_running`), each holding a thread of the
server's own for as long as the sandbox's code likes (Gate); and its live sandboxes
(`[server] max_sandboxes`, Quota), each holding processes, memory and fds of the host.

Pure bookkeeping: a dict of buckets under one lock, a monotonic clock; nothing here knows
HTTP.
"""

from __future__ import annotations

import math
import re
import threading
import time

from ..errors import UsageError

RATE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*")
PER = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600,
       "hour": 3600}
RATE_MAX = 1_000_000.0        # requests a second: beyond this, "no limit" is the honest setting
BURST_MAX = 1_000_000


def parse_rate(text, field: str = "--rate") -> float:
    """"20/s", "600/min", "1000/h" (or a bare number: a second) -> requests a second."""
    if isinstance(text, bool):
        raise UsageError(f"{text!r} is not a rate; write N/s, N/min or N/h", field=field)
    if isinstance(text, (int, float)):
        n, per = float(text), 1
    else:
        m = RATE_RE.fullmatch(str(text))
        if m is None:
            try:
                n, per = float(str(text)), 1
            except ValueError:
                raise UsageError(f"{text!r} is not a rate; write N/s, N/min or N/h (e.g. "
                                 "20/s)", field=field) from None
        else:
            n, per = float(m.group(1)), PER[m.group(2)]
    rate = n / per
    if not (math.isfinite(rate) and 0 < rate <= RATE_MAX):
        raise UsageError(f"a rate is above 0 and at most {RATE_MAX:.0f}/s", field=field)
    return rate


def format_rate(rate: float) -> str:
    """The inverse of parse_rate, for `corral token ls`."""
    for unit, per in (("s", 1), ("min", 60), ("h", 3600)):
        n = rate * per
        if n >= 1 and abs(n - round(n)) < 1e-9:
            return f"{round(n)}/{unit}"
    return f"{rate:g}/s"


def check_burst(burst, field: str = "--burst") -> int:
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= BURST_MAX:
        raise UsageError(f"a burst is a whole number from 1 to {BURST_MAX}", field=field)
    return burst


def default_burst(rate: float) -> int:
    """The burst of a rate given without one: a second's worth, at least 1."""
    return max(1, min(BURST_MAX, math.ceil(rate)))


class Limited(Exception):
    """Over a limit: `field` names it, `retry_after` is whole seconds (at least 1)."""

    def __init__(self, field: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.field, self.message, self.retry_after = field, message, retry_after


class RateLimiter:
    """Token buckets keyed by token name. `admit(name, rate, burst)` takes one request
    from the bucket or raises Limited. A bucket's settings follow the token's record (read
    on each request), so a changed rate counts from the next request."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._mu = threading.Lock()
        self._buckets: dict[str, list[float]] = {}   # name -> [level, last time]

    def admit(self, name: str, rate: float | None, burst: int | None) -> None:
        if rate is None:
            return
        burst = burst or default_burst(rate)
        now = self._clock()
        with self._mu:
            b = self._buckets.get(name)
            if b is None:
                b = self._buckets[name] = [float(burst), now]
            level = min(float(burst), b[0] + (now - b[1]) * rate)
            b[1] = now
            if level >= 1.0:
                b[0] = level - 1.0
                return
            b[0] = level
        wait = (1.0 - level) / rate
        raise Limited("rate", f"this token sends more than its rate of {format_rate(rate)} "
                      f"(burst {burst}); retry in {wait:.2f} s", max(1, math.ceil(wait)))

    def forget(self, name: str) -> None:
        with self._mu:
            self._buckets.pop(name, None)


class Concurrency:
    """Operations of each token in flight (commands, cells, creates), over the REST API
    and /mcp alike: `slot(name, most)` is a context manager that raises Limited when the
    token already has `most` running."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._busy: dict[str, int] = {}

    def enter(self, name: str, most: int | None) -> None:
        with self._mu:
            n = self._busy.get(name, 0)
            if most is not None and n >= most:
                raise Limited("max_concurrent", f"this token has {n} operations running, "
                              "its max_concurrent", 1)
            self._busy[name] = n + 1

    def leave(self, name: str) -> None:
        with self._mu:
            n = self._busy.get(name, 1) - 1
            if n > 0:
                self._busy[name] = n
            else:
                self._busy.pop(name, None)

    def running(self, name: str) -> int:
        with self._mu:
            return self._busy.get(name, 0)

    def slot(self, name: str, most: int | None):
        return _Slot(self, name, most)


class _Slot:
    def __init__(self, owner: Concurrency, name: str, most: int | None) -> None:
        self.owner, self.name, self.most = owner, name, most

    def __enter__(self):
        self.owner.enter(self.name, self.most)
        return self

    def __exit__(self, *exc) -> None:
        self.owner.leave(self.name)


class Gate:
    """A bound of the whole server, whichever token asks: `slot()` is a context manager
    holding one of `most` places (Limited past them, naming `field`). For what holds the
    server's own threads and fds as long as a client or the sandbox's code likes: open
    terminals (config `max_terminals`), which a token without max_concurrent could
    otherwise open without end, exhausting the server for every tenant."""

    def __init__(self, most: int, field: str, what: str, retry_after: int = 5) -> None:
        self.most, self.field, self.what, self.retry_after = most, field, what, retry_after
        self._mu = threading.Lock()
        self._held = 0

    def enter(self) -> None:
        with self._mu:
            if self._held >= self.most:
                raise Limited(self.field, f"the server holds {self.most} {self.what}, its "
                              f"{self.field} (every token's together); end one or retry "
                              "later", self.retry_after)
            self._held += 1

    def leave(self) -> None:
        with self._mu:
            self._held = max(0, self._held - 1)

    @property
    def held(self) -> int:
        with self._mu:
            return self._held

    def slot(self):
        return _GateSlot(self)

    def hold(self) -> "Held":
        """One place taken now (Limited past them), given back by `Held.release()`,
        which counts once however often it is called: for what ends in another thread
        (a background command's end, a cell's), whichever way it ends."""
        self.enter()
        return Held(self)


class Held:
    def __init__(self, gate: Gate) -> None:
        self._gate, self._mu, self._done = gate, threading.Lock(), False

    def release(self) -> None:
        with self._mu:
            if self._done:
                return
            self._done = True
        self._gate.leave()


class Both:
    """Two slots held together (a token's max_concurrent and a Gate of the server):
    entered in order, the first given back if the second is refused; left together."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second

    def __enter__(self):
        self.first.__enter__()
        try:
            self.second.__enter__()
        except BaseException:
            self.first.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.second.__exit__(None, None, None)
        finally:
            self.first.__exit__(None, None, None)


class _GateSlot:
    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def __enter__(self):
        self.gate.enter()
        return self

    def __exit__(self, *exc) -> None:
        self.gate.leave()


class Quota:
    """max_sandboxes, counted with the creates still under way: `reserve(name, most,
    have)` (have: a function giving the token's live sandboxes now) holds one place while
    a sandbox is made, so ten creates at once cannot all pass a check that saw room for
    one. Raises Limited when the live ones and those being made reach `most`.

    `Quota(server_most, server_have)` also bounds every token's together (the server's
    `[server] max_sandboxes`; server_have gives the server's live sandboxes now): an idle
    live sandbox holds processes, memory and fds of the host's, so tokens without
    max_sandboxes (or many tokens) must not make them until the host has none left. A
    sandbox's place is given back when it leaves the live count (killed, timed out,
    ended by itself)."""

    def __init__(self, server_most: int | None = None, server_have=None,
                 whose: str = "the server holds {} live sandboxes (or is making them), its "
                              "max_sandboxes (every token's together)") -> None:
        self._mu = threading.Lock()
        self._pending: dict[str, int] = {}
        self.server_most, self.server_have = server_most, server_have
        self.whose = whose      # the refusal's words for server_most

    def reserve(self, name: str, most: int | None, have):
        return _Reservation(self, name, most, have)

    @property
    def making(self) -> int:
        """Creates under way now, every token's (each holds a place)."""
        with self._mu:
            return sum(self._pending.values())


class _Reservation:
    def __init__(self, quota: Quota, name: str, most: int | None, have) -> None:
        self.q, self.name, self.most, self.have = quota, name, most, have

    def __enter__(self):
        q = self.q
        with q._mu:
            pending = q._pending.get(self.name, 0)
            if self.most is not None and self.have() + pending >= self.most:
                raise Limited("max_sandboxes", f"this token holds {self.most} sandboxes "
                              "(or is making them), its max_sandboxes; kill one first", 5)
            if q.server_most is not None and \
                    q.server_have() + sum(q._pending.values()) >= q.server_most:
                raise Limited("max_sandboxes", q.whose.format(q.server_most)
                              + "; kill one or retry later", 5)
            q._pending[self.name] = pending + 1
        return self

    def __exit__(self, *exc) -> None:
        with self.q._mu:
            n = self.q._pending.get(self.name, 1) - 1
            if n > 0:
                self.q._pending[self.name] = n
            else:
                self.q._pending.pop(self.name, None)
