"""A terminal in a sandbox over a WebSocket: WS /sandboxes/{sid}/pty?cols=&rows=&cmd=
(and cwd=, timeout= seconds, env= a JSON object of variables).

The handshake carries the bearer token like any request (Authorization header); a refusal
is an HTTP answer with the JSON error where the server can send one, else a close with
code 4401 (token), 4404 (sandbox), 4400 (bad parameters) or 4409 (the sandbox ended).

Then, client to server: binary frames are input (keys, as bytes); text frames are JSON
{"type": "input", "data": text}, {"type": "resize", "cols": N, "rows": N} or
{"type": "kill"}. Server to client: {"type": "started", "pid": N} first, binary frames of
output as the terminal shows it, and last {"type": "exit", "result": Result} before a
normal close. A client that goes away kills the terminal's command.

A terminal is one of its token's operations in flight for as long as it is open (its
max_concurrent: 4429, or a 429 answer with Retry-After), and one of the server's open
terminals (config max_terminals, every token's and the E2B face's together: the same
429, field max_terminals; a token without max_concurrent cannot exhaust the server's
threads and fds for every other). It holds none of the server's shared worker threads
(the pool every sync route and every other token's requests use): a thread of its own
waits for its command, another writes the client's input to it (one frame at a time; the
socket is not read while the command is not taking input).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from contextlib import ExitStack

from fastapi import APIRouter, WebSocket
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from ...errors import CorralError
from ..common import ApiError, auth, own_thread, service, status_of

router = APIRouter(tags=["terminal"])

#: output chunks queued for a slow client before the terminal is made to wait
QUEUE_CHUNKS = 256
#: the largest text or binary frame taken from a client
MAX_FRAME = 1 << 20


async def _refuse(ws: WebSocket, status: int, kind: str, message: str, field=None,
                  retry_after: int | None = None) -> None:
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        from fastapi.responses import JSONResponse

        await ws.send_denial_response(JSONResponse(
            {"error": {"kind": kind, "field": field, "message": message}}, status_code=status,
            headers={"Retry-After": str(retry_after)} if retry_after else None))
        return
    await ws.close(code=4000 + status if status < 1000 else 1011, reason=message[:120])


@router.websocket("/sandboxes/{sid}/pty")
async def pty(ws: WebSocket, sid: str, cols: int = 80, rows: int = 24, cmd: str | None = None,
              cwd: str | None = None, timeout: float | None = None, env: str | None = None):
    """`env`: a JSON object of variables (str to str) added for the terminal's command."""
    from ..limits import Limited

    try:
        token = await auth(ws)     # an lstat of the token file; over the rate: Limited
        svc = await service(ws)
        e = svc.entry(sid, token)
    except ApiError as err:
        return await _refuse(ws, err.status, err.kind, err.message, err.field)
    except Limited as err:
        return await _refuse(ws, 429, "rate", err.message, err.field, err.retry_after)
    try:
        env_map = _env(env)
    except ValueError as err:
        return await _refuse(ws, 400, "invalid", str(err), "env")
    held = ExitStack()          # both held until the terminal has ended
    try:
        held.enter_context(svc.slot(token))            # the token's max_concurrent
        held.enter_context(svc.terminals.slot())       # the server's max_terminals
    except Limited as err:
        held.close()
        return await _refuse(ws, 429, "rate", err.message, err.field, err.retry_after)
    with held:
        await _serve(ws, e, cols, rows, cmd, cwd, timeout, env_map)


