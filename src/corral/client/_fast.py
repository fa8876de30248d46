"""The sync SDK's hottest calls, a foreground command's Result (`sb.commands.run(cmd)`
with no output callbacks: POST /sandboxes/{id}/exec, one JSON answer) and a cell's
Execution (`sb.run_code(code)` without callbacks: POST .../run_code), on a kept-alive
socket of its own instead of httpx.

httpx spends about 0.8 ms of CPU a request on a loopback service (URL merging and
parsing, header validation, h11's state machine, the Response object): as much as the
service's own parsing of it. http.client, used here before, costs less but still sends
the headers and the body in two writes (two TCP segments with TCP_NODELAY, so two
wake-ups of the service's event loop) and parses the answer's headers with the email
package. This path writes the request (the token, a JSON body as httpx encodes it) in
one send and reads the answer with a small HTTP/1.1 reader (a status line, headers, a
Content-Length or chunked body, 1xx answers skipped, `Connection: close` and HTTP/1.0
honoured). It keeps httpx's faces: a 4xx/5xx raises the same exception classes
(`_raise_error`), a transport failure raises httpx's own (ConnectError, ConnectTimeout,
WriteTimeout, WriteError, ReadTimeout, ReadError, RemoteProtocolError: all
httpx.TransportError), the timeouts are the caller's (connect 30 s; each read and write
the command's timeout + 60 s, or none). A connection the call did not finish with (an
error, an interrupt: the KeyboardInterrupt of a caller giving up) is closed, never
reused: the service sees the client go and kills the command, as with httpx. Nothing is
retried (a POST that may have run is never sent twice).

It applies only where httpx would have sent the request straight to the service: a
Sandbox on the shared pool (client._common.sync_client: httpx takes no proxy from the
environment for a client given its own transport, so neither does this path), plain http
or https (the process's TLS context, hostname checked), no proxy mounted on the client,
and an Authorization header with no control character. Anything else goes through httpx
as before.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import threading
import time
from typing import NoReturn
from urllib.parse import quote

import httpx

#: idle connections kept per service (a thread takes one for its call, then gives it back)
KEEP = 20
CONNECT_TIMEOUT_S = 30.0
#: an idle connection unused this long is closed, not reused (httpx's keepalive_expiry):
#: the service keeps one longer (corral serve's keep_alive, 310 s by default), so this
#: side lets it go first and never sends a request on one the service is closing
IDLE_EXPIRY_S = 5.0
#: the most bytes an answer's status line and headers may take (as h11's default)
HEAD_MAX = 64 << 10
RECV = 65536

_mu = threading.Lock()
_idle: dict[tuple, list[Conn]] = {}


class Route:
    """Where a Sandbox's exec goes on this path: the service's address, the path prefix
    of its URL, the request's fixed headers (Host, Authorization, ...)."""

    __slots__ = ("key", "scheme", "host", "port", "prefix", "auth", "head")

    def __init__(self, scheme: str, host: str, port: int, prefix: str, auth: str) -> None:
        self.scheme, self.host, self.port, self.prefix, self.auth = (scheme, host, port,
                                                                     prefix, auth)
        self.key = (scheme, host, port)
        name = f"[{host}]" if ":" in host else host
        if port != (443 if scheme == "https" else 80):
            name = f"{name}:{port}"
        self.head = (f"Host: {name}\r\nAuthorization: {auth}\r\nContent-Type: "
                     "application/json\r\nAccept: application/json\r\n").encode("latin-1")


class Conn:
    """A kept-alive connection: its socket and what was read past the last answer."""

    __slots__ = ("sock", "buf", "idle_since")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""
        #: time.monotonic() when it was last given back (idle since)
        self.idle_since = 0.0

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Protocol(Exception):
    """The answer is not HTTP/1.1 as this reader takes it (httpx: RemoteProtocolError)."""


