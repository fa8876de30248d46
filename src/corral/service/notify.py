"""A wake-up from any thread for coroutines waiting on the event loop (streams of output
and events): `notify()` is thread-safe, `await wait(timeout)` returns on the next one."""

from __future__ import annotations

import asyncio
import threading


class Notifier:
    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def notify(self) -> None:
        with self._mu:
            waiters = list(self._waiters)
        for loop, ev in waiters:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:   # that loop is closed
                pass

    async def wait(self, timeout: float, ready=None) -> None:
        """Until the next notify() or `timeout` seconds; at once if `ready()` is true
        once this waiter is registered (so a notify() just before is not missed)."""
        ev = asyncio.Event()
        key = (asyncio.get_running_loop(), ev)
        with self._mu:
            self._waiters.add(key)
        try:
            if ready is not None and ready():
                return
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._mu:
                self._waiters.discard(key)