async def _serve(ws: WebSocket, e, cols, rows, cmd, cwd, timeout, env_map) -> None:
    loop = asyncio.get_running_loop()
    out: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)

    def on_data(data: bytes) -> None:     # the relay thread: waits while the queue is full
        try:
            asyncio.run_coroutine_threadsafe(out.put(data), loop).result(60)
        except Exception:  # noqa: BLE001, S110 - the socket's side is gone: drop it
            pass

    try:
        term = await run_in_threadpool(e.sandbox.pty.create, cols, rows, cmd,
                                       on_data=on_data, cwd=cwd, timeout=timeout,
                                       env=env_map)
    except CorralError as err:
        return await _refuse(ws, status_of(err), err.kind, err.message, err.field)
    await ws.accept()
    e.events.add("pty.started", {"cols": cols, "rows": rows})
    done = own_thread(loop, term.wait, "corral-pty-wait")
    feed = _Input(loop, term)
    reader = asyncio.ensure_future(_input(ws, term, feed))
    finished = False
    try:
        await ws.send_text(json.dumps({"type": "started", "pid": term.pid_inside}))
        while True:
            getter = asyncio.ensure_future(out.get())
            await asyncio.wait({getter, done, reader}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                await ws.send_bytes(getter.result())
                continue
            getter.cancel()
            if reader.done() and not done.done():     # the client went away (or broke
                break                                  # the protocol): end the terminal
            if done.done():
                while not out.empty():
                    await ws.send_bytes(out.get_nowait())
                result = done.result()
                finished = True
                await ws.send_text(json.dumps({"type": "exit", "result": result.to_dict()}))
                await ws.close(1000)
                return
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass      # the client went away (uvicorn's ClientDisconnected is an OSError)
    finally:
        reader.cancel()
        feed.close()
        if not finished:
            term.kill()
            e.events.add("pty.ended", {"by": "disconnect"})
            try:
                await ws.close(1000)
            except (WebSocketDisconnect, RuntimeError, OSError):
                pass


#: variables a terminal's env may add
MAX_ENV = 256


def _env(text: str | None) -> dict[str, str] | None:
    """The `env` query parameter: None, or a JSON object of at most MAX_ENV str to str."""
    if text is None:
        return None
    try:
        d = json.loads(text)
    except ValueError:
        raise ValueError("env is a JSON object of variable names to str values") from None
    if not isinstance(d, dict) or len(d) > MAX_ENV or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise ValueError(f"env is a JSON object of at most {MAX_ENV} variable names to "
                         "str values")
    return d or None


class _Input:
    """The client's input written to the terminal by a thread of its own: one frame at a
    time (put() waits while one is being written, so a command that takes no input stops
    the socket being read, never a shared worker thread)."""

    def __init__(self, loop, term) -> None:
        self._loop, self._term = loop, term
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._room = asyncio.Semaphore(1)
        threading.Thread(target=self._run, name="corral-pty-input", daemon=True).start()

    async def put(self, data: bytes) -> None:
        await self._room.acquire()
        self._q.put(data)

    def close(self) -> None:
        self._q.put(None)

    def _run(self) -> None:
        while (data := self._q.get()) is not None:
            _send(self._term, data)
            try:
                self._loop.call_soon_threadsafe(self._room.release)
            except RuntimeError:     # the loop has closed
                return


async def _input(ws: WebSocket, term, feed: _Input) -> None:
    """Client frames until it disconnects (returns then) or sends {"type": "kill"}."""
    while True:
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return
        data, text = msg.get("bytes"), msg.get("text")
        if data is not None:
            if len(data) > MAX_FRAME:
                return
            await feed.put(data)
            continue
        if text is None or len(text) > MAX_FRAME:
            return
        try:
            m = json.loads(text)
            kind = m["type"]
        except (ValueError, KeyError, TypeError):
            await ws.send_text(json.dumps({"type": "error", "message": "a text frame is "
                                           "JSON {\"type\": \"input\"|\"resize\"|\"kill\"}"}))
            continue
        if kind == "input" and isinstance(m.get("data"), str):
            await feed.put(m["data"].encode())
        elif kind == "resize":
            try:
                term.resize(m.get("cols"), m.get("rows"))
            except CorralError as err:
                await ws.send_text(json.dumps({"type": "error", "field": err.field,
                                               "message": err.message}))
        elif kind == "kill":
            term.kill()
        else:
            await ws.send_text(json.dumps({"type": "error", "message": f"unknown frame "
                                           f"type {str(kind)[:40]!r}"}))


def _send(term, data: bytes) -> None:
    try:
        term.send_input(data)
    except BrokenPipeError:
        pass