def route_of(client: httpx.Client) -> Route | None:
    """The Route for `client`, or None where httpx must send it (see the module)."""
    from ._common import _SharedPool

    try:
        if not isinstance(client._transport, _SharedPool) or client._mounts:
            return None     # not the SDK's own client, or a proxy from the environment
        url = client.base_url
        auth = client.headers.get("authorization")
    except AttributeError:      # another httpx: keep to its public path
        return None
    if url.scheme not in ("http", "https") or not url.host or not auth:
        return None
    if any(ord(ch) < 32 or ord(ch) == 127 or ord(ch) > 255 for ch in auth):
        return None     # httpx says what is wrong with such a header
    port = url.port or (443 if url.scheme == "https" else 80)
    prefix = url.raw_path.decode("ascii").rstrip("/")
    if any(ord(ch) <= 32 or ord(ch) == 127 or ch in "?#" for ch in prefix):
        return None
    return Route(url.scheme, url.host, port, prefix, auth)


def post_exec(route: Route, sid: str, body: dict, timeout: float | None,
              sub: str = "exec") -> tuple[int, dict, bytes]:
    """POST {prefix}/sandboxes/{sid}/{sub} (exec, run_code) with `body`: (status,
    headers (lower-case names), raw body). `timeout`: each read and write's, None for
    none."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode()
    path = f"{route.prefix}/sandboxes/{quote(sid, safe='')}/{sub}"
    req = b"".join((f"POST {path} HTTP/1.1\r\n".encode("ascii"), route.head,
                    b"Content-Length: %d\r\n\r\n" % len(data), data))
    conn = _take(route)
    done = False
    try:
        conn.sock.settimeout(timeout)
        wrote = None
        try:
            conn.sock.sendall(req)       # one send: one wake-up of the service
        except socket.timeout as e:
            raise httpx.WriteTimeout(str(e) or "timed out writing the request") from e
        except OSError as e:
            # as httpx: the service may have answered before it read the whole body (a
            # 413 for a body over its cap) and closed; that answer is read if it is there
            wrote = e
        try:
            status, headers, raw, close = read_response(conn)
        except (socket.timeout, OSError, _Protocol) as e:
            if wrote is not None:
                raise httpx.WriteError(str(wrote) or type(wrote).__name__) from wrote
            if isinstance(e, socket.timeout):
                raise httpx.ReadTimeout(str(e) or "timed out reading the response") from e
            _read_error(e)
        done = wrote is None and not close
        return status, headers, raw
    finally:
        if done:
            _give(route, conn)
        else:
            conn.close()


def read_response(conn: Conn) -> tuple[int, dict, bytes, bool]:
    """The next answer on `conn`: (status, headers (lower-case names; the last of a
    repeated one), body, whether the connection must be closed after it). Raises
    _Protocol for what is not an HTTP/1.x answer, OSError / socket.timeout as recv."""
    while True:
        buf = conn.buf
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if len(buf) > HEAD_MAX:
                raise _Protocol(f"the answer's headers pass {HEAD_MAX} bytes")
            buf += _recv(conn.sock, "a response")
            end = buf.find(b"\r\n\r\n", max(0, len(buf) - RECV - 3))
        if end > HEAD_MAX:
            raise _Protocol(f"the answer's headers pass {HEAD_MAX} bytes")
        lines = buf[:end].split(b"\r\n")
        conn.buf = buf[end + 4:]
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") \
                or len(parts[1]) != 3 or not parts[1].isdigit():
            raise _Protocol(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if not sep or not k or k != k.strip():
                raise _Protocol(f"not a header line: {line[:80]!r}")
            headers[k.decode("latin-1").lower()] = v.strip(b" \t").decode("latin-1")
        if 100 <= status < 200:      # an interim answer (100 Continue): the real one follows
            continue
        break
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    close = "close" in tokens or (parts[0] == b"HTTP/1.0" and "keep-alive" not in tokens)
    te = headers.get("transfer-encoding")
    if status in (204, 304):
        body = b""
    elif te is not None:
        if te.strip().lower() != "chunked":
            raise _Protocol(f"a transfer-encoding this client does not read: {te[:40]!r}")
        body = _chunked(conn)
    elif "content-length" in headers:
        n = headers["content-length"].strip()
        if not n.isdigit() or not n.isascii():
            raise _Protocol(f"a bad content-length: {n[:40]!r}")
        body = _exactly(conn, int(n))
    else:                  # the body runs to the connection's end
        chunks = [conn.buf]
        conn.buf = b""
        while True:
            chunk = conn.sock.recv(RECV)
            if not chunk:
                break
            chunks.append(chunk)
        return status, headers, b"".join(chunks), True
    if conn.buf:            # more than the answer: nothing this client asked for
        close = True
    return status, headers, body, close


def _recv(sock: socket.socket, what: str) -> bytes:
    chunk = sock.recv(RECV)
    if not chunk:
        raise _Protocol(f"the server disconnected without sending {what} whole")
    return chunk


def _exactly(conn: Conn, n: int) -> bytes:
    buf = conn.buf
    if len(buf) < n:
        chunks, have = [buf], len(buf)
        while have < n:
            chunk = _recv(conn.sock, "the response's body")
            chunks.append(chunk)
            have += len(chunk)
        buf = b"".join(chunks)
    conn.buf = buf[n:]
    return buf[:n]


def _line(conn: Conn) -> bytes:
    buf = conn.buf
    end = buf.find(b"\r\n")
    while end < 0:
        if len(buf) > HEAD_MAX:
            raise _Protocol("a chunk's size line is too long")
        buf += _recv(conn.sock, "the response's body")
        end = buf.find(b"\r\n")
    conn.buf = buf[end + 2:]
    return buf[:end]


def _chunked(conn: Conn) -> bytes:
    out = []
    while True:
        size = _line(conn).split(b";", 1)[0].strip()
        try:
            n = int(size, 16)
        except ValueError:
            raise _Protocol(f"a bad chunk size: {size[:40]!r}") from None
        if n < 0 or size.startswith((b"-", b"+", b"0x", b"0X")):
            raise _Protocol(f"a bad chunk size: {size[:40]!r}")
        if n == 0:
            while _line(conn):        # trailers, up to the empty line
                pass
            return b"".join(out)
        out.append(_exactly(conn, n))
        if _exactly(conn, 2) != b"\r\n":
            raise _Protocol("a chunk does not end with CRLF")


def _read_error(e: BaseException) -> NoReturn:
    """httpx's exception for a failure reading the answer."""
    if isinstance(e, _Protocol):
        raise httpx.RemoteProtocolError(str(e)) from e
    raise httpx.ReadError(str(e) or type(e).__name__) from e


