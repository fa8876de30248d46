"""TLS termination for granted hosts: the only path on which the proxy reads a tunnel.

A CONNECT to a host:port some secret grant names (secrets.grants_for), whose client speaks
TLS, is *terminated* (server.py's tunnel hands it over after `_granted_hello`, which runs
the tunnel's own SNI check first):

1. the proxy completes the client's handshake with a leaf for the CONNECT host minted by
   the run CA (mitm.LeafCache; ALPN http/1.1 only),
2. opens its own TLS to the pinned address (`_upstream_handshake`: SNI and certificate
   check for the CONNECT host, against cfg.upstream_ca or the system store),
3. runs HTTP/1.1 (h11) on both decrypted streams, with keep-alive to the upstream
   (reconnecting to the checked addresses, never resolving again, when it closed): each
   request goes through `inject` (refused whole, 403, when a placeholder would leak), and
   each response through a `ResponseScrubber` (`_mitm_exchange`).

Every other CONNECT stays a byte tunnel. Bytes are counted decrypted (HTTP bytes to and
from the upstream), and each request after the first takes one more request from the
budget. `_TLS` drives an ssl.SSLObject on memory BIOs (the ssl module's own sans-IO
interface) over a non-blocking socket, for both sides.

The proxy class (server.EgressProxy) provides `cfg`, `_grants`, `_scrub_base`, `_leaves`
and `_upstream_tls`, `_connect` (to a checked address) and `_check_client_hello`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl
import time
from typing import TYPE_CHECKING

import h11

from ..policy.hosts import IPAddress, host_header_text, parse_host
from .config import Grant, NetConfig
from .conn import (
    HttpRequest,
    ProxyProtocolError,
    deny_response,
    error_response,
    forward_request,
    inner_request,
    response_headers,
)
from .decide import Decision
from .relay import RELAY_BUF, RelayMixin, _Client, _Cut, _Flow, _Refused
from .secrets import (
    GRANTED,
    ResponseScrubber,
    ScrubError,
    inject,
    readable_accept_encoding,
    secret_event,
)
from .tls import looks_like_tls

if TYPE_CHECKING:
    from .mitm import LeafCache


class TerminateMixin(RelayMixin):
    """Terminated TLS for granted hosts, for server.EgressProxy."""

    cfg: NetConfig
    _grants: tuple[Grant, ...]
    _scrub_base: dict[bytes, bytes]
    _leaves: LeafCache | None
    _upstream_tls: ssl.SSLContext | None

    async def _granted_hello(self, client, up, first: bytes, d: Decision, port: int,
                             st: _Client) -> tuple[bool, bytes]:
        """On a tunnel to a granted host:port: (True, the checked ClientHello and whatever
        followed it) when the client speaks TLS, else (False, what the client sent so far),
        and the tunnel stays plain. Raises _Cut like _check_client_hello."""
        loop = asyncio.get_running_loop()
        buf = bytearray(first)
        if not buf and port != 443:
            # a protocol whose server speaks first (ssh) is not TLS: do not wait for the client
            if await _first_readable(loop, client, up) is up:
                return False, b""
            data = await loop.sock_recv(client, RELAY_BUF)
            st.last_active = time.monotonic()
            if not data:
                return False, b""
            buf += data
        if port != 443 and not looks_like_tls(bytes(buf[:2])):
            return False, bytes(buf)
        await self._check_client_hello(client, buf, d, st)
        return True, bytes(buf)

    async def _mitm(self, client, up, hello: bytes, d: Decision, addrs: list[IPAddress],
                    flow: _Flow, st: _Client):
        """Terminate the client's TLS with a leaf for d.host, open TLS to the pinned upstream,
        and relay HTTP/1.1 requests through inject() and responses through the scrubber.
        `up` stays the caller's to close; reconnections made here are closed here."""
        port = flow.port
        assert self._leaves is not None and self._upstream_tls is not None
        ctls = _TLS(client, self._leaves.server_context(d.host), st, server_side=True)
        ctls.feed(hello)
        try:
            async with asyncio.timeout(self.cfg.header_timeout):
                await ctls.handshake()
        except (ssl.SSLError, ConnectionError, OSError, TimeoutError) as e:
            flow.cut = f"tls: the sandbox's handshake failed ({_ssl_reason(e)})"
            return
        sock = up                                  # the upstream socket in use
        utls: _TLS | None = None
        upc: h11.Connection | None = None
        up_error: str | None = None
        try:
            utls = await self._upstream_handshake(up, d, st)
        except _Refused as r:
            up_error = r.reason
        upc = h11.Connection(h11.CLIENT)
        cconn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.cfg.max_header_bytes)
        host_header = host_header_text(parse_host(d.host), port, default_port=443).encode()
        used: set[str] = set()
        echoes: dict[bytes, bytes] = {}
        first = True
        try:
            while True:
                try:
                    ev = await self._tls_head(cconn, ctls, st, first)
                except TimeoutError:
                    await ctls.send_quiet(error_response(408, "request head timeout"))
                    return
                except h11.RemoteProtocolError:
                    await ctls.send_quiet(error_response(400, "bad request inside the tunnel"))
                    return
                if not isinstance(ev, h11.Request):
                    return
                try:
                    req = inner_request(ev, d.host, port)
                except ProxyProtocolError as e:
                    if e.status == 403:
                        flow.cut = e.message
                    await ctls.send_quiet(deny_response(e.message) if e.status == 403
                                          else error_response(e.status, e.message))
                    return
                if not first:
                    exceeded = self._budgets.take_request(flow.key)
                    if exceeded:
                        flow.cut = exceeded
                        await ctls.send_quiet(deny_response(exceeded))
                        return
                first = False
                if up_error is not None:
                    flow.cut = up_error
                    await ctls.send_quiet(error_response(502, up_error))
                    return
                inj = inject(self._grants, d.host, port, "https", req.method, req.path,
                             req.headers, time.time())
                if inj.denied is not None:
                    self._emit_cb(inj.denied)
                    await ctls.send_quiet(deny_response(inj.reason or "secret"))
                    return
                if utls is not None and utls.peer_closed():   # an idle keep-alive ended
                    utls = None
                if utls is None:                      # the upstream closed the last one
                    if sock is not up:
                        sock.close()
                    sock = await self._connect(addrs, port)
                    try:
                        utls = await self._upstream_handshake(sock, d, st)
                    except _Refused as r:
                        flow.cut = r.reason
                        await ctls.send_quiet(error_response(502, r.reason))
                        return
                    upc = h11.Connection(h11.CLIENT)
                assert upc is not None
                for name in inj.used:
                    if name not in used:
                        used.add(name)
                        self._emit_cb(secret_event(name, d.host, port, "inject", GRANTED))
                for k, v in inj.echoes.items():
                    echoes[k] = v
                    if len(echoes) > 64:
                        echoes.pop(next(iter(echoes)))
                req = dataclasses.replace(req, headers=tuple(readable_accept_encoding(
                    inj.headers)), path=inj.target)
                scrubber = ResponseScrubber(self._scrub_base, echoes)
                keep = await self._mitm_exchange(cconn, ctls, upc, utls, req, host_header,
                                                 scrubber, flow, st)
                if upc.our_state is h11.DONE and upc.their_state is h11.DONE:
                    upc.start_next_cycle()
                else:
                    await utls.close()
                    utls = None
                if not keep:
                    return
                if cconn.our_state is h11.DONE and cconn.their_state is h11.DONE:
                    cconn.start_next_cycle()
                else:
                    return
        except _Cut as c:
            flow.cut = c.reason
            return
        except _Refused as r:                     # a reconnect failed
            flow.cut = r.reason
            await ctls.send_quiet(error_response(r.status, r.reason))
            return
        finally:
            if utls is not None:
                await utls.close()
            await ctls.close()
            if sock is not up:
                sock.close()

    async def _upstream_handshake(self, up, d: Decision, st: _Client) -> _TLS:
        assert self._upstream_tls is not None
        utls = _TLS(up, self._upstream_tls, st, server_side=False, server_hostname=d.host)
        try:
            async with asyncio.timeout(self.cfg.connect_timeout):
                await utls.handshake()
        except ssl.SSLCertVerificationError as e:
            raise _Refused(502, f"upstream tls: {e.verify_message or 'certificate verify failed'}"
                           ) from None
        except TimeoutError:
            raise _Refused(504, "upstream tls: timeout") from None
        except (ssl.SSLError, ConnectionError, OSError) as e:
            raise _Refused(502, f"upstream tls: {_ssl_reason(e)}") from None
        return utls

    async def _tls_head(self, cconn: h11.Connection, ctls: _TLS, st: _Client, first: bool):
        """The next h11 event of the client (a request head): header_timeout from the first
        request, or from the first byte of a later one."""
        loop = asyncio.get_running_loop()
        limit = self.cfg.header_timeout
        async with asyncio.timeout(limit if first else None) as tm:
            while True:
                ev = cconn.next_event()
                if ev is not h11.NEED_DATA:
                    return ev
                data = await ctls.recv()
                if tm.when() is None:
                    tm.reschedule(loop.time() + limit)
                cconn.receive_data(data)

    async def _mitm_exchange(self, cconn: h11.Connection, ctls: _TLS, upc: h11.Connection,
                             utls: _TLS, req: HttpRequest, host_header: bytes,
                             scrubber: ResponseScrubber, flow: _Flow, st: _Client) -> bool:
        """One request and its response on a terminated connection. False when the client
        connection must end (a cut, a broken upstream, a response already started)."""
        started = False
        try:
            if cconn.they_are_waiting_for_100_continue:
                await ctls.sendall(cconn.send(
                    h11.InformationalResponse(status_code=100, headers=[])) or b"")
            head = upc.send(forward_request(req, host_header, keep_alive=True)) or b""
            await self._tls_send(utls, head, flow)
            while True:                                   # request body
                try:
                    ev = cconn.next_event()
                except h11.RemoteProtocolError:           # the client broke off its body
                    return False
                if ev is h11.NEED_DATA:
                    cconn.receive_data(await ctls.recv())
                elif isinstance(ev, h11.Data):
                    await self._tls_send(utls, upc.send(h11.Data(data=ev.data)) or b"", flow)
                elif isinstance(ev, h11.EndOfMessage):
                    await self._tls_send(utls, upc.send(h11.EndOfMessage()) or b"", flow)
                    break
                else:
                    return False
            pending = bytearray()
            while True:                                   # response
                ev = upc.next_event()
                if ev is h11.NEED_DATA:
                    if pending:
                        await ctls.sendall(bytes(pending))
                        pending.clear()
                    data = await utls.recv()
                    room = self._budgets.room(flow.key, "bytes_in")
                    if room is not None and len(data) > room:
                        self._count(flow, "bytes_in", room)
                        raise _Cut("budget: bytes_in")
                    self._count(flow, "bytes_in", len(data))
                    upc.receive_data(data)
                    continue
                if isinstance(ev, h11.InformationalResponse):
                    if ev.status_code != 101:
                        pending += cconn.send(h11.InformationalResponse(
                            status_code=ev.status_code,
                            headers=scrubber.start(response_headers(ev.headers),
                                                   has_body=False))) or b""
                    continue
                if isinstance(ev, h11.Response):
                    has_body = not (req.method == b"HEAD" or ev.status_code in (204, 304))
                    headers = scrubber.start(response_headers(ev.headers), has_body=has_body)
                    started = True
                    pending += cconn.send(h11.Response(
                        status_code=ev.status_code, reason=scrubber.scrub(bytes(ev.reason)),
                        headers=headers)) or b""
                elif isinstance(ev, h11.Data):
                    for piece in scrubber.feed(bytes(ev.data)):
                        pending += cconn.send(h11.Data(data=piece)) or b""
                elif isinstance(ev, h11.EndOfMessage):
                    tail = scrubber.end()
                    if tail:
                        pending += cconn.send(h11.Data(data=tail)) or b""
                    pending += cconn.send(h11.EndOfMessage()) or b""
                    await ctls.sendall(bytes(pending))
                    return True
                else:                                     # ConnectionClosed, PAUSED
                    if not started:
                        flow.cut = "bad response from upstream"
                        await ctls.send_quiet(error_response(502, "bad response from upstream"))
                    return False
                if len(pending) >= RELAY_BUF:
                    await ctls.sendall(bytes(pending))
                    pending.clear()
        except ScrubError as e:                       # fail closed: cut, never pass
            flow.cut = str(e)
            if not started:
                await ctls.send_quiet(error_response(502, str(e)))
            return False
        except h11.ProtocolError:
            flow.cut = "bad response from upstream"
            if not started:
                await ctls.send_quiet(error_response(502, "bad response from upstream"))
            return False
        except _Cut as c:
            if not started:
                await ctls.send_quiet(deny_response(c.reason))
            raise
        except (ConnectionError, OSError, ssl.SSLError):
            if not started:
                await ctls.send_quiet(error_response(502, "upstream connection failed"))
            return False

    async def _tls_send(self, utls: _TLS, data: bytes, flow: _Flow) -> None:
        """Send decrypted bytes upstream within the bytes_out budget."""
        if not data:
            return
        room = self._budgets.room(flow.key, "bytes_out")
        if room is not None and len(data) > room:
            raise _Cut("budget: bytes_out")
        await utls.sendall(data)
        self._count(flow, "bytes_out", len(data))


