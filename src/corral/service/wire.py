"""uvicorn's HTTP protocol with a response's writes joined: what one turn of the event
loop writes on a connection goes out in one send.

uvicorn writes a response's status line and headers as soon as the app sends
`http.response.start`, and its body at `http.response.body`: two sends, two TCP segments,
for an answer that is whole at once (a command's Result, a JSON error). The client wakes
for the headers, parses them and sleeps again until the body comes; on a loaded machine
each wake-up waits for a CPU. Here the connection's transport is wrapped (`Joined`): a
write is held until the end of the loop's turn (`call_soon`), and the writes made
meanwhile go together. Order is kept, nothing is dropped that the transport would have
sent: a close() or write_eof() sends what is held first, an abort() drops it as the
transport drops its own buffer. A streamed response's chunks come from separate turns
(each waits for the command's output) and go as they did, one turn later.

At most HOLD_MAX bytes are held: a write that brings the held bytes to it sends them at
once, so a body written in big pieces without a pause (a file download) reaches the
transport as before, and the transport's flow control (uvicorn's pause on its high-water
mark) bounds what waits in memory, as before.

An app that knows its response is whole (the lean exec path, fastexec.py) sends it at
once through the scope's extension FLUSH (httptools' protocol: the scope is made in its
on_message_begin; with h11 there is none and the turn's end sends it): one turn of the
event loop less (an epoll_wait and the loop's own work) before the answer leaves.

A WebSocket upgrade hands the real transport to the WebSocket protocol (the terminal:
its frames are not held).

The access log's line for a response (uvicorn logs it at `http.response.start`, before a
byte of the response is written) is written two turns later (`Later`): after the
response has gone out, not before it. Formatting it and writing it to the log take
0.15-0.3 ms of the event loop, which the client no longer waits for. The line is the same
(it is made of what uvicorn passed at that moment); lines keep their order.
"""

from __future__ import annotations

import asyncio

#: the bytes a turn's writes may hold before they go at once (asyncio's default high-water
#: mark of a transport's buffer)
HOLD_MAX = 64 << 10
#: the scope's extension (scope["extensions"]) that sends what the connection holds now
FLUSH = "corral.flush"


class Joined:
    """A transport whose writes within one turn of the loop are sent as one."""

    __slots__ = ("_t", "_loop", "_held", "_size")

    def __init__(self, transport: asyncio.Transport, loop) -> None:
        self._t, self._loop = transport, loop
        self._held: list[bytes] | None = None
        self._size = 0

    def write(self, data) -> None:
        if not data:
            return
        if self._held is None:
            self._held, self._size = [bytes(data)], len(data)
            self._loop.call_soon(self.flush)
        else:
            self._held.append(bytes(data))
            self._size += len(data)
        if self._size >= HOLD_MAX:
            self.flush()          # the call_soon finds nothing held

    def writelines(self, chunks) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        held, self._held, self._size = self._held, None, 0
        if held:
            self._t.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._t.close()

    def write_eof(self) -> None:
        self.flush()
        self._t.write_eof()

    def abort(self) -> None:
        self._held, self._size = None, 0
        self._t.abort()

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size() + self._size

    def __getattr__(self, name):
        return getattr(self._t, name)


class Later:
    """uvicorn's access logger, its info() lines logged two turns of the loop later: the
    next turn sends the response's writes (Joined.flush), the one after logs."""

    __slots__ = ("_log", "_loop")

    def __init__(self, logger, loop) -> None:
        self._log, self._loop = logger, loop

    def info(self, msg, *args, **kw) -> None:
        try:
            self._loop.call_soon(self._loop.call_soon, self._emit, msg, args, kw)
        except RuntimeError:     # the loop is closed: now, then
            self._log.info(msg, *args, **kw)

    def _emit(self, msg, args, kw) -> None:
        self._log.info(msg, *args, **kw)

    def __getattr__(self, name):
        return getattr(self._log, name)


def joined(base: type) -> type:
    """`base` (uvicorn's HttpToolsProtocol or H11Protocol) with its transport Joined and
    its access log Later."""

    class JoinedProtocol(base):
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            if self.access_log:
                self.access_logger = Later(self.access_logger, self.loop)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._real_transport = transport
            self.transport = Joined(transport, asyncio.get_running_loop())

        if hasattr(base, "on_message_begin"):      # httptools': each request's scope
            def on_message_begin(self) -> None:
                super().on_message_begin()
                self.scope["extensions"] = {FLUSH: self.transport.flush}

        def handle_websocket_upgrade(self, *args) -> None:
            self.transport.flush()
            self.transport = self._real_transport
            super().handle_websocket_upgrade(*args)

    JoinedProtocol.__name__ = JoinedProtocol.__qualname__ = f"Joined{base.__name__}"
    return JoinedProtocol


def protocol() -> type:
    """The HTTP protocol class `corral serve` gives uvicorn: httptools' where installed (the
    lock has it: about 0.3 ms less CPU a request than h11), else h11's; joined."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return joined(AutoHTTPProtocol)
