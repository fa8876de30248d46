"""A warm pool of live sandboxes: `claim()` hands out one made ahead, in well under a
millisecond, and a thread of the pool starts a fresh one behind it.

    with corral.Pool({"limits": {"memory": "1G"}}, size=4) as pool:
        sb = pool.claim(timeout=600)        # a live sandbox nobody has used
        sb.commands.run("python3 -c 'print(1)'")
        sb.kill()

Every sandbox of a pool is created by the pool, kept where nothing else can reach it, and
handed out once: a claimed sandbox never ran a command. Its timeout starts at the claim
(a pooled one waits with the longest timeout allowed). Sandboxes that ended while they
waited (their init died) are dropped, never handed out. close() kills the unclaimed ones;
the claimed ones are their claimers'.
"""

from __future__ import annotations

import threading
from collections import deque

from ..errors import UsageError
from .live import MAX_TIMEOUT_S, Live, _check_timeout
from .tiers import coerce_policy

#: how many sandboxes a pool may keep ready
MAX_SIZE = 256


class Pool:
    """Keeps `size` live sandboxes of one policy created ahead (see the module's docstring)."""

    def __init__(self, policy=None, *, size: int = 2, timeout: float = 300, env=None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_SIZE:
            raise UsageError(f"size must be an int in [1, {MAX_SIZE}], not {size!r}",
                             field="size")
        self.policy = coerce_policy(policy)
        self.size = size
        self.timeout = _check_timeout(timeout)
        self._env = env
        self._ready: deque[Live] = deque()
        self._cond = threading.Condition()
        self._closed = False
        #: the last error the filler met (it retries at the next claim), for callers
        self.error: BaseException | None = None
        self._filler = threading.Thread(target=self._fill, daemon=True, name="corral-pool")
        self._filler.start()

    def _new(self) -> Live:
        return Live(self.policy, timeout=MAX_TIMEOUT_S, env=self._env)

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                sb = self._new()
            except Exception as e:  # noqa: BLE001 - kept for claim() to raise
                with self._cond:
                    self.error = e
                    self._cond.notify_all()
                    self._cond.wait()   # until a claim asks again
                continue
            with self._cond:
                if self._closed:
                    sb.kill()
                    return
                self.error = None
                self._ready.append(sb)
                self._cond.notify_all()

    def claim(self, *, timeout: float | None = None) -> Live:
        """A live sandbox nobody has used, its timeout (default: the pool's) starting now.
        Waits for one if none is ready; raises the filler's error if it cannot make one."""
        seconds = self.timeout if timeout is None else _check_timeout(timeout)
        with self._cond:
            while True:
                if self._closed:
                    raise UsageError("the pool is closed", field="pool")
                while self._ready:
                    sb = self._ready.popleft()
                    if sb.state == "running":
                        self._cond.notify_all()    # the filler makes the next one
                        sb.set_timeout(seconds)
                        return sb
                    sb.kill()
                if self.error is not None:
                    e, self.error = self.error, None
                    self._cond.notify_all()
                    raise e
                self._cond.wait()

    def ready(self) -> int:
        """How many sandboxes are ready now."""
        with self._cond:
            return len(self._ready)

    def close(self) -> None:
        """Kill the unclaimed sandboxes and stop making new ones."""
        with self._cond:
            self._closed = True
            ready, self._ready = list(self._ready), deque()
            self._cond.notify_all()
        self._filler.join(60)
        for sb in ready:
            sb.kill()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


__all__ = ["Pool"]
