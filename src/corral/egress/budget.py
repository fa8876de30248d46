"""Per-domain byte and request budgets: what is left, and what one more request costs. Pure.

A `Budgets` holds one proxy's usage per budget key (`Decision.budget_key`: the canonical
host, or "*.suffix" for all the names one wildcard rule lets through), summed over every
connection, against the one `Budget` of its NetConfig (None = unlimited). It only counts
and answers; the byte pumps (relay.py) ask `room` before they move bytes and `count` what
they moved, and cut the connection when there is no room.

- `take_request(key)`: a new request (a CONNECT tunnel, a plain-HTTP request, each request
  after the first on a terminated connection) is refused once *any* budget of its key is
  used up, so a host whose bytes_in are spent cannot be asked again; otherwise it takes one
  from `requests`.
- `room(key, direction)`: how many more bytes may go that way (0 when spent).
- `count(key, direction, n)`: n bytes went that way.
- `refund(key, direction, n)`: n bytes counted ahead did not go (a relay thread's unused
  grant: relay.py sets a slice of the room aside for a bulk flow's thread).

No sockets, no asyncio, no clock (tests/unit/test_egress_budget.py drives it with tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .config import Budget

#: the two byte budgets, named as Budget's and Usage's fields
Direction = Literal["bytes_out", "bytes_in"]
DIRECTIONS: tuple[Direction, ...] = ("bytes_out", "bytes_in")


@dataclass
class Usage:
    """What one budget key used so far."""

    bytes_out: int = 0
    bytes_in: int = 0
    requests: int = 0


class Budgets:
    """Usage per budget key against one Budget."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._usage: dict[str, Usage] = {}

    def usage(self, key: str) -> Usage:
        """A copy of what `key` used so far (zeros for a key never seen)."""
        u = self._usage.get(key)
        return Usage() if u is None else Usage(u.bytes_out, u.bytes_in, u.requests)

    def take_request(self, key: str) -> str | None:
        """Take one request for `key`; or, without taking it, the reason it is refused
        ("budget: requests", "budget: bytes_out" or "budget: bytes_in", checked in that
        order)."""
        b = self.budget
        u = self._usage.setdefault(key, Usage())
        if b.requests is not None and u.requests >= b.requests:
            return "budget: requests"
        if b.bytes_out is not None and u.bytes_out >= b.bytes_out:
            return "budget: bytes_out"
        if b.bytes_in is not None and u.bytes_in >= b.bytes_in:
            return "budget: bytes_in"
        u.requests += 1
        return None

    def room(self, key: str, direction: Direction) -> int | None:
        """How many more bytes `key` may move in `direction`; None when unlimited."""
        limit = getattr(self.budget, _checked(direction))
        if limit is None:
            return None
        u = self._usage.get(key)
        return max(0, limit - (getattr(u, direction) if u is not None else 0))

    def count(self, key: str, direction: Direction, n: int) -> None:
        """`key` moved `n` more bytes in `direction` (callers keep n within `room`)."""
        if n < 0:
            raise ValueError(f"count: negative byte count {n}")
        u = self._usage.setdefault(key, Usage())
        setattr(u, _checked(direction), getattr(u, direction) + n)


    def refund(self, key: str, direction: Direction, n: int) -> None:
        """Give back `n` bytes counted ahead and not moved (the unused part of what a
        relay thread had set aside: relay.py)."""
        if n < 0:
            raise ValueError(f"refund: negative byte count {n}")
        u = self._usage.setdefault(key, Usage())
        setattr(u, _checked(direction), max(0, getattr(u, direction) - n))


def _checked(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise ValueError(f"budget direction {direction!r} is not one of {DIRECTIONS}")
    return direction


__all__ = ["DIRECTIONS", "Budgets", "Direction", "Usage"]