class _TLS:
    """TLS on a non-blocking socket: an ssl.SSLObject on memory BIOs (the ssl module's own
    sans-IO interface), driven by the event loop. Used for both sides of a terminated
    connection; `feed` takes bytes already read from the socket (the ClientHello)."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, st: _Client, *,
                 server_side: bool, server_hostname: str | None = None) -> None:
        self.sock, self.st = sock, st
        self.inb, self.outb = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.inb, self.outb, server_side=server_side,
                                server_hostname=server_hostname)
        self.closed = False

    def feed(self, data: bytes) -> None:
        self.inb.write(data)

    async def _flush(self) -> None:
        data = self.outb.read()
        if data:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)
            self.st.last_active = time.monotonic()

    async def _fill(self) -> None:
        data = await asyncio.get_running_loop().sock_recv(self.sock, RELAY_BUF)
        self.st.last_active = time.monotonic()
        if data:
            self.inb.write(data)
        else:
            self.inb.write_eof()

    async def handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                if self.inb.eof:
                    raise ConnectionError("eof in the TLS handshake") from None
                await self._fill()
        await self._flush()

    async def recv(self, n: int = RELAY_BUF) -> bytes:
        """Decrypted bytes; b"" at the end (close_notify or a bare EOF: the HTTP framing
        above says whether that was early)."""
        while True:
            try:
                data = self.obj.read(n)
            except ssl.SSLWantReadError:
                await self._flush()
                if self.inb.eof:
                    return b""
                await self._fill()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            if self.outb.pending:
                await self._flush()
            return data

    def peer_closed(self) -> bool:
        """Between requests on a kept-alive upstream: has the server closed it (EOF or
        close_notify waiting on the socket, or anything else it sent unasked)?"""
        try:
            data = self.sock.recv(RELAY_BUF, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if not data:
            return True
        self.inb.write(data)
        try:
            self.obj.read(1)
        except ssl.SSLWantReadError:
            return False                 # a TLS record without data (a session ticket)
        except ssl.SSLError:
            return True
        return True                      # response bytes nobody asked for

    async def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        for i in range(0, len(view), RELAY_BUF):
            self.obj.write(view[i:i + RELAY_BUF])      # a memory BIO takes it all
            await self._flush()

    async def send_quiet(self, data: bytes) -> None:
        try:
            async with asyncio.timeout(5):
                await self.sendall(data)
        except (OSError, ssl.SSLError, TimeoutError):
            pass

    async def close(self) -> None:
        """Send close_notify (best effort)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.obj.unwrap()
        except (ssl.SSLError, ValueError):
            pass
        try:
            async with asyncio.timeout(1):
                await self._flush()
        except (OSError, TimeoutError):
            pass


async def _first_readable(loop, a: socket.socket, b: socket.socket) -> socket.socket:
    """Whichever of two sockets becomes readable first (a when both are)."""
    fut = loop.create_future()

    def ready(sock) -> None:
        if not fut.done():
            fut.set_result(sock)

    loop.add_reader(a.fileno(), ready, a)
    loop.add_reader(b.fileno(), ready, b)
    try:
        return await fut
    finally:
        loop.remove_reader(a.fileno())
        loop.remove_reader(b.fileno())


def _ssl_reason(e: BaseException) -> str:
    """One short line for an event: the OpenSSL reason, never data."""
    if isinstance(e, ssl.SSLError) and e.reason:
        return e.reason.lower().replace("_", " ")
    if isinstance(e, TimeoutError):
        return "timeout"
    if isinstance(e, ConnectionError):
        return "connection closed"
    return type(e).__name__


__all__ = ["TerminateMixin"]
