"""Read the server name (SNI) out of a TLS ClientHello. Pure: no I/O.

`parse_client_hello(data)` takes the bytes a client sent so far (they may stop anywhere, and
the ClientHello may be split over several TLS records) and returns `NEED_MORE`, or a
`ClientHello`, or raises `TLSError` for anything malformed. Only the structure needed to
reach the server_name extension is checked, but every length is checked against its
container, duplicates of an extension or of a host_name entry are refused, and the
handshake message is capped at MAX_HELLO bytes.

What this cannot see: with Encrypted ClientHello (``ech`` is True) the real server name is
inside the encrypted part, and the HTTP Host header inside the tunnel is encrypted too, so a
front that serves many names (a CDN) can still be asked for another of its names. SNI
checking stops naive domain fronting, not a CDN that cooperates.
"""

from __future__ import annotations

from dataclasses import dataclass

#: largest ClientHello handshake message accepted (post-quantum key shares are ~1.5 KiB)
MAX_HELLO = 64 * 1024

_HANDSHAKE = 22
_CLIENT_HELLO = 1
_EXT_SERVER_NAME = 0
_EXT_ECH = 0xFE0D


class TLSError(ValueError):
    """The bytes are not a well-formed TLS ClientHello."""


class _NeedMore:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_MORE"


NEED_MORE = _NeedMore()


@dataclass(frozen=True, slots=True)
class ClientHello:
    sni: str | None          # the host_name as sent (ASCII), None when absent
    ech: bool                # an encrypted_client_hello extension is present
    length: int              # bytes of the records that carried the ClientHello


def looks_like_tls(data: bytes) -> bool:
    """True when the first bytes could open a TLS handshake record (0x16 0x03 ...)."""
    return len(data) >= 1 and data[0] == _HANDSHAKE and (len(data) < 2 or data[1] == 3)


def parse_client_hello(data: bytes) -> ClientHello | _NeedMore:
    body = bytearray()
    pos = 0
    need: int | None = None          # total handshake message length, once known
    while need is None or len(body) < need:
        if len(data) - pos < 5:
            return NEED_MORE
        rtype, major = data[pos], data[pos + 1]
        rlen = int.from_bytes(data[pos + 3:pos + 5], "big")
        if rtype != _HANDSHAKE:
            raise TLSError("not a TLS handshake record")
        if major != 3:
            raise TLSError("unknown TLS record version")
        if rlen == 0 or rlen > (1 << 14):
            raise TLSError("bad TLS record length")
        if len(data) - pos - 5 < rlen:
            return NEED_MORE
        body += data[pos + 5:pos + 5 + rlen]
        pos += 5 + rlen
        if need is None and len(body) >= 4:
            if body[0] != _CLIENT_HELLO:
                raise TLSError("first handshake message is not a ClientHello")
            need = 4 + int.from_bytes(body[1:4], "big")
            if need > MAX_HELLO:
                raise TLSError("ClientHello too large")
    if len(body) != need:
        raise TLSError("data after the ClientHello in its records")
    sni, ech = _parse_hello_body(bytes(body[4:need]))
    return ClientHello(sni=sni, ech=ech, length=pos)


class _Reader:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int = 0, end: int | None = None) -> None:
        self.buf, self.pos = buf, pos
        self.end = len(buf) if end is None else end

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise TLSError("truncated ClientHello")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def int(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vec(self, len_bytes: int) -> _Reader:
        n = self.int(len_bytes)
        start = self.pos
        self.take(n)
        return _Reader(self.buf, start, start + n)

    def done(self) -> bool:
        return self.pos == self.end


def _parse_hello_body(body: bytes) -> tuple[str | None, bool]:
    r = _Reader(body)
    if r.int(1) != 3:
        raise TLSError("bad ClientHello version")
    r.take(1)
    r.take(32)                                   # random
    sid = r.vec(1)
    if sid.end - sid.pos > 32:
        raise TLSError("session id too long")
    suites = r.vec(2)
    n = suites.end - suites.pos
    if n < 2 or n % 2:
        raise TLSError("bad cipher suite list")
    comp = r.vec(1)
    if comp.end == comp.pos:
        raise TLSError("empty compression list")
    if r.done():
        return None, False                       # no extensions at all (old clients)
    exts = r.vec(2)
    if not r.done():
        raise TLSError("data after the extensions")
    seen: set[int] = set()
    sni: str | None = None
    ech = False
    while not exts.done():
        etype = exts.int(2)
        edata = exts.vec(2)
        if etype in seen:
            raise TLSError(f"duplicate extension {etype}")
        seen.add(etype)
        if etype == _EXT_SERVER_NAME:
            sni = _parse_server_name(edata)
        elif etype == _EXT_ECH:
            ech = True
    return sni, ech


def _parse_server_name(r: _Reader) -> str:
    names = r.vec(2)
    if not r.done():
        raise TLSError("data after the server name list")
    if names.done():
        raise TLSError("empty server name list")
    host: str | None = None
    while not names.done():
        ntype = names.int(1)
        name = names.vec(2)
        raw = name.take(name.end - name.pos)
        if ntype != 0:
            continue                             # unknown name types are skipped (RFC 6066)
        if host is not None:
            raise TLSError("more than one host_name in SNI")
        if not raw or not all(0x21 <= b < 0x7F for b in raw):
            raise TLSError("SNI host_name is not printable ASCII")
        host = raw.decode("ascii")
    if host is None:
        raise TLSError("no host_name in SNI")
    return host


__all__ = [
    "MAX_HELLO",
    "NEED_MORE",
    "ClientHello",
    "TLSError",
    "looks_like_tls",
    "parse_client_hello",
]
