"""envd's terminals: process.Process/Start with a `pty` (the SDK's pty.create), output as
`data.pty` events; SendInput's `input.pty`, Update's size (resize), SendSignal (kill) and
Connect by pid. Each terminal is the sandbox's own (sb.pty.create, runtime/pty.py: a
command on a pty pair, its output capped by limits.output); what it shows is kept here
for its stream, at most BUFFER bytes behind the reader (older output is let go). A
terminal is one of the server's open terminals (config max_terminals, the REST face's
too) from its start to its command's end: past them, resource_exhausted."""

from __future__ import annotations

import asyncio
import base64
import threading

from starlette.concurrency import run_in_threadpool

from ..limits import Limited
from ..notify import Notifier
from .connect import KEEPALIVE_S, RpcError, deadline_s, write_one

#: bytes of a terminal's output kept for its stream (past them, the oldest go)
BUFFER = 1 << 20
#: terminals one sandbox holds at once
MAX_PTYS = 32


class Term:
    def __init__(self) -> None:
        self.handle = None
        self.pid = 0
        self.chunks: list[bytes] = []
        self.base = 0              # index of chunks[0] in the whole output
        self.size = 0
        self.result = None
        self.done = threading.Event()
        self.notifier = Notifier()
        self._mu = threading.Lock()

    def on_data(self, data: bytes) -> None:
        with self._mu:
            self.chunks.append(bytes(data))
            self.size += len(data)
            while self.size > BUFFER and len(self.chunks) > 1:
                self.size -= len(self.chunks.pop(0))
                self.base += 1
        self.notifier.notify()

    def since(self, i: int) -> tuple[int, list[bytes]]:
        with self._mu:
            i = max(i, self.base)
            return i, self.chunks[i - self.base:]

    def end(self) -> int:
        with self._mu:
            return self.base + len(self.chunks)


def _size(pty) -> tuple[int, int]:
    size = (pty or {}).get("size") or {}
    cols, rows = size.get("cols", 80), size.get("rows", 24)
    if not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1000
               for x in (cols, rows)):
        raise RpcError("invalid_argument", "pty.size: cols and rows are from 1 to 1000")
    return cols, rows


async def start_pty(state, request, msg, e, face):
    if len(face.ptys) >= MAX_PTYS:
        raise RpcError("resource_exhausted", f"this sandbox has {MAX_PTYS} terminals; kill "
                       "one first")
    cols, rows = _size(msg.get("pty"))
    proc = msg.get("process") or {}
    cmd, args = proc.get("cmd") or "/bin/bash", proc.get("args") or []
    if not isinstance(cmd, str) or not isinstance(args, list) or not all(
            isinstance(a, str) for a in args):
        raise RpcError("invalid_argument", "process.cmd is a string and process.args a "
                       "list of strings")
    envs = proc.get("envs") or {}
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
        raise RpcError("invalid_argument", "process.envs is an object of strings")
    cwd = proc.get("cwd")
    t = Term()
    gate = state.svc.terminals      # the server's open terminals, the REST face's too
    try:
        gate.enter()
    except Limited as err:
        raise RpcError.limited(err) from None
    try:
        h = await run_in_threadpool(e.sandbox.pty.create, cols, rows, [cmd, *args],
                                    on_data=t.on_data, env={**face.envs, **envs} or None,
                                    cwd=cwd or None, timeout=deadline_s(request))
    except BaseException:
        gate.leave()
        raise
    t.handle, t.pid = h, h.pid_inside
    face.ptys[t.pid] = t
    e.events.add("pty.started", {"cols": cols, "rows": rows})

    def watch():
        try:
            t.result = h.wait()
        finally:
            gate.leave()
        t.done.set()
        t.notifier.notify()
        face.ptys.pop(t.pid, None)
        e.events.add("pty.ended", {"pid": t.pid})

    threading.Thread(target=watch, daemon=True, name=f"e2b-pty-{t.pid}").start()
    return pty_events(t)


async def pty_events(t: Term, connect: bool = False):
    from .connect import _end

    yield {"event": {"start": {"pid": t.pid}}}
    i = t.end() if connect else 0
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        i, chunks = t.since(i)
        for c in chunks:
            i += 1
            yield {"event": {"data": {"pty": base64.b64encode(c).decode()}}}
            last = loop.time()
        if t.done.is_set() and not t.since(i)[1]:
            yield {"event": {"end": _end(t.result)}}
            return
        left = KEEPALIVE_S - (loop.time() - last)
        if left <= 0:
            yield {"event": {"keepalive": {}}}
            last = loop.time()
            continue
        await t.notifier.wait(min(left, 15.0), lambda: t.done.is_set() or bool(
            t.since(i)[1]))


async def write_pty(t: Term, data: bytes) -> None:
    """In a thread of its own, one write a terminal at a time (service.common.own_thread:
    the terminal's command decides whether it reads)."""
    await write_one(t.handle, t.handle.send_input, data, "corral-e2b-pty-input",
                    busy=f"terminal {t.pid} has a write waiting already",
                    ended=f"terminal {t.pid} has ended")


async def resize(t: Term, pty) -> None:
    if pty is None:
        raise RpcError("invalid_argument", "pty.size is what Update changes")
    cols, rows = _size(pty)
    t.handle.resize(cols, rows)
