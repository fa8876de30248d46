"""The asyncio egress proxy: moves bytes, resolves each allowed name once, decides nothing.

Every decision comes from the sans-IO core (decide.py, conn.py, tls.py); this layer only

1. accepts on a listening socket it is given (one proxy process per sandbox),
2. parses the request with `ProxyConnection`,
3. asks `decide_target` **before** any DNS query (a denied name is never looked up),
4. resolves an allowed name once (the host's /etc/hosts first, hostsfile.py; else A, then AAAA
   if A has none; dnspython, cfg.nameservers), asks
   `check_address` for every candidate, and connects to a checked address: the address it
   connects to is the address it checked (no second lookup anywhere),
5. CONNECT: answers 200, then on port 443, or whenever the client's first bytes look like
   TLS, reads the whole ClientHello and requires its SNI to equal the CONNECT host before a
   single byte goes upstream; then relays both ways,
6. plain HTTP: sends the request in origin-form to the pinned address with
   ``Connection: close`` (one upstream connection per request; the client may keep its
   connection alive) and streams the response back through h11,
7. counts bytes and requests per canonical host against cfg.budget, and cuts a connection
   that would exceed them,
8. emits one event per decision: at once for a denial, when the connection (or, for plain
   HTTP, the request) ends for an allowed one. A connection cut by a budget or an SNI
   check ends with a "deny" event carrying the bytes that did pass. Connections refused
   for the connection cap give at most one event a second (host "", port 0).

Secret grants (secrets.py, mitm.py): a CONNECT to a host:port some grant names, whose client
speaks TLS, is *terminated*: after the SNI check the proxy completes the handshake with a
leaf minted by the run CA (ALPN http/1.1 only), opens its own TLS to the pinned address
(SNI and certificate check for the CONNECT host, against cfg.upstream_ca or the system
store), and runs HTTP/1.1 (h11) on both decrypted streams, with keep-alive to the upstream:
each request goes through `inject` (refused whole, 403, when a placeholder would leak), and
each response through a `ResponseScrubber`. Every other CONNECT stays a byte tunnel.
Plain-HTTP requests go through `inject` too (plain_http grants only), and responses from
granted hosts are scrubbed. On a terminated connection, bytes are counted decrypted (HTTP
bytes to and from the upstream), and each request after the first takes one more request
from the budget.

Budgets are counted per `Decision.budget_key`: the canonical host, or "*.suffix" for all
the names one wildcard rule lets through.

A listener on the host's own loopback (the process tier's) can be reached by any local user:
with cfg.peer_uid set, a connection is accepted only when the socket at its other end
belongs to that uid (peer.py: one sock_diag lookup, not a scan); any other is closed before a
byte is read, and reported (at most once a second).

Resource limits, so that a hostile client exhausts only its own proxy: at most
cfg.max_connections client connections (more get 503 and are closed), request heads capped
at cfg.max_header_bytes, cfg.header_timeout for a whole request head or ClientHello
(slowloris), cfg.idle_timeout without a byte either way, cfg.connect_timeout and
cfg.dns_timeout upstream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, ip_address

import h11

from ..events import NetEvent
from ..policy.hosts import HostError, IPAddress, host_header_text, parse_host
from . import hostsfile
from .config import NetConfig
from .conn import (
    CONNECT_OK,
    NEED_DATA,
    Closed,
    ConnectRequest,
    HttpRequest,
    ProxyConnection,
    ProxyProtocolError,
    RequestData,
    RequestEnd,
    deny_response,
    error_response,
    forward_request,
    inner_request,
    response_headers,
)
from .decide import Decision, check_address, decide_target
from .peer import PeerLookup
from .secrets import (
    GRANTED,
    ResponseScrubber,
    ScrubError,
    grants_for,
    inject,
    readable_accept_encoding,
    scrub_map,
    secret_event,
)
from .tls import MAX_HELLO, NEED_MORE, TLSError, looks_like_tls, parse_client_hello

RELAY_BUF = 256 * 1024
Emit = Callable[[dict], None]


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
class _Usage:
    bytes_out: int = 0
    bytes_in: int = 0
    requests: int = 0


@dataclass
class _Client:
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


def make_resolver(cfg: NetConfig):
    """A dnspython async resolver for cfg.nameservers (or /etc/resolv.conf), with a cache
    that honours TTLs."""
    import dns.asyncresolver
    import dns.nameserver
    import dns.resolver

    if cfg.nameservers:
        r = dns.asyncresolver.Resolver(configure=False)
        r.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in cfg.nameservers]
    else:
        r = dns.asyncresolver.Resolver()
    r.lifetime = cfg.dns_timeout
    r.timeout = min(2.0, cfg.dns_timeout)
    r.cache = dns.resolver.Cache()
    return r


class EgressProxy:
    def __init__(self, cfg: NetConfig, emit: Emit, *, resolver=None, hosts=None) -> None:
        self.cfg = cfg
        self._emit_cb = emit
        self._resolver = resolver if resolver is not None else make_resolver(cfg)
        #: the host's /etc/hosts (hostsfile.py), asked before DNS
        self._hosts = hosts if hosts is not None else hostsfile.load()[0]
        self._usage: dict[str, _Usage] = {}
        self._clients: dict[socket.socket, _Client] = {}
        self._last_overflow_event = 0.0
        self._last_foreign_event = 0.0
        self._peers = PeerLookup()
        self._grants = cfg.secrets
        self._leaves = None
        self._upstream_tls: ssl.SSLContext | None = None
        self._scrub_base = scrub_map(cfg.secrets)
        # compiles every value's spellings once (forms.py), before the first request
        self._redactor = ResponseScrubber(self._scrub_base)
        if cfg.secrets:
            from .mitm import LeafCache, upstream_context

            if cfg.ca_cert_pem is None or cfg.ca_key_pem is None:
                raise ValueError("secret grants need the run CA (ca_cert_pem, ca_key_pem)")
            self._leaves = LeafCache(cfg.ca_cert_pem, cfg.ca_key_pem)
            self._upstream_tls = upstream_context(cfg.upstream_ca)

    def redact(self, text: str) -> str:
        """`text` with every secret value, in every spelling the response scrubber knows,
        replaced by its placeholder (for stderr)."""
        raw = text.encode("utf-8", "surrogateescape")
        return self._redactor.scrub(raw).decode("utf-8", "surrogateescape")

    # --- lifecycle ---------------------------------------------------------------------

    async def serve(self, listener: socket.socket) -> None:
        """Accept until cancelled; on cancel, cut every connection (their events are
        emitted) and return."""
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        sweeper = asyncio.create_task(self._sweep())
        try:
            while True:
                try:
                    client, _ = await loop.sock_accept(listener)
                except OSError as e:
                    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        await asyncio.sleep(0.05)
                        continue
                    if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                        continue
                    raise
                client.setblocking(False)
                if self.cfg.peer_uid is not None and not self._peer_ok(client):
                    continue
                if len(self._clients) >= self.cfg.max_connections:
                    self._overflow(client)
                    continue
                _nodelay(client)
                st = _Client()
                self._clients[client] = st
                st.task = asyncio.create_task(self._run_client(client, st))
                st.task.add_done_callback(self._report_crash)
        finally:
            sweeper.cancel()
            tasks = [c.task for c in self._clients.values() if c.task is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, sweeper, return_exceptions=True)
            self._peers.close()

    def _report_crash(self, task: asyncio.Task) -> None:
        """A bug in one connection's handler must not pass silently (nor stop the others);
        the report goes through `redact`."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            import traceback

            text = "".join(traceback.format_exception(exc))
            print("corral-egress: connection handler failed:\n" + self.redact(text),
                  file=sys.stderr, end="")

    def _overflow(self, client: socket.socket) -> None:
        try:
            client.send(error_response(503, "too many connections",
                                       "corral: the sandbox has too many proxy connections open"))
        except OSError:
            pass
        client.close()
        now = time.monotonic()
        if now - self._last_overflow_event >= 1.0:
            self._last_overflow_event = now
            self._emit("", 0, False, "too many connections")

    def _peer_ok(self, client: socket.socket) -> bool:
        """cfg.peer_uid: is the client's socket that uid's? If not, close it (before a byte is
        read) and report it, at most once a second."""
        try:
            uid = self._peers.uid(client)
        except OSError:
            uid = None
        if uid == self.cfg.peer_uid:
            return True
        client.close()
        now = time.monotonic()
        if now - self._last_foreign_event >= 1.0:
            self._last_foreign_event = now
            who = "an unknown socket" if uid is None else f"uid {uid}"
            self._emit("", 0, False, f"a connection from {who}, not the sandbox's uid, "
                                     f"was refused")
        return False

    async def _sweep(self) -> None:
        """Cut connections that moved no byte for idle_timeout."""
        idle = self.cfg.idle_timeout
        while True:
            await asyncio.sleep(min(1.0, idle / 4))
            now = time.monotonic()
            for st in list(self._clients.values()):
                if now - st.last_active > idle and st.task is not None and not st.idle_cut:
                    st.idle_cut = True
                    st.task.cancel()

    def _emit(self, host: str, port: int, allow: bool, reason: str, bytes_in: int = 0,
              bytes_out: int = 0) -> None:
        self._emit_cb(NetEvent(host, port, "allow" if allow else "deny", reason, bytes_in,
                               bytes_out).to_dict())

    # --- one client connection -----------------------------------------------------------

    async def _run_client(self, client: socket.socket, st: _Client) -> None:
        try:
            await self._client(client, st)
        except asyncio.CancelledError:
            if not st.idle_cut:
                raise
        except (OSError, TimeoutError):
            pass
        finally:
            self._clients.pop(client, None)
            client.close()

    async def _client(self, client: socket.socket, st: _Client) -> None:
        loop = asyncio.get_running_loop()
        conn = ProxyConnection(max_header_bytes=self.cfg.max_header_bytes)
        first = True
        used: set[str] = set()              # grants already reported on this connection
        while True:
            try:
                ev = await self._read_head(client, conn, st, first)
            except ProxyProtocolError as e:
                if e.host is not None:
                    self._emit(_canon(e.host), e.port or 0, False, e.message)
                await _send_quiet(loop, client, deny_response(e.message) if e.status == 403
                                  else error_response(e.status, e.message))
                return
            except TimeoutError:
                await _send_quiet(loop, client, error_response(
                    408, "request head timeout", "corral: the request head took too long"))
                return
            first = False
            if isinstance(ev, Closed):
                return
            if isinstance(ev, ConnectRequest):
                await self._tunnel(client, conn, ev, st)
                return
            assert isinstance(ev, HttpRequest)
            if not await self._http(client, conn, ev, st, used):
                return

    async def _read_head(self, client, conn: ProxyConnection, st: _Client, first: bool):
        loop = asyncio.get_running_loop()
        limit = self.cfg.header_timeout
        async with asyncio.timeout(limit if first else None) as tm:
            while True:
                ev = conn.next_event()
                if ev is not NEED_DATA:
                    return ev
                data = await loop.sock_recv(client, 65536)
                st.last_active = time.monotonic()
                if tm.when() is None:
                    tm.reschedule(loop.time() + limit)
                conn.receive_data(data)

    # --- the shared steps: decide, budget, resolve, check, connect ------------------------

    async def _open(self, host: str, port: int
                    ) -> tuple[Decision, socket.socket, list[IPAddress]]:
        """Decide, take a request from the budget, resolve once, check, connect. Returns the
        decision, the connected socket and the checked addresses (to reconnect to without a
        second lookup). Raises _Refused (with the status and reason to send)."""
        d = decide_target(self.cfg, host, port)
        if not d.allow:
            raise _Refused(403, d.reason)
        exceeded = self._take_request(d.budget_key)
        if exceeded:
            raise _Refused(403, exceeded)
        if d.ip is not None:
            candidates: list[IPAddress] = [d.ip]
        else:
            candidates = await self._resolve(d.host)
        allowed, refusals = [], []
        for addr in candidates:
            c = check_address(self.cfg, addr, port)
            (allowed if c.allow else refusals).append(c)
        if not allowed:
            raise _Refused(403, refusals[0].reason if refusals else "dns: no address")
        addrs = [c.ip for c in allowed]
        sock = await self._connect(addrs, port)
        return d, sock, addrs

    def _take_request(self, host: str) -> str | None:
        b = self.cfg.budget
        u = self._usage.setdefault(host, _Usage())
        if b.requests is not None and u.requests >= b.requests:
            return "budget: requests"
        if b.bytes_out is not None and u.bytes_out >= b.bytes_out:
            return "budget: bytes_out"
        if b.bytes_in is not None and u.bytes_in >= b.bytes_in:
            return "budget: bytes_in"
        u.requests += 1
        return None

    async def _resolve(self, name: str) -> list[IPAddress]:
        import dns.exception
        import dns.name
        import dns.resolver

        known = self._hosts.get(name)
        if known:                       # the host's /etc/hosts, before any DNS query
            return list(known)
        qname = dns.name.from_text(name)

        async def query(rdtype: str) -> list[IPAddress]:
            ans = await self._resolver.resolve(qname, rdtype, search=False,
                                               raise_on_no_answer=False)
            if ans.rrset is None:
                return []
            return [ip_address(r.address) for r in ans.rrset]

        addrs: list[IPAddress] = []
        errors: list[Exception] = []
        try:
            async with asyncio.timeout(self.cfg.dns_timeout + 0.5):
                for rdtype in ("A", "AAAA"):          # AAAA only when A gave nothing
                    try:
                        addrs = await query(rdtype)
                    except dns.resolver.NXDOMAIN as e:
                        errors.append(e)
                        break
                    except (dns.exception.DNSException, OSError) as e:
                        errors.append(e)
                    if addrs:
                        return addrs
        except TimeoutError:
            raise _Refused(504, "dns: timeout") from None
        for e in errors:
            if isinstance(e, dns.resolver.NXDOMAIN):
                raise _Refused(502, "dns: no such name")
        for e in errors:
            if isinstance(e, dns.exception.Timeout):
                raise _Refused(504, "dns: timeout")
        if errors:
            raise _Refused(502, f"dns: {type(errors[0]).__name__}")
        raise _Refused(502, "dns: no address")

    async def _connect(self, addrs: list[IPAddress], port: int) -> socket.socket:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.connect_timeout
        last: str = "connect: failed"
        for addr in addrs:
            fam = socket.AF_INET if isinstance(addr, IPv4Address) else socket.AF_INET6
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                async with asyncio.timeout_at(deadline):
                    await loop.sock_connect(s, (str(addr), port))
            except TimeoutError:
                s.close()
                raise _Refused(504, "connect: timeout") from None
            except OSError as e:
                s.close()
                last = f"connect: {os.strerror(e.errno) if e.errno else 'failed'}".lower()
                continue
            except BaseException:
                s.close()
                raise
            _nodelay(s)
            return s
        raise _Refused(502, last)

    # --- CONNECT ----------------------------------------------------------------------

    async def _tunnel(self, client, conn: ProxyConnection, req: ConnectRequest,
                      st: _Client) -> None:
        loop = asyncio.get_running_loop()
        try:
            d, up, addrs = await self._open(req.host, req.port)
        except _Refused as r:
            self._emit(_canon(req.host), req.port, False, r.reason)
            await _send_quiet(loop, client, error_response(r.status, r.reason) if r.status != 403
                              else deny_response(r.reason))
            return
        flow = _Flow(d.host, req.port, d.reason, d.budget_key)
        try:
            await loop.sock_sendall(client, CONNECT_OK)
            first = conn.tunnel_data()
            if self._leaves is not None and grants_for(self._grants, d.host, req.port):
                try:
                    tls, first = await self._granted_hello(client, up, first, d, req.port, st)
                except _Cut as c:
                    flow.cut = c.reason
                    return
                if tls:
                    await self._mitm(client, up, first, d, addrs, flow, st)
                    return
            c2u = asyncio.create_task(self._client_to_upstream(client, up, first, d, flow, st))
            u2c = asyncio.create_task(self._pump(up, client, flow, "bytes_in", st))
            await self._join(c2u, u2c, flow)
        finally:
            up.close()
            self._end(flow)

    async def _join(self, a: asyncio.Task, b: asyncio.Task, flow: _Flow) -> None:
        """Run both directions; a cut or an error in one ends both."""
        pending = {a, b}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    exc = t.exception()
                    if isinstance(exc, _Cut):
                        flow.cut = exc.reason
                        return
                    if exc is not None:
                        return
        finally:
            for t in (a, b):
                t.cancel()
            await asyncio.gather(a, b, return_exceptions=True)

    async def _client_to_upstream(self, client, up, first: bytes, d: Decision, flow: _Flow,
                                  st: _Client) -> None:
        loop = asyncio.get_running_loop()
        buf = bytearray(first)
        if not buf and flow.port != 443:
            data = await loop.sock_recv(client, RELAY_BUF)
            st.last_active = time.monotonic()
            if not data:
                _shutdown(up)
                return
            buf += data
        if flow.port == 443 or looks_like_tls(bytes(buf[:2])):
            await self._check_client_hello(client, buf, d, st)
        await self._send(up, bytes(buf), flow, "bytes_out", st)
        await self._pump(client, up, flow, "bytes_out", st)

    async def _check_client_hello(self, client, buf: bytearray, d: Decision,
                                  st: _Client) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.cfg.header_timeout):
                while True:
                    hello = parse_client_hello(bytes(buf))
                    if hello is not NEED_MORE:
                        break
                    if len(buf) > MAX_HELLO + 1024:
                        raise TLSError("ClientHello too large")
                    data = await loop.sock_recv(client, 65536)
                    st.last_active = time.monotonic()
                    if not data:
                        raise _Cut("eof before the TLS ClientHello")
                    buf += data
        except TimeoutError:
            raise _Cut("tls: ClientHello timeout") from None
        except TLSError as e:
            raise _Cut(f"tls: {e}") from None
        if hello.sni is None:
            if d.ip is None:
                raise _Cut("no sni")
            return
        try:
            sni = parse_host(hello.sni)
        except HostError:
            raise _Cut("sni mismatch") from None
        if str(sni) != d.host:
            raise _Cut("sni mismatch")

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
        the event loop only when both ends would block."""
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
            flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
            while True:
                progress = False
                want_read = False
                if not eof and in_pipe < cap and left != 0:
                    n_max = cap - in_pipe if left is None else min(cap - in_pipe, left)
                    room = self._room(flow.key, direction)
                    if room is not None:
                        if room == 0:
                            if await _has_more(loop, src):
                                raise _Cut(f"budget: {direction}")
                            eof = True
                            n_max = 0
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
        room = self._room(flow.key, direction)
        n = len(data)
        if room is not None and n > room:
            if room > 0:
                await asyncio.get_running_loop().sock_sendall(dst, data[:room])
                self._count(flow, direction, room)
            raise _Cut(f"budget: {direction}")
        await asyncio.get_running_loop().sock_sendall(dst, data)
        st.last_active = time.monotonic()
        self._count(flow, direction, n)

    def _room(self, key: str, direction: str) -> int | None:
        limit = getattr(self.cfg.budget, direction)
        if limit is None:
            return None
        return max(0, limit - getattr(self._usage.setdefault(key, _Usage()), direction))

    def _count(self, flow: _Flow, direction: str, n: int) -> None:
        u = self._usage.setdefault(flow.key, _Usage())
        setattr(u, direction, getattr(u, direction) + n)
        setattr(flow, direction, getattr(flow, direction) + n)

    def _end(self, flow: _Flow) -> None:
        if flow.cut is not None:
            self._emit(flow.host, flow.port, False, flow.cut, flow.bytes_in, flow.bytes_out)
        else:
            self._emit(flow.host, flow.port, True, flow.reason, flow.bytes_in, flow.bytes_out)

    # --- terminated TLS for granted hosts ---------------------------------------------

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
                    exceeded = self._take_request(flow.key)
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
                    room = self._room(flow.key, "bytes_in")
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
        room = self._room(flow.key, "bytes_out")
        if room is not None and len(data) > room:
            raise _Cut("budget: bytes_out")
        await utls.sendall(data)
        self._count(flow, "bytes_out", len(data))

    # --- plain HTTP -------------------------------------------------------------------

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
                    room = self._room(flow.key, "bytes_in")
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


_HAVE_SPLICE = hasattr(os, "splice")
_PIPE_SIZE = 1 << 20


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
    try:
        return str(parse_host(host))
    except HostError:
        return "".join(c if 0x20 < ord(c) < 0x7F else "?" for c in host)[:255]


def _nodelay(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


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


#: fds one client connection can hold: its socket, the upstream's, two splice pipes (2 each)
FDS_PER_CONNECTION = 6
#: fds beyond the connections: listener, events, resolver sockets, the netlink socket, ...
FD_SLACK = 256


def nofile_for(max_connections: int) -> int:
    """The RLIMIT_NOFILE a proxy capped at `max_connections` needs."""
    return FDS_PER_CONNECTION * max_connections + FD_SLACK


def connections_within(nofile: int) -> int:
    """How many client connections fit in `nofile` descriptors (0: not even one)."""
    return max(0, (nofile - FD_SLACK) // FDS_PER_CONNECTION)


def raise_nofile(want: int) -> int:
    """Lift the soft RLIMIT_NOFILE towards `want` (up to the hard limit); returns the soft
    limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return want if soft == resource.RLIM_INFINITY else soft


__all__ = ["FDS_PER_CONNECTION", "RELAY_BUF", "EgressProxy", "connections_within",
           "make_resolver", "nofile_for", "raise_nofile"]