def _take(route: Route) -> Conn:
    """An idle connection to the service that it has not closed, or a new one."""
    key = (os.getpid(), *route.key)     # a forked child never writes on its parent's
    while True:
        with _mu:
            conns = _idle.get(key)
            conn = conns.pop() if conns else None
        if conn is None:
            return _connect(route)
        try:     # readable while idle: the service closed it (its keep-alive timeout)
            stale = (time.monotonic() - conn.idle_since > IDLE_EXPIRY_S
                     or bool(select.select([conn.sock], [], [], 0)[0]))
        except (OSError, ValueError):
            stale = True
        if not stale:
            return conn
        conn.close()


def _give(route: Route, conn: Conn) -> None:
    key = (os.getpid(), *route.key)
    with _mu:
        if not _idle:
            atexit.register(_close_idle)
        conns = _idle.setdefault(key, [])
        if len(conns) < KEEP:
            conn.idle_since = time.monotonic()
            conns.append(conn)
            return
    conn.close()


def _close_idle() -> None:
    """At exit: this process's idle connections closed (not left to the collector)."""
    with _mu:
        conns = [c for k, cs in _idle.items() if k[0] == os.getpid() for c in cs]
        _idle.clear()
    for c in conns:
        c.close()


def _connect(route: Route) -> Conn:
    try:
        sock = socket.create_connection((route.host, route.port), CONNECT_TIMEOUT_S)
    except socket.timeout as e:
        raise httpx.ConnectTimeout(str(e) or "timed out connecting") from e
    except OSError as e:      # refused, unreachable
        raise httpx.ConnectError(str(e) or type(e).__name__) from e
    try:
        # no Nagle wait for whatever follows the request's one send
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if route.scheme == "https":
            from ._common import tls_context

            sock = tls_context().wrap_socket(sock, server_hostname=route.host)
    except socket.timeout as e:
        sock.close()
        raise httpx.ConnectTimeout(str(e) or "timed out connecting") from e
    except OSError as e:      # a TLS failure (ssl.SSLError)
        sock.close()
        raise httpx.ConnectError(str(e) or type(e).__name__) from e
    return Conn(sock)
