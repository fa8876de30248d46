"""Plain-HTTP forwarding: one request of a client connection to its pinned upstream.

`ForwardMixin._http` gets a parsed `HttpRequest` (conn.py) from server.py's loop and

1. runs it through `inject` when the run has secret grants (plain_http grants only; a
   placeholder that would leak refuses the request whole, 403),
2. opens the upstream through the proxy's `_open` (decide, budget, resolve once, check,
   connect: server.py),
3. sends the request in origin-form with ``Connection: close`` (one upstream connection per
   request; the client may keep its connection alive), its body counted against bytes_out,
4. streams the response back through h11, counted against bytes_in; responses from granted
   hosts go through a `ResponseScrubber`. A large Content-Length body of an ungranted host
   (PASSTHROUGH_MIN and up) is spliced socket to socket after its head (`_passthrough`).
   A response that would pass the bytes_in budget is cut; whatever complete events fit are
   still sent (`_relay_response_events`).

One event per request, when it ends (relay.RelayMixin._end). The proxy class
(server.EgressProxy) provides `cfg`, `_grants`, `_scrub_base` and `_open`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import h11

from .config import Grant, NetConfig
from .conn import (
    NEED_DATA,
    HttpRequest,
    ProxyConnection,
    ProxyProtocolError,
    RequestData,
    RequestEnd,
    deny_response,
    error_response,
    forward_request,
    response_headers,
)
from .relay import RELAY_BUF, RelayMixin, _canon, _Client, _Cut, _Flow, _Refused, _send_quiet
from .secrets import (
    GRANTED,
    ResponseScrubber,
    ScrubError,
    grants_for,
    inject,
    readable_accept_encoding,
    secret_event,
)


class ForwardMixin(RelayMixin):
    """Plain-HTTP requests, for server.EgressProxy."""

    cfg: NetConfig
    _grants: tuple[Grant, ...]
    _scrub_base: dict[bytes, bytes]

    async def _http(self, client, conn: ProxyConnection, req: HttpRequest, st: _Client,
                    used: set[str]) -> bool:
        """Forward one request; True when the client connection may carry another."""
        loop = asyncio.get_running_loop()
        scrubber: ResponseScrubber | None = None
        if self._grants:
            canon = _canon(req.host)
            inj = inject(self._grants, canon, req.port, "http", req.method, req.path,
                         req.headers, time.time())
            if inj.denied is not None:
                self._emit_cb(inj.denied)
                await _send_quiet(loop, client, deny_response(inj.reason or "secret"))
                return False
            if grants_for(self._grants, canon, req.port):
                req = dataclasses.replace(req, headers=tuple(readable_accept_encoding(
                    inj.headers)), path=inj.target)
                scrubber = ResponseScrubber(self._scrub_base, inj.echoes)
            for name in inj.used:
                if name not in used:
                    used.add(name)
                    self._emit_cb(secret_event(name, canon, req.port, "inject", GRANTED))
        try:
            d, up, _ = await self._open(req.host, req.port)
        except _Refused as r:
            self._emit(_canon(req.host), req.port, False, r.reason)
            await _send_quiet(loop, client, error_response(r.status, r.reason) if r.status != 403
                              else deny_response(r.reason))
            return False
        flow = _Flow(d.host, req.port, d.reason, d.budget_key)
        started = False
        try:
            if conn.client_waits_for_100:
                await loop.sock_sendall(client, conn.send(
                    h11.InformationalResponse(status_code=100, headers=[])))
            upc = h11.Connection(h11.CLIENT)
            await self._send(up, upc.send(forward_request(req)), flow, "bytes_out", st)
            while True:                                   # request body
                ev = conn.next_event()
                if ev is NEED_DATA:
                    data = await loop.sock_recv(client, RELAY_BUF)
                    st.last_active = time.monotonic()
                    conn.receive_data(data)
                elif isinstance(ev, RequestData):
                    await self._send(up, upc.send(h11.Data(data=ev.data)), flow, "bytes_out", st)
                elif isinstance(ev, RequestEnd):
                    await self._send(up, upc.send(h11.EndOfMessage()), flow, "bytes_out", st)
                    break
                else:
                    return False
            pending = bytearray()                         # coalesced writes to the client
            while True:                                   # response
                ev = upc.next_event()
                if ev is h11.NEED_DATA:
                    if pending:
                        await loop.sock_sendall(client, pending)
                        pending.clear()
                    data = await loop.sock_recv(up, RELAY_BUF)
                    st.last_active = time.monotonic()
                    room = self._budgets.room(flow.key, "bytes_in")
                    if room is not None and len(data) > room:
                        upc.receive_data(data[:room])
                        self._count(flow, "bytes_in", room)
                        flow.cut = "budget: bytes_in"
                        if pending:
                            await loop.sock_sendall(client, pending)
                        await self._relay_response_events(upc, conn, client, started,
                                                          scrubber)
                        return False
                    self._count(flow, "bytes_in", len(data))
                    upc.receive_data(data)
                    continue
                if isinstance(ev, h11.InformationalResponse):
                    if ev.status_code != 101:
                        pending += conn.send(ev)
                    continue
                if isinstance(ev, h11.Response):
                    if scrubber is not None:
                        has_body = not (req.method == b"HEAD" or ev.status_code in (204, 304))
                        headers = scrubber.start(response_headers(ev.headers),
                                                 has_body=has_body)
                        started = True
                        pending += conn.send(h11.Response(
                            status_code=ev.status_code, reason=scrubber.scrub(bytes(ev.reason)),
                            headers=headers))
                        continue
                    started = True
                    length = _passthrough_length(req, ev)
                    if length is not None:
                        if pending:
                            await loop.sock_sendall(client, pending)
                        await self._passthrough(upc, conn, client, up, ev, length, flow, st)
                        return False
                    pending += conn.send(h11.Response(
                        status_code=ev.status_code, reason=ev.reason,
                        headers=response_headers(ev.headers)))
                elif isinstance(ev, h11.Data):
                    if scrubber is not None:
                        for piece in scrubber.feed(bytes(ev.data)):
                            pending += conn.send(h11.Data(data=piece))
                    else:
                        pending += conn.send(h11.Data(data=ev.data))
                elif isinstance(ev, h11.EndOfMessage):
                    if scrubber is not None:
                        tail = scrubber.end()
                        if tail:
                            pending += conn.send(h11.Data(data=tail))
                    pending += conn.send(h11.EndOfMessage())
                    await loop.sock_sendall(client, pending)
                    break
                else:
                    return False
                if len(pending) >= RELAY_BUF:
                    await loop.sock_sendall(client, pending)
                    pending.clear()
                st.last_active = time.monotonic()
        except _Cut as c:
            flow.cut = c.reason
            if not started:
                await _send_quiet(loop, client, deny_response(c.reason))
            return False
        except ProxyProtocolError:
            return False
        except ScrubError as e:                       # fail closed: cut, never pass
            flow.cut = str(e)
            if not started:
                await _send_quiet(loop, client, error_response(502, str(e)))
            return False
        except h11.ProtocolError:
            flow.cut = "bad response from upstream"
            if not started:
                await _send_quiet(loop, client, error_response(
                    502, "bad response from upstream"))
            return False
        except (ConnectionError, OSError):
            if not started:
                await _send_quiet(loop, client, error_response(502, "upstream connection failed"))
            return False
        finally:
            up.close()
            self._end(flow)
        return conn.keep_alive

    async def _passthrough(self, upc, conn: ProxyConnection, client, up, resp, length: int,
                           flow: _Flow, st: _Client) -> None:
        """A large Content-Length body: head through h11 (with Connection: close), what h11
        already buffered, then the rest spliced socket to socket."""
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, conn.send_passthrough(h11.Response(
            status_code=resp.status_code, reason=resp.reason,
            headers=response_headers(resp.headers))))
        sent = 0
        while True:
            ev = upc.next_event()
            if isinstance(ev, h11.Data):
                await loop.sock_sendall(client, ev.data)
                sent += len(ev.data)
            else:
                break
        if length > sent:
            await self._pump(up, client, flow, "bytes_in", st, length=length - sent)

    async def _relay_response_events(self, upc, conn, client, started: bool,
                                     scrubber: ResponseScrubber | None = None) -> None:
        """Forward whatever complete events h11 can still give (the budgeted remainder;
        through the scrubber, whose held-back tail is then dropped)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                ev = upc.next_event()
                if isinstance(ev, h11.Response):
                    headers = response_headers(ev.headers)
                    if scrubber is not None:
                        headers = scrubber.start(headers, has_body=True)
                    await loop.sock_sendall(client, conn.send(h11.Response(
                        status_code=ev.status_code, headers=headers,
                        reason=ev.reason if scrubber is None else scrubber.scrub(ev.reason))))
                elif isinstance(ev, h11.Data):
                    pieces = [ev.data] if scrubber is None else list(scrubber.feed(ev.data))
                    for piece in pieces:
                        await loop.sock_sendall(client, conn.send(h11.Data(data=piece)))
                else:
                    return
        except (h11.ProtocolError, ScrubError, OSError):
            return


#: response bodies at least this large (Content-Length) are spliced, not parsed
PASSTHROUGH_MIN = 1 << 20


def _passthrough_length(req: HttpRequest, resp) -> int | None:
    if req.method == b"HEAD" or resp.status_code in (204, 304) or resp.status_code < 200:
        return None
    lengths = [v for k, v in resp.headers if k == b"content-length"]
    if len(lengths) != 1 or any(k == b"transfer-encoding" for k, _ in resp.headers):
        return None
    try:
        n = int(lengths[0])
    except ValueError:
        return None
    return n if n >= PASSTHROUGH_MIN else None


__all__ = ["PASSTHROUGH_MIN", "ForwardMixin"]
