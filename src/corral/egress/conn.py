"""The client side of the egress proxy as a sans-IO state machine, shaped like h11's Connection.

    conn = ProxyConnection()
    conn.receive_data(b"CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org:443\\r\\n\\r\\n")
    conn.next_event()   # -> ConnectRequest(host="pypi.org", port=443)
    conn.tunnel_data()  # -> bytes the client sent after the request (start of the tunnel)

Events, in the order a client produces them:

    ConnectRequest            CONNECT host:port; then the connection is a tunnel
    HttpRequest               an absolute-form request (http:// only)
      RequestData*            its body, as it arrives
      RequestEnd              end of its body; then PAUSED until the response is sent
    Closed                    the client closed cleanly between requests

`next_event()` returns one of those, `NEED_DATA`, or `PAUSED`; anything malformed raises
`ProxyProtocolError` (and only that: the fuzz test holds it to this). The proxy answers with
`send(h11 event) -> bytes` for relayed responses, or with the ready-made `error_response()` /
`deny_response()` bytes, after which it closes the connection.

HTTP/1.1 parsing is h11's; this module adds what a forward proxy must check: the request
target must be an absolute http:// URL (origin-form gets 400 "use the proxy with absolute
URLs"), it must carry no userinfo, the Host header must name the same host and port as the
URL (403 "host header mismatch"), and a CONNECT authority must be host:port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import h11

from ..errors import CorralError
from ..policy.hosts import HostError, host_header_text, parse_host


class ProxyProtocolError(CorralError):
    """The client broke HTTP or the proxy's rules for it. ``status`` is the answer to send;
    ``host``/``port`` are set when the request named a target (then it is also a deny)."""

    kind = "proxy-protocol"
    exit_code = 125

    def __init__(self, message: str, *, status: int = 400, host: str | None = None,
                 port: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.host = host
        self.port = port


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Sentinel("NEED_DATA")
PAUSED = _Sentinel("PAUSED")

Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    host: str                # as the client wrote it (brackets removed); decide.py canonicalises
    port: int
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: bytes
    host: str                # host of the absolute URL, as written (brackets removed)
    port: int
    path: bytes              # origin-form: "/path?query"
    headers: Headers = ()
    http_version: bytes = b"1.1"


@dataclass(frozen=True, slots=True)
class RequestData:
    data: bytes


@dataclass(frozen=True, slots=True)
class RequestEnd:
    pass


@dataclass(frozen=True, slots=True)
class Closed:
    pass


Event = ConnectRequest | HttpRequest | RequestData | RequestEnd | Closed

#: hop-by-hop headers, never forwarded (RFC 9110 7.6.1), plus the proxy's own
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                        b"upgrade", b"proxy-authorization", b"proxy-authenticate"})

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)", re.DOTALL)   # fullmatch

# states
_REQUEST, _BODY, _RESPONSE, _TUNNEL, _CLOSED = "request", "body", "response", "tunnel", "closed"


class ProxyConnection:
    """One client connection to the proxy. Feed bytes in, take events out; no I/O."""

    def __init__(self, max_header_bytes: int = 16384) -> None:
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self._max_header_bytes = max_header_bytes
        self._state = _REQUEST
        self._error: ProxyProtocolError | None = None
        self._tunnel = bytearray()
        self.request: HttpRequest | ConnectRequest | None = None

    @property
    def state(self) -> str:
        return self._state

    def receive_data(self, data: bytes) -> None:
        """Bytes from the client; b"" means the client closed its side."""
        if self._state == _TUNNEL:
            self._tunnel += data                   # the tunnel's first bytes, kept whole
            return
        try:
            self._h11.receive_data(data)
        except RuntimeError:                        # data after the client closed
            self._fail(ProxyProtocolError("data after the end of the stream"))

    def next_event(self) -> Event | _Sentinel:
        if self._error is not None:
            raise self._error
        try:
            return self._next_event()
        except ProxyProtocolError as e:
            self._fail(e)
            raise
        except h11.RemoteProtocolError as e:
            status = e.error_status_hint if e.error_status_hint in (400, 431) else 400
            err = ProxyProtocolError(_h11_message(e), status=status)
            self._fail(err)
            raise err from None

    def _fail(self, err: ProxyProtocolError) -> None:
        self._error = err
        self._state = _CLOSED

    def _next_event(self) -> Event | _Sentinel:
        if self._state in (_RESPONSE, _TUNNEL):
            return PAUSED
        if self._state == _CLOSED:
            return Closed()
        ev = self._h11.next_event()
        if ev is h11.NEED_DATA:
            return NEED_DATA
        if ev is h11.PAUSED:
            return PAUSED
        if isinstance(ev, h11.ConnectionClosed):
            self._state = _CLOSED
            return Closed()
        if self._state == _REQUEST:
            if not isinstance(ev, h11.Request):
                raise ProxyProtocolError("expected a request")
            return self._on_request(ev)
        if isinstance(ev, h11.Data):
            return RequestData(bytes(ev.data))
        if isinstance(ev, h11.EndOfMessage):
            self._state = _RESPONSE
            return RequestEnd()
        raise ProxyProtocolError("unexpected event in a request body")

    def _on_request(self, ev: h11.Request) -> Event:
        headers = tuple((bytes(k), bytes(v)) for k, v in ev.headers)
        size = len(ev.target) + sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self._max_header_bytes:
            raise ProxyProtocolError("request head too large", status=431)
        target = bytes(ev.target).decode("latin-1")
        if ev.method == b"CONNECT":
            if any(k in (b"content-length", b"transfer-encoding") for k, _ in headers):
                raise ProxyProtocolError("CONNECT must not carry a body")
            host, port = split_authority(target, default_port=None)
            # h11 sees no body, so the next event is EndOfMessage and then PAUSED
            end = self._h11.next_event()
            if not isinstance(end, h11.EndOfMessage):
                raise ProxyProtocolError("CONNECT must not carry a body")
            self._state = _TUNNEL
            self._tunnel = bytearray(self._h11.trailing_data[0])
            self.request = ConnectRequest(host=host, port=port, headers=headers)
            return self.request
        m = _SCHEME.fullmatch(target)
        if m is None:
            raise ProxyProtocolError("use the proxy with absolute URLs (http://host/path)")
        scheme, authority, rest = m.group(1).lower(), m.group(2), m.group(3)
        if scheme == "https":
            raise ProxyProtocolError("use CONNECT for https:// URLs")
        if scheme != "http":
            raise ProxyProtocolError(f"only http:// URLs can be proxied, not {scheme}://")
        if "@" in authority:
            raise ProxyProtocolError("userinfo (user@) is not allowed in proxy URLs")
        if "#" in rest:
            raise ProxyProtocolError("a fragment (#) does not belong in a request")
        host, port = split_authority(authority, default_port=80)
        path = rest if rest.startswith("/") else "/" + rest
        _check_host_header(headers, host, port, default_port=80)
        self._state = _BODY
        self.request = HttpRequest(method=bytes(ev.method), host=host, port=port,
                                   path=path.encode("latin-1"), headers=headers,
                                   http_version=bytes(ev.http_version))
        return self.request

    def tunnel_data(self) -> bytes:
        """After a ConnectRequest: the bytes the client sent beyond the request head."""
        data, self._tunnel = bytes(self._tunnel), bytearray()
        return data

    @property
    def client_waits_for_100(self) -> bool:
        return self._h11.they_are_waiting_for_100_continue

    def send(self, event: h11.InformationalResponse | h11.Response | h11.Data
             | h11.EndOfMessage) -> bytes:
        """Bytes of a relayed response; after its EndOfMessage the next request may follow."""
        out = self._h11.send(event) or b""
        if isinstance(event, h11.EndOfMessage):
            if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
                self._h11.start_next_cycle()
                self._state = _REQUEST
            else:
                self._state = _CLOSED
        return out

    def send_passthrough(self, response: h11.Response) -> bytes:
        """The head of a response whose body the caller relays raw (Content-Length framed).
        Adds ``Connection: close``: the connection ends with this response."""
        headers = [(k, v) for k, v in response.headers if k.lower() != b"connection"]
        headers.append((b"connection", b"close"))
        out = self._h11.send(h11.Response(status_code=response.status_code, headers=headers,
                                          reason=response.reason)) or b""
        self._state = _CLOSED
        return out

    @property
    def keep_alive(self) -> bool:
        return self._state == _REQUEST


def split_authority(text: str, *, default_port: int | None) -> tuple[str, int]:
    """"host:port", "[v6]:port", or "host" when default_port is given. Raises
    ProxyProtocolError. The host is returned as written, brackets removed."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ProxyProtocolError("unbalanced [ in authority")
        host, rest = text[1:end], text[end + 1:]
        if rest and not rest.startswith(":"):
            raise ProxyProtocolError("junk after ] in authority")
        port_text = rest[1:] if rest else None
        if not host:
            raise ProxyProtocolError("empty host")
        host = "[" + host + "]"
    else:
        if text.count(":") > 1:
            raise ProxyProtocolError("IPv6 addresses need brackets: [::1]:443")
        host, sep, port_text_ = text.partition(":")
        port_text = port_text_ if sep else None
    if not host:
        raise ProxyProtocolError("empty host")
    if port_text is None or port_text == "":
        if default_port is None:
            raise ProxyProtocolError("CONNECT needs host:port, e.g. example.com:443")
        port = default_port
    else:
        if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
            raise ProxyProtocolError(f"bad port {port_text[:16]!r}")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise ProxyProtocolError(f"port {port} out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _check_host_header(headers, host: str, port: int, *, default_port: int) -> None:
    """At most one Host header, and it names the request's own target (a port left out
    means `default_port`); 403 otherwise."""
    hosts = [v for k, v in headers if k == b"host"]
    if len(hosts) > 1:
        raise ProxyProtocolError("more than one Host header")
    if hosts:
        try:
            hh, hp = split_authority(hosts[0].decode("latin-1"), default_port=default_port)
        except ProxyProtocolError:
            raise ProxyProtocolError("host header mismatch", status=403, host=host,
                                     port=port) from None
        if not _same_host(hh, host) or hp != port:
            raise ProxyProtocolError("host header mismatch", status=403, host=host, port=port)


def _same_host(a: str, b: str) -> bool:
    if a == b:                  # the usual case, and the answer either branch would give
        return True
    try:
        return parse_host(a) == parse_host(b)
    except HostError:
        return a.lower() == b.lower()


def _h11_message(e: h11.RemoteProtocolError) -> str:
    msg = str(e).splitlines()[0] if str(e) else "malformed request"
    return "bad request: " + "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in msg)[:200]


# --- what the proxy sends --------------------------------------------------------------

def forward_request(req: HttpRequest, host_header: bytes | None = None, *,
                    keep_alive: bool = False) -> h11.Request:
    """The request to send upstream: origin-form, the client's Host header kept (or built
    from the target), hop-by-hop and Proxy-* headers dropped, Expect dropped (the proxy
    answers 100-continue itself), and ``Connection: close`` (one upstream per request)
    unless `keep_alive`."""
    drop = set(HOP_BY_HOP) | {b"host", b"expect"}
    for k, v in req.headers:
        if k == b"connection":
            drop.update(t.strip().lower() for t in v.split(b",") if t.strip())
    has_te = any(k == b"transfer-encoding" for k, _ in req.headers)
    host = next((v for k, v in req.headers if k == b"host"), None)
    if host is None:
        host = host_header or _build_host(req.host, req.port).encode("ascii")
    headers = [(b"host", host)]
    for k, v in req.headers:
        if k in drop or (has_te and k == b"content-length"):
            continue
        headers.append((k, v))
    if not keep_alive:
        headers.append((b"connection", b"close"))
    return h11.Request(method=req.method, target=req.path, headers=headers)


def inner_request(ev: h11.Request, host: str, port: int) -> HttpRequest:
    """A request read inside a TLS connection the proxy terminated for CONNECT host:port.

    The target becomes origin-form (an absolute ``https://`` target must name host:port);
    the Host header, when present, must name host:port too (403 "host header mismatch"):
    the upstream is pinned to host, and a server that hosts several names must not be asked
    for another one with the credential of this one. Raises ProxyProtocolError."""
    headers = tuple((bytes(k), bytes(v)) for k, v in ev.headers)
    target = bytes(ev.target).decode("latin-1")
    if ev.method == b"CONNECT":
        raise ProxyProtocolError("CONNECT inside a CONNECT tunnel", host=host, port=port)
    if target != "*" and not target.startswith("/"):
        m = _SCHEME.fullmatch(target)
        if m is None or m.group(1).lower() != "https" or "@" in m.group(2):
            raise ProxyProtocolError("bad request target inside the tunnel")
        th, tp = split_authority(m.group(2), default_port=443)
        if not _same_host(th, host) or tp != port:
            raise ProxyProtocolError("host header mismatch", status=403, host=host, port=port)
        rest = m.group(3)
        if "#" in rest:
            raise ProxyProtocolError("a fragment (#) does not belong in a request")
        target = rest if rest.startswith("/") else "/" + rest
    _check_host_header(headers, host, port, default_port=443)
    return HttpRequest(method=bytes(ev.method), host=host, port=port,
                       path=target.encode("latin-1"), headers=headers,
                       http_version=bytes(ev.http_version))


def _build_host(host: str, port: int, default_port: int = 80) -> str:
    try:
        return host_header_text(parse_host(host), port, default_port=default_port)
    except HostError:
        return host if port == default_port else f"{host}:{port}"


def response_headers(headers) -> list[tuple[bytes, bytes]]:
    """Upstream response headers minus hop-by-hop ones (framing headers stay for h11)."""
    drop = set(HOP_BY_HOP)
    for k, v in headers:
        if bytes(k).lower() == b"connection":
            drop.update(t.strip().lower() for t in bytes(v).split(b",") if t.strip())
    drop.discard(b"transfer-encoding")
    drop.discard(b"content-length")
    return [(bytes(k), bytes(v)) for k, v in headers if bytes(k).lower() not in drop]


_STATUS_TEXT = {200: "Connection Established", 400: "Bad Request", 403: "Forbidden",
                408: "Request Timeout",
                431: "Request Header Fields Too Large", 502: "Bad Gateway",
                503: "Service Unavailable", 504: "Gateway Timeout"}


def _header_safe(text: str, limit: int = 400) -> str:
    return "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in text)[:limit]


def error_response(status: int, reason: str, message: str | None = None) -> bytes:
    """A complete response the proxy itself sends (then closes): ``X-Corral-Reason: reason``
    and a one-line text body."""
    reason = _header_safe(reason)
    body = (_header_safe(message or reason, 1000) + "\n").encode("ascii")
    head = (f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}\r\n"
            f"X-Corral-Reason: {reason}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("ascii") + body


def deny_response(reason: str) -> bytes:
    """403 for a target the policy refuses."""
    return error_response(403, reason, f"corral: blocked by the sandbox network policy: {reason}")


CONNECT_OK = b"HTTP/1.1 200 Connection Established\r\n\r\n"

__all__ = [
    "CONNECT_OK",
    "HOP_BY_HOP",
    "NEED_DATA",
    "PAUSED",
    "Closed",
    "ConnectRequest",
    "HttpRequest",
    "ProxyConnection",
    "ProxyProtocolError",
    "RequestData",
    "RequestEnd",
    "deny_response",
    "error_response",
    "forward_request",
    "inner_request",
    "response_headers",
    "split_authority",
]
