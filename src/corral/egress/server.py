"""The asyncio egress proxy: moves bytes, resolves each allowed name once, decides nothing.

Every decision comes from the sans-IO core (decide.py, conn.py, tls.py, budget.py); this
layer only

1. accepts on a listening socket it is given (one proxy process per sandbox),
2. parses the request with `ProxyConnection`,
3. asks `decide_target` **before** any DNS query (a denied name is never looked up),
4. resolves an allowed name once (the host's /etc/hosts first, hostsfile.py; else A, then AAAA
   if A has none; dnspython, cfg.nameservers), asks
   `check_address` for every candidate, and connects to a checked address: the address it
   connects to is the address it checked (no second lookup anywhere),
5. CONNECT: answers 200, then on port 443, or whenever the client's first bytes look like
   TLS, reads the whole ClientHello and requires its SNI to equal the CONNECT host before a
   single byte goes upstream; then relays both ways (relay.py's pumps, splice(2)),
6. plain HTTP: hands each request to forward.py (origin-form to the pinned address, the
   response streamed back through h11),
7. counts bytes and requests per budget key against cfg.budget (budget.py decides, relay.py
   counts), and cuts a connection that would exceed them,
8. emits one event per decision: at once for a denial, when the connection (or, for plain
   HTTP, the request) ends for an allowed one. A connection cut by a budget or an SNI
   check ends with a "deny" event carrying the bytes that did pass. Connections refused
   for the connection cap give at most one event a second (host "", port 0).

Secret grants (secrets.py, mitm.py): a CONNECT to a host:port some grant names, whose client
speaks TLS, is *terminated* after the SNI check (terminate.py): HTTP/1.1 on both decrypted
streams, each request through `inject`, each response through a `ResponseScrubber`. Every
other CONNECT stays a byte tunnel. Plain-HTTP requests go through `inject` too (plain_http
grants only), and responses from granted hosts are scrubbed (forward.py).

`EgressProxy` is one class split by concern over mixins: TerminateMixin (terminate.py),
ForwardMixin (forward.py) and RelayMixin (relay.py: per-connection state, the byte pumps,
the flow's event). This module imports them; they import nothing of it.

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
import errno
import os
import socket
import ssl
import sys
import time
from ipaddress import IPv4Address, ip_address

from ..policy.hosts import HostError, IPAddress, parse_host
from . import hostsfile
from .budget import Budgets
from .config import NetConfig
from .conn import (
    CONNECT_OK,
    NEED_DATA,
    Closed,
    ConnectRequest,
    HttpRequest,
    ProxyConnection,
    ProxyProtocolError,
    deny_response,
    error_response,
)
from .decide import Decision, check_address, decide_target
from .forward import ForwardMixin
from .peer import PeerLookup
from .relay import (
    CONN,
    RELAY_BUF,
    Emit,
    RelayMixin,
    _canon,
    _Client,
    _Cut,
    _Flow,
    _Refused,
    _send_quiet,
    _shutdown,
)
from .secrets import ResponseScrubber, grants_for, scrub_map
from .terminate import TerminateMixin
from .tls import MAX_HELLO, NEED_MORE, TLSError, looks_like_tls, parse_client_hello


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


class EgressProxy(TerminateMixin, ForwardMixin, RelayMixin):
    """One sandbox's proxy: accepts, decides (through the core), resolves once,
    connects, and tunnels; plain HTTP and terminated TLS come from the mixins."""

    def __init__(self, cfg: NetConfig, emit: Emit, *, resolver=None, hosts=None,
                 track_conns: bool = False) -> None:
        self.cfg = cfg
        self._emit_cb = emit
        #: track_conns: `emit` also gets {"open": N} when client connection N starts and
        #: {"closed": N} after its last event, and each event of it carries "conn": N (the
        #: supervisor knows which connections are open: runtime/live.py waits, at a
        #: command's end, only while one it may have opened is)
        self._track_conns = track_conns
        self._conn_seq = 0
        self._resolver = resolver if resolver is not None else make_resolver(cfg)
        #: the host's /etc/hosts (hostsfile.py), asked before DNS
        self._hosts = hosts if hosts is not None else hostsfile.load()[0]
        self._budgets = Budgets(cfg.budget)
        #: decide_target and check_address are pure functions of the (frozen) config and
        #: their arguments: each answer is kept, per (host as written, port) and (address,
        #: port), up to DECISIONS_KEPT entries (then the table starts again)
        self._decisions: dict[tuple[str, int], Decision] = {}
        self._checks: dict[tuple[IPAddress, int], Decision] = {}
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
        emitted) and return. The listener stays registered with the event loop: each
        wake-up accepts every connection waiting (up to ACCEPT_BATCH), without a future,
        a task switch and two epoll_ctl calls per connection as loop.sock_accept costs."""
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        fd = listener.fileno()
        failed: asyncio.Future = loop.create_future()

        def resume() -> None:
            if not failed.done():
                loop.add_reader(fd, ready)

        def ready() -> None:
            for _ in range(ACCEPT_BATCH):
                try:
                    client, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as e:
                    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        loop.remove_reader(fd)          # out of fds: try again shortly
                        loop.call_later(0.05, resume)
                        return
                    if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                        continue
                    loop.remove_reader(fd)
                    if not failed.done():
                        failed.set_exception(e)
                    return
                self._accepted(client)

        sweeper = asyncio.create_task(self._sweep())
        loop.add_reader(fd, ready)
        try:
            await failed
        finally:
            loop.remove_reader(fd)
            sweeper.cancel()
            tasks = [c.task for c in self._clients.values() if c.task is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, sweeper, return_exceptions=True)
            self._peers.close()

    def _accepted(self, client: socket.socket) -> None:
        client.setblocking(False)
        if self.cfg.peer_uid is not None and not self._peer_ok(client):
            return
        if len(self._clients) >= self.cfg.max_connections:
            self._overflow(client)
            return
        _nodelay(client)
        st = _Client()
        self._clients[client] = st
        st.task = asyncio.create_task(self._run_client(client, st))
        st.task.add_done_callback(self._report_crash)

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


    # --- one client connection -----------------------------------------------------------

    async def _run_client(self, client: socket.socket, st: _Client) -> None:
        n = None
        if self._track_conns:      # this task's own context: its events carry n
            self._conn_seq += 1
            n = self._conn_seq
            CONN.set(n)
            self._emit_cb({"open": n})
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
            if n is not None:
                self._emit_cb({"closed": n})

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
        if first:           # the head is usually there already: no timer, no wait
            try:
                data = client.recv(65536)
            except (BlockingIOError, InterruptedError):
                pass
            else:
                st.last_active = time.monotonic()
                conn.receive_data(data)
                ev = conn.next_event()
                if ev is not NEED_DATA:
                    return ev
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
        d = self._decisions.get((host, port))
        if d is None:
            d = decide_target(self.cfg, host, port)
            _keep(self._decisions, (host, port), d)
        if not d.allow:
            raise _Refused(403, d.reason)
        exceeded = self._budgets.take_request(d.budget_key)
        if exceeded:
            raise _Refused(403, exceeded)
        if d.ip is not None:
            candidates: list[IPAddress] = [d.ip]
        else:
            candidates = await self._resolve(d.host)
        allowed, refusals = [], []
        for addr in candidates:
            c = self._checks.get((addr, port))
            if c is None:
                c = check_address(self.cfg, addr, port)
                _keep(self._checks, (addr, port), c)
            (allowed if c.allow else refusals).append(c)
        if not allowed:
            raise _Refused(403, refusals[0].reason if refusals else "dns: no address")
        addrs = [c.ip for c in allowed]
        sock = await self._connect(addrs, port)
        return d, sock, addrs


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


#: decisions kept per proxy (server.EgressProxy._decisions, _checks), each table
DECISIONS_KEPT = 1024


def _keep(table: dict, key, value) -> None:
    if len(table) >= DECISIONS_KEPT:
        table.clear()
    table[key] = value


def _nodelay(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


#: connections accepted in one wake-up of the listener at most (then the loop runs the
#: rest of its work; the listener, still readable, wakes it again)
ACCEPT_BATCH = 64

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
