"""The sync SDK's hottest call, a foreground command's Result (`sb.commands.run(cmd)`
with no output callbacks: POST /sandboxes/{id}/exec, one JSON answer), on a kept-alive
`http.client` connection instead of httpx.

httpx spends about 0.8 ms of CPU a request on a loopback service (URL merging and
parsing, header validation, h11's state machine, the Response object): as much as the
service's own parsing of it. This path sends the same request (the token, a JSON body as
httpx encodes it) and keeps httpx's faces: a 4xx/5xx raises the same exception classes
(`_raise_error`), a transport failure raises httpx's own (ConnectError, ConnectTimeout,
WriteTimeout, ReadTimeout, ReadError, RemoteProtocolError: all httpx.TransportError), the
timeouts are the caller's (connect 30 s; each read and write the command's timeout + 60
s, or none). A connection the call did not finish with (an error, an interrupt: the
KeyboardInterrupt of a caller giving up) is closed, never reused: the service sees the
client go and kills the command, as with httpx. Nothing is retried (a POST that may have
run is never sent twice).

It applies only where httpx would have sent the request straight to the service: a
Sandbox on the shared pool (client._common.sync_client: httpx takes no proxy from the
environment for a client given its own transport, so neither does this path), plain http
or https (the process's TLS context, hostname checked), and no proxy mounted on the
client. Anything else goes through httpx as before.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import select
import socket
import threading
from typing import NoReturn
from urllib.parse import quote

import httpx

#: idle connections kept per service (a thread takes one for its call, then gives it back)
KEEP = 20
CONNECT_TIMEOUT_S = 30.0

_mu = threading.Lock()
_idle: dict[tuple, list[http.client.HTTPConnection]] = {}


class Route:
    """Where a Sandbox's exec goes on this path: the service's address, the path prefix
    of its URL, its Authorization header."""

    __slots__ = ("key", "scheme", "host", "port", "prefix", "auth")

    def __init__(self, scheme: str, host: str, port: int, prefix: str, auth: str) -> None:
        self.scheme, self.host, self.port, self.prefix, self.auth = (scheme, host, port,
                                                                     prefix, auth)
        self.key = (scheme, host, port)


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
    port = url.port or (443 if url.scheme == "https" else 80)
    return Route(url.scheme, url.host, port, url.raw_path.decode("ascii").rstrip("/"), auth)


def post_exec(route: Route, sid: str, body: dict, timeout: float | None) -> tuple[int, dict,
                                                                                    bytes]:
    """POST {prefix}/sandboxes/{sid}/exec with `body`: (status, headers (lower-case
    names), raw body). `timeout`: each read and write's, None for none."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode()
    headers = {"Authorization": route.auth, "Content-Type": "application/json",
               "Accept": "application/json", "Content-Length": str(len(data))}
    path = f"{route.prefix}/sandboxes/{quote(sid, safe='')}/exec"
    conn = _take(route)
    done = False
    try:
        conn.sock.settimeout(timeout)
        wrote = None
        try:
            conn.request("POST", path, data, headers)
        except socket.timeout as e:
            raise httpx.WriteTimeout(str(e) or "timed out writing the request") from e
        except (OSError, http.client.HTTPException) as e:
            # as httpx: the service may have answered before it read the whole body (a
            # 413 for a body over its cap) and closed; that answer is read if it is there
            wrote = e
        try:
            r = conn.getresponse()
            raw = r.read()
        except (socket.timeout, OSError, http.client.HTTPException) as e:
            if wrote is not None:
                raise httpx.WriteError(str(wrote) or type(wrote).__name__) from wrote
            if isinstance(e, socket.timeout):
                raise httpx.ReadTimeout(str(e) or "timed out reading the response") from e
            _read_error(e)
        out = {k.lower(): v for k, v in r.getheaders()}
        done = wrote is None and not r.will_close
        return r.status, out, raw
    finally:
        if done:
            _give(route, conn)
        else:
            conn.close()


def _read_error(e: BaseException) -> NoReturn:
    """httpx's exception for a failure reading the answer."""
    if isinstance(e, http.client.HTTPException):   # RemoteDisconnected, IncompleteRead...
        raise httpx.RemoteProtocolError(str(e) or "the server disconnected without a "
                                        "whole response") from e
    raise httpx.ReadError(str(e) or type(e).__name__) from e


def _take(route: Route) -> http.client.HTTPConnection:
    """An idle connection to the service that it has not closed, or a new one."""
    key = (os.getpid(), *route.key)     # a forked child never writes on its parent's
    while True:
        with _mu:
            conns = _idle.get(key)
            conn = conns.pop() if conns else None
        if conn is None:
            return _connect(route)
        try:     # readable while idle: the service closed it (its keep-alive timeout)
            stale = bool(select.select([conn.sock], [], [], 0)[0])
        except (OSError, ValueError):
            stale = True
        if not stale:
            return conn
        conn.close()


def _give(route: Route, conn: http.client.HTTPConnection) -> None:
    key = (os.getpid(), *route.key)
    with _mu:
        if not _idle:
            atexit.register(_close_idle)
        conns = _idle.setdefault(key, [])
        if len(conns) < KEEP:
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


def _connect(route: Route) -> http.client.HTTPConnection:
    if route.scheme == "https":
        from ._common import tls_context

        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            route.host, route.port, timeout=CONNECT_TIMEOUT_S, context=tls_context())
    else:
        conn = http.client.HTTPConnection(route.host, route.port,
                                          timeout=CONNECT_TIMEOUT_S)
    try:
        conn.connect()
        # headers and body go in one send (http.client joins a small body to them);
        # no Nagle wait for whatever follows
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except socket.timeout as e:
        conn.close()
        raise httpx.ConnectTimeout(str(e) or "timed out connecting") from e
    except OSError as e:      # refused, unreachable, a TLS failure (ssl.SSLError)
        conn.close()
        raise httpx.ConnectError(str(e) or type(e).__name__) from e
    return conn
