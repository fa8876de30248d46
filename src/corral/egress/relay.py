"""Per-connection state and the byte pumps every path of the proxy shares.

- `_Client` is one client connection (its task, when it last moved a byte: the idle sweep
  of server.py reads it); `_Flow` is one decision being carried out (a CONNECT tunnel, a
  plain-HTTP request, a terminated connection): its host, budget key, the bytes that
  passed and, when it was cut, why.
- `_Refused` ends a request with a status and reason sent to the client; `_Cut` cuts an
  allowed connection (budget, SNI), whose event then becomes a deny.
- `RelayMixin` moves bytes within the budgets (budget.py decides how many may go; this
  only asks and counts): `_pump` relays one direction with splice(2), socket -> pipe ->
  socket, or by copying where splice is missing or no pipe can be had; past THREAD_AFTER
  bytes a flow goes on in a `_Relay` thread, which splices (or copies through a ring,
  with CORRAL_EGRESS_RELAY_SPLICE=0); `_send` sends one
  buffer; either cuts (`_Cut("budget: ...")`) rather than let a byte past the budget. The
  CONNECT tunnel (server.py) and plain-HTTP forwarding (forward.py) use them; terminated
  TLS (terminate.py) counts decrypted bytes through `_count`. `_end` emits a flow's one
  event.

The proxy class (server.EgressProxy) mixes RelayMixin in and provides `_budgets` (a
budget.Budgets) and `_emit_cb` (where events go).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..events import NetEvent
from ..policy.hosts import HostError, parse_host
from .budget import Budgets

RELAY_BUF = 256 * 1024
Emit = Callable[[dict], None]
#: the client connection whose task is running (server.py's _run_client sets it): its
#: number, which every event of that connection carries as "conn" when the proxy tracks
#: connections (EgressProxy(track_conns=True))
CONN: ContextVar[int | None] = ContextVar("corral_egress_conn", default=None)


class _Refused(Exception):
    """A request ends here with `status` and `reason` sent to the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Cut(Exception):
    """An allowed connection is cut for `reason` (budget, SNI); the event becomes a deny."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Client:
    """One client connection: its task, and when it last moved a byte (for the idle sweep)."""

    task: asyncio.Task | None = None
    last_active: float = field(default_factory=time.monotonic)
    idle_cut: bool = False


@dataclass
class _Flow:
    """One decision being carried out: counts for its event."""

    host: str
    port: int
    reason: str
    key: str                 # budget key (decide.Decision.budget_key)
    bytes_in: int = 0
    bytes_out: int = 0
    cut: str | None = None


class RelayMixin:
    """The byte pumps and the flow's event, for server.EgressProxy."""

    _budgets: Budgets
    _emit_cb: Emit
    _track_conns: bool

    def _emit(self, host: str, port: int, allow: bool, reason: str, bytes_in: int = 0,
              bytes_out: int = 0) -> None:
        event = NetEvent(host, port, "allow" if allow else "deny", reason, bytes_in,
                         bytes_out).to_dict()
        if self._track_conns:
            n = CONN.get()
            if n is not None:
                event["conn"] = n
        self._emit_cb(event)

    async def _pump(self, src, dst, flow: _Flow, direction: str, st: _Client,
                    length: int | None = None) -> None:
        """Relay src -> dst until EOF (then half-close dst), or exactly `length` bytes."""
        if _HAVE_SPLICE:
            await self._splice_pump(src, dst, flow, direction, st, length)
        else:
            await self._copy_pump(src, dst, flow, direction, st, length)

    async def _splice_pump(self, src, dst, flow: _Flow, direction: str, st: _Client,
                           length: int | None) -> None:
        """Zero-copy relay: socket -> pipe -> socket with non-blocking splice(2), waiting on
        the event loop only when both ends would block. A bulk flow (THREAD_AFTER bytes
        moved, no byte budget in its direction) goes on in a thread of its own (_Relay)."""
        loop = asyncio.get_running_loop()
        try:
            pr, pw = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:                                # out of fds: copy instead
            await self._copy_pump(src, dst, flow, direction, st, length)
            return
        try:
            try:
                fcntl.fcntl(pw, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
            except OSError:
                pass
            cap = fcntl.fcntl(pw, fcntl.F_GETPIPE_SZ)
            sfd, dfd = src.fileno(), dst.fileno()
            in_pipe = 0
            eof = False
            left = length
            moved = 0
            flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
            while True:
                progress = False
                want_read = False
                if not eof and in_pipe < cap and left != 0:
                    n_max = cap - in_pipe if left is None else min(cap - in_pipe, left)
                    room = self._budgets.room(flow.key, direction)
                    if room == 0:
                        if await _has_more(loop, src):
                            raise _Cut(f"budget: {direction}")
                        eof = True
                        n_max = 0
                    elif moved >= THREAD_AFTER and in_pipe == 0 and _Relay.free():
                        grant = _grant(room)
                        if grant is not None:
                            r = _Relay(sfd, dfd, pr, pw, cap, left, grant, st)
                            got = await self._in_thread(r, loop, flow, direction, room)
                            if got is None:
                                moved = -(1 << 62)         # no thread to be had: stay here
                            else:
                                eof = eof or got[1]
                                if left is not None:
                                    left -= got[0]
                                continue
                    if room is not None:
                        n_max = min(n_max, room)
                    if n_max:
                        try:
                            n = os.splice(sfd, pw, n_max, flags=flags)
                        except BlockingIOError:
                            want_read = True
                        else:
                            if n == 0:
                                eof = True
                            else:
                                in_pipe += n
                                moved += n
                                if left is not None:
                                    left -= n
                                self._count(flow, direction, n)
                                progress = True
                want_write = False
                if in_pipe:
                    try:
                        m = os.splice(pr, dfd, in_pipe, flags=flags)
                    except BlockingIOError:
                        want_write = True
                    else:
                        in_pipe -= m
                        progress = progress or m > 0
                if in_pipe == 0 and (eof or left == 0):
                    if eof and length is None:
                        _shutdown(dst)
                    if eof and left:
                        raise ConnectionError("upstream closed early")
                    return
                if progress:
                    st.last_active = time.monotonic()
                    continue
                if not (want_read or want_write):
                    await asyncio.sleep(0)
                    continue
                await _wait_fds(loop, sfd if want_read else None, dfd if want_write else None)
        finally:
            os.close(pr)
            os.close(pw)

    async def _in_thread(self, r: _Relay, loop, flow: _Flow, direction: str,
                         room: int | None) -> tuple[int, bool] | None:
        """Run `r` in its thread with its grant of the budget set aside (counted now, the
        unused part given back after): (bytes moved, eof), or None without a thread."""
        if room is not None:
            self._budgets.count(flow.key, direction, r.grant)
        moved = 0
        try:
            if not r.start(loop):
                return None
            try:
                await r.wait()
            finally:
                moved = r.moved
            return moved, r.eof
        finally:
            if room is not None:
                self._budgets.refund(flow.key, direction, r.grant - moved)
            setattr(flow, direction, getattr(flow, direction) + moved)

    async def _copy_pump(self, src, dst, flow: _Flow, direction: str, st: _Client,
                         length: int | None) -> None:
        loop = asyncio.get_running_loop()
        buf = bytearray(RELAY_BUF)
        view = memoryview(buf)
        left = length
        while left is None or left > 0:
            n = await loop.sock_recv_into(src, view if left is None else view[:left])
            st.last_active = time.monotonic()
            if n == 0:
                if left:
                    raise ConnectionError("upstream closed early")
                _shutdown(dst)
                return
            if left is not None:
                left -= n
            await self._send(dst, view[:n], flow, direction, st)

    async def _send(self, dst, data, flow: _Flow, direction: str, st: _Client) -> None:
        """Send and count; never lets more than the budget through."""
        if not data:
            return
        room = self._budgets.room(flow.key, direction)
        n = len(data)
        if room is not None and n > room:
            if room > 0:
                await asyncio.get_running_loop().sock_sendall(dst, data[:room])
                self._count(flow, direction, room)
            raise _Cut(f"budget: {direction}")
        await asyncio.get_running_loop().sock_sendall(dst, data)
        st.last_active = time.monotonic()
        self._count(flow, direction, n)

    def _count(self, flow: _Flow, direction: str, n: int) -> None:
        self._budgets.count(flow.key, direction, n)
        setattr(flow, direction, getattr(flow, direction) + n)

    def _end(self, flow: _Flow) -> None:
        if flow.cut is not None:
            self._emit(flow.host, flow.port, False, flow.cut, flow.bytes_in, flow.bytes_out)
        else:
            self._emit(flow.host, flow.port, True, flow.reason, flow.bytes_in, flow.bytes_out)


_HAVE_SPLICE = hasattr(os, "splice")
_PIPE_SIZE = 1 << 20
#: bytes a flow moves on the event loop before it may go on in a thread of its own
THREAD_AFTER = 4 << 20
#: relay threads a proxy runs at once (each is a task of the sandbox's cgroup: pids);
#: CORRAL_EGRESS_RELAY_THREADS in the proxy's environment sets it (0: none; benches)
MAX_RELAY_THREADS = 4
_env = os.environ.get("CORRAL_EGRESS_RELAY_THREADS", "")
if _env.isdigit() and len(_env) < 4:
    MAX_RELAY_THREADS = int(_env)
#: a relay thread copies through a ring of COPY_BUF (True) or splices (False, the
#: default). CORRAL_EGRESS_RELAY_SPLICE=0 in the proxy's environment chooses the ring
#: (bench/network.py's proxy-copy and sandbox-copy A/B in one run), =1 splicing. Splicing
#: is the default again since 2026-12-06: with direct at 2.7-3.5 GB/s on this machine it
#: beat the ring in 11 of 12 paired runs (docs/network.md); the ring had won when direct
#: was about 1 GB/s
RELAY_COPY = os.environ.get("CORRAL_EGRESS_RELAY_SPLICE", "") == "0"
#: the copy ring of one relay thread (allocated while it runs; 1 MiB measured 0.65x
#: direct, 4 MiB 0.8x: fewer wake-ups, and a whole window of the upstream per read)
COPY_BUF = 4 << 20


class _Relay:
    """Part of one direction of a bulk flow, in a thread: a copy ring (_copy_loop; or,
    with RELAY_COPY off, the loop's splice loop) waiting in poll(2) instead of on the
    event loop, so that each chunk costs a read, a write and at most a poll instead of a
    trip through the loop. It reads at most `grant` bytes (set aside from the budget by
    the loop, which takes back what was not used, and which alone decides a cut),
    empties its ring (or the pipe), and hands back. The sockets stay open until
    it is done: a cancelled wait stops it through a wake pipe and waits for it first, so
    it never touches a reused fd."""

    active = 0

    def __init__(self, sfd, dfd, pr, pw, cap, left, grant, st) -> None:
        self.sfd, self.dfd, self.pr, self.pw, self.cap = sfd, dfd, pr, pw, cap
        self.left, self.grant, self.st = left, grant, st
        self.moved = 0
        self.eof = False
        self.stop = False
        self.wake_r = self.wake_w = -1
        self.done: asyncio.Future | None = None

    @classmethod
    def free(cls) -> bool:
        return cls.active < MAX_RELAY_THREADS

    def start(self, loop) -> bool:
        import threading

        try:
            self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        self.done = loop.create_future()
        self.loop = loop
        try:
            threading.Thread(target=self._run, name="corral-relay", daemon=True).start()
        except RuntimeError:                    # no thread to be had (pids limit, say)
            os.close(self.wake_r)
            os.close(self.wake_w)
            return False
        _Relay.active += 1
        return True

    async def wait(self) -> None:
        try:
            await asyncio.shield(self.done)
        except asyncio.CancelledError:
            self.stop = True
            os.write(self.wake_w, b"x")
            while not self.done.done():
                try:
                    await asyncio.shield(self.done)
                except asyncio.CancelledError:
                    continue
                except BaseException:  # noqa: BLE001 - cancelled wins
                    break
            raise
        finally:
            if self.done.done() and not self.done.cancelled():
                self.done.exception()           # retrieved: no "never retrieved" warning
            _Relay.active -= 1
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _run(self) -> None:
        exc: BaseException | None = None
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting coroutine
            exc = e

        def finish() -> None:
            if not self.done.done():
                if exc is None:
                    self.done.set_result(None)
                else:
                    self.done.set_exception(exc)
        self.loop.call_soon_threadsafe(finish)

    def _loop(self) -> None:
        if RELAY_COPY:
            self._copy_loop()
        else:
            self._splice_loop()

    def _wait(self, want_read: bool, want_write: bool) -> None:
        import select

        p = select.poll()
        p.register(self.wake_r, select.POLLIN)
        if want_read:
            p.register(self.sfd, select.POLLIN)
        if want_write:
            p.register(self.dfd, select.POLLOUT)
        p.poll()

    def _room(self) -> int:
        """How many more bytes this thread may read: its grant, and the flow's length."""
        n = self.grant - self.moved
        if self.left is not None:
            n = min(n, self.left - self.moved)
        return 0 if self.eof else max(0, n)

    def _copy_loop(self) -> None:
        """A ring of COPY_BUF bytes between the sockets: read(2) into its free part, write(2)
        from its full part, so that a blocked write does not stop the reading (and the
        other way round); poll(2) only when neither can go on. Moving the bytes through
        user space looks wasteful next to splice(2), and costs the proxy more CPU (about
        80 against 55 ms per 200 MB here), but the copy the proxy makes is then the cold
        one (from the upstream's pages) and the client reads bytes just written, still in
        cache: on 2 CPUs the work is split between two processes instead of falling on the
        client alone, as it does with splice and without a proxy (docs/network.md,
        Measured: 0.8x direct against 0.6x)."""
        import mmap

        try:
            ring = mmap.mmap(-1, COPY_BUF)  # pages appear as they are first written
        except OSError:                     # no address space to be had: splice instead
            self._splice_loop()
            return
        view = memoryview(ring)
        size = COPY_BUF
        start = held = 0                # the ring: `held` bytes from `start` (mod size)
        try:
            while not self.stop:
                want_read = want_write = False
                room = min(size - held, self._room())
                if room:
                    end = (start + held) % size
                    n_max = min(room, size - end)       # contiguous free space
                    try:
                        n = os.readv(self.sfd, [view[end:end + n_max]])
                    except BlockingIOError:
                        want_read = True
                    else:
                        if n == 0:
                            self.eof = True
                        else:
                            held += n
                            self.moved += n
                if held:
                    n_max = min(held, size - start)     # contiguous data
                    try:
                        m = os.write(self.dfd, view[start:start + n_max])
                    except BlockingIOError:
                        want_write = True
                    else:
                        start = (start + m) % size
                        held -= m
                        if held == 0:
                            start = 0
                if held == 0 and self._room() == 0:
                    return
                self.st.last_active = time.monotonic()
                if want_write or (want_read and not held):
                    self._wait(want_read and held < size, want_write)
            if held:                        # stopped with bytes in hand: the flow is cut
                raise ConnectionError("relay stopped")
        finally:
            view.release()
            ring.close()

    def _splice_loop(self) -> None:
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        in_pipe = 0
        while not self.stop:
            want_read = want_write = False
            reading = self._room() > 0
            if reading and in_pipe < self.cap:
                n_max = min(self.cap - in_pipe, self._room())
                try:
                    n = os.splice(self.sfd, self.pw, n_max, flags=flags)
                except BlockingIOError:
                    want_read = True
                else:
                    if n == 0:
                        self.eof = True
                    else:
                        in_pipe += n
                        self.moved += n
            if in_pipe:
                try:
                    in_pipe -= os.splice(self.pr, self.dfd, in_pipe, flags=flags)
                except BlockingIOError:
                    want_write = True
            if in_pipe == 0 and self._room() == 0:
                return
            self.st.last_active = time.monotonic()
            if want_write or (want_read and not in_pipe):
                self._wait(want_read, want_write)
        if in_pipe:                        # stopped with bytes in the pipe: the flow is cut
            raise ConnectionError("relay stopped")


#: the most of a budget one relay thread sets aside at a time, and the least worth a thread
GRANT_MAX = 64 << 20
GRANT_MIN = 1 << 20


def _grant(room: int | None) -> int | None:
    """How much a relay thread may move now: unlimited rooms give GRANT_MAX; a budget at
    most a quarter of what is left of it (what a concurrent flow on the same key finds
    set aside stays small), and none below GRANT_MIN: the end of a budget is met on the
    event loop, where a cut is decided byte-exactly."""
    if room is None:
        return GRANT_MAX
    g = min(GRANT_MAX, room // 4)
    return g if g >= GRANT_MIN else None


async def _wait_fds(loop, read_fd: int | None, write_fd: int | None) -> None:
    """Until read_fd is readable or write_fd writable (at least one is given)."""
    fut = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    if read_fd is not None:
        loop.add_reader(read_fd, wake)
    if write_fd is not None:
        loop.add_writer(write_fd, wake)
    try:
        await fut
    finally:
        if read_fd is not None:
            loop.remove_reader(read_fd)
        if write_fd is not None:
            loop.remove_writer(write_fd)


async def _has_more(loop, sock: socket.socket) -> bool:
    """Wait until sock is readable; True if it has data (False at EOF or on error)."""
    while True:
        try:
            return bool(sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            await _wait_fds(loop, sock.fileno(), None)
        except OSError:
            return False


def _canon(host: str) -> str:
    """A host for an event: canonical, else a printable, bounded spelling of what was sent."""
    try:
        return str(parse_host(host))
    except HostError:
        return "".join(c if 0x20 < ord(c) < 0x7F else "?" for c in host)[:255]


def _shutdown(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass


async def _send_quiet(loop, sock, data: bytes) -> None:
    try:
        async with asyncio.timeout(5):
            await loop.sock_sendall(sock, data)
    except (OSError, TimeoutError):
        pass


__all__ = ["CONN", "RELAY_BUF", "Emit", "RelayMixin"]
