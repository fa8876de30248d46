"""What the benches that start a `corral serve` share: a free loopback port, and the wait
until the server answers /health (or a clear exit if it died or never came up)."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc, seconds: float = 30.0) -> None:
    """Until GET url/health answers 200; SystemExit if `proc` (the server) exits first or
    `seconds` pass."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited ({proc.returncode}) before it answered")
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: no answer to /health in {seconds:.0f} s")
        time.sleep(0.05)
