"""envd's terminals (process.Process/Start with a pty, Update, SendInput's pty bytes):
not served yet. Each call answers Connect's `unimplemented`, naming the native face that
has terminals (the WebSocket at /sandboxes/{id}/pty, docs/service.md)."""

from __future__ import annotations

from .connect import RpcError

WHY = ("pty: corral's E2B face has no terminals yet; use the native WebSocket "
       "/sandboxes/{id}/pty (docs/service.md)")


async def start_pty(state, request, msg, e, face):
    raise RpcError("unimplemented", WHY)


def pty_events(c, connect: bool = False):
    raise RpcError("unimplemented", WHY)


async def write_pty(c, data: bytes) -> None:
    raise RpcError("unimplemented", WHY)


async def resize(c, pty) -> None:
    raise RpcError("unimplemented", WHY)
