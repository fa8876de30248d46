"""Credential grants, the proxy's side. Pure: no I/O.

The sandbox holds a random per-run placeholder; the value stays with the proxy. For each
request the proxy can read (plain http://, or HTTPS to a granted host, whose TLS it
terminates with the run CA), `inject()` replaces every placeholder with its grant's value,
in:

- every request header value (Authorization, Cookie, custom headers, ...),
- the user:password inside ``Authorization: Basic <base64>`` (decoded, replaced,
  re-encoded: that is where curl, git and requests put URL userinfo),
- the request target (path and query; the value is percent-encoded there),

but only when the request goes to a host:port one of the grant's rules names, the grant has
not expired, and the request is HTTPS (or the grant says ``plain_http``). Anything else that
carries a placeholder (in a header name or value, a Basic credential, or the target, also
percent-decoded) is refused whole with 403 and a ``kind: "secret"`` event: "exfiltration
attempt" (another host), "grant expired", "plain http not allowed for this grant". The value
is never sent without the grant's conditions, and a refused request never half-happens.

`ResponseScrubber` runs the other way on every response from a granted host: each value,
in every spelling forms.py knows (percent-encoded, JSON/JS- or HTML-escaped, upper- or
lower-cased, hex, base64 and base64url at any alignment), and each encoding of it the proxy
itself produced for that connection (``Injection.echoes``), is replaced by its placeholder
in the response headers and, as a stream, in the body. A body in a coding it cannot read
(anything but identity and one gzip) is cut, never passed.

What this does not do (the limits; see also `ResponseScrubber`):

- A CONNECT tunnel to a host no grant names is never opened: the proxy cannot see inside
  that TLS, so a placeholder sent there is neither replaced nor detected. It is worthless
  there: it means nothing outside this run and the value never goes to that host.
- Request bodies are neither injected nor scanned: a placeholder in a body reaches the
  granted host as the placeholder.
- A granted host that transforms the value in a way forms.py does not know (encryption,
  a hash, reversal, splitting it over several places or responses, two stacked encodings
  such as the base64 of its hex), or that *stores* what it receives (a header it logs, a
  query parameter it keeps) and serves it back later or to a host no grant names, can
  reveal the value. Grant only hosts whose API treats the credential as a credential, and
  prefer headers: a placeholder in the URL puts the value in the URL (and in the server's
  access log).
- Non-TLS tunnels to a granted host (ssh on github.com:22, say) are plain tunnels: nothing
  is injected into them and nothing is scrubbed out of them.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
import secrets as _random
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address
from urllib.parse import quote, unquote_to_bytes

from ..events import SecretEvent
from . import forms
from .config import Grant

Headers = list[tuple[bytes, bytes]]

EXFILTRATION = "exfiltration attempt"
EXPIRED = "grant expired"
PLAIN_HTTP = "plain http not allowed for this grant"
GRANTED = "granted"


def make_placeholder(name: str) -> str:
    """A fresh placeholder for a grant: ``corral_<name>_<32 random hex digits>``; it fits
    the placeholder grammar (config.Grant) and is safe in headers, URLs and Basic auth."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)[:64]
    return f"corral_{clean}_{_random.token_hex(16)}"


def secret_event(name: str, host: str, port: int, decision: str, reason: str) -> dict:
    return SecretEvent(name, host, port, decision, reason).to_dict()


@dataclass(frozen=True, slots=True)
class Injection:
    """What to send instead of the client's request. When ``denied`` is set (an event),
    send nothing upstream: answer 403 with `reason`."""

    headers: Headers
    target: bytes
    used: list[str] = field(default_factory=list)        # names of the grants injected
    denied: dict | None = None
    #: text the proxy produced from a value -> the text the client wrote (a re-encoded Basic
    #: credential, a percent-encoded value); the scrubber maps it back in responses
    echoes: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        """One line for X-Corral-Reason, or None when the request may go."""
        if self.denied is None:
            return None
        return f"secret {self.denied['name']}: {self.denied['reason']}"

    def __repr__(self) -> str:     # the headers hold values
        return (f"Injection(used={self.used!r}, denied={self.denied!r}, "
                f"headers=<{len(self.headers)} hidden>)")


def inject(grants: Sequence[Grant], host, port: int, scheme: str, method: bytes,
           target: bytes, headers: Iterable[tuple[bytes, bytes]], now: float) -> Injection:
    """Replace placeholders in one request head, or refuse it (module docstring).

    ``host`` is canonical (hosts.parse_host, or its str()); ``scheme`` is "https" for a
    request read from a terminated TLS connection, "http" for a plain one; ``now`` is unix
    time."""
    del method                                   # every method is treated alike
    headers = [(bytes(k), bytes(v)) for k, v in headers]
    target = bytes(target)
    if not grants:
        return Injection(headers, target)
    h = _host(host)
    canon = str(h)
    basics = [_basic(v) if k.lower() in (b"authorization", b"proxy-authorization") else None
              for k, v in headers]
    try:
        unquoted = unquote_to_bytes(target)
    except (ValueError, TypeError):
        unquoted = target
    found: list[Grant] = []
    for g in grants:
        ph = g.placeholder.encode("ascii")
        if (ph in target or ph in unquoted
                or any(ph in k or ph in v for k, v in headers)
                or any(b is not None and ph in b for b in basics)):
            found.append(g)
    if not found:
        return Injection(headers, target)
    for g in found:
        reason = _refusal(g, h, port, scheme, now)
        if reason is not None:
            return Injection(headers, target, denied=secret_event(g.name, canon, port, "deny",
                                                                  reason))
    echoes: dict[bytes, bytes] = {}
    used: list[str] = []
    out: Headers = []
    for (k, v), basic in zip(headers, basics, strict=True):
        if basic is not None and any(g.placeholder.encode() in basic for g in found):
            new = basic
            for g in found:
                new = new.replace(g.placeholder.encode(), g.value.encode())
            scheme_word = v.split(None, 1)[0]
            old_b64 = v.split(None, 1)[1].strip()
            new_b64 = base64.b64encode(new)
            echoes[new_b64] = old_b64
            v = scheme_word + b" " + new_b64
        for g in found:
            v = v.replace(g.placeholder.encode(), g.value.encode())
        out.append((k, v))
    for g in found:
        ph = g.placeholder.encode()
        quoted = quote(g.value, safe="").encode("ascii")
        if ph in target:
            target = target.replace(ph, quoted)
            if quoted != g.value.encode():
                echoes[quoted] = ph
        used.append(g.name)
    return Injection(out, target, used=used, echoes=echoes)


def _refusal(g: Grant, host, port: int, scheme: str, now: float) -> str | None:
    if not g.covers(host, port):
        return EXFILTRATION
    if now >= g.expires_at:
        return EXPIRED
    if scheme != "https" and not g.plain_http:
        return PLAIN_HTTP
    return None


def _host(host):
    if not isinstance(host, str):
        return host
    try:
        return ip_address(host.strip("[]"))
    except ValueError:
        return host


def _basic(value: bytes) -> bytes | None:
    """The decoded user:password of ``Basic <b64>``, else None."""
    parts = value.split(None, 1)
    if len(parts) != 2 or parts[0].lower() != b"basic":
        return None
    try:
        return base64.b64decode(parts[1].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def grants_for(grants: Sequence[Grant], host, port: int) -> list[Grant]:
    """The grants that name host:port (whether or not they are still valid)."""
    h = _host(host)
    return [g for g in grants if g.covers(h, port)]


def scrub_map(grants: Sequence[Grant]) -> dict[bytes, bytes]:
    """value -> placeholder for every grant, for `ResponseScrubber` (which derives the other
    spellings of each value itself, see forms.py)."""
    return {g.value.encode("ascii"): g.placeholder.encode("ascii") for g in grants}


_READABLE = {b"gzip", b"x-gzip", b"identity"}


def readable_accept_encoding(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Request headers for a granted host, with Accept-Encoding narrowed to the codings the
    scrubber can read (gzip, identity; a token with ``q=0`` is dropped), and set to
    ``identity`` when the client sent none (without the header a server may pick any
    coding). A response in another coding is cut (`ResponseScrubber.start`)."""
    out: Headers = []
    seen = False
    for k, v in headers:
        if k.lower() != b"accept-encoding":
            out.append((k, v))
            continue
        seen = True
        keep = [t.strip() for t in v.split(b",")
                if t.split(b";", 1)[0].strip().lower() in _READABLE and not _q_zero(t)]
        out.append((k, b", ".join(keep) if keep else b"identity"))
    if not seen:
        out.append((b"accept-encoding", b"identity"))
    return out


def _q_zero(token: bytes) -> bool:
    for param in token.split(b";")[1:]:
        name, _, val = param.partition(b"=")
        if name.strip().lower() == b"q":
            try:
                return float(val.strip()) == 0
            except ValueError:
                return True                     # unreadable weight: not asked for
    return False


class ScrubError(ValueError):
    """The response body cannot be scrubbed (an encoding the scrubber cannot read, a bad
    gzip stream): the proxy cuts the response. The message is safe for an event: it never
    holds response text."""


#: decoded output per step, so a gzip bomb never sits in memory whole
_PIECE = 256 * 1024

#: Content-Encoding names that may appear in a ScrubError's message (anything else is
#: "unknown": the header came from upstream and could carry any text)
_KNOWN_CODINGS = frozenset({b"gzip", b"x-gzip", b"deflate", b"br", b"zstd", b"compress",
                            b"x-compress", b"identity", b"exi", b"pack200-gzip", b"aes128gcm",
                            b"dcb", b"dcz"})


class ResponseScrubber:
    """Replaces secret values, in every spelling forms.py knows, with their placeholders in
    one response.

        s = ResponseScrubber({b"value": b"placeholder"}, echoes)
        headers = s.start(headers, has_body=True)     # what to send as the response head
        for piece in s.feed(data): send(piece)        # each body chunk, as it arrives
        send(s.end())                                 # what was held back

    `values` maps each secret value to its placeholder: the value is recognised as is, and
    percent-encoded, JSON/JS-escaped, HTML-escaped, upper- or lower-cased, in hex and in
    base64 / base64url at any alignment (forms.py). `echoes` maps text the proxy itself
    produced from a value (a re-encoded Basic credential) to what the client wrote; those
    are matched byte for byte, before the values.

    Header values are always scrubbed. The body is scrubbed when its Content-Encoding is
    absent or identity (streamed as is), or gzip/x-gzip (decoded, scrubbed, and sent on as
    identity: Content-Encoding is dropped). Any other coding (deflate, br, zstd, a chain such
    as ``gzip, gzip``, a name it does not know) makes `start` raise ScrubError: the proxy
    cuts the response rather than pass a body it cannot read. It asks granted hosts for
    gzip or identity only (`readable_accept_encoding`), so that takes a server that
    ignores Accept-Encoding.

    Whenever the body may change length, Content-Length is dropped (the proxy then frames the
    body with chunked encoding, or by closing, for HTTP/1.0 clients). A spelling split
    across reads is still caught: the longest match any pattern can make, minus one byte,
    is held back until more data or the end arrives.
    """

    def __init__(self, values: Mapping[bytes | str, bytes | str],
                 echoes: Mapping[bytes | str, bytes | str] | None = None) -> None:
        self._stages = [s for s in (_exact_stage(_pairs(echoes or {})),
                                    _value_stage(tuple(sorted(_pairs(values).items()))))
                        if s is not None]
        self._gz = None            # the zlib decompressor of the current gzip member
        self.mode = "identity"     # "identity" | "gzip" | "none" (no body)

    def scrub(self, data: bytes) -> bytes:
        """One complete piece of text (a header value)."""
        for st in self._stages:
            data = st.sub(bytes(data))
        return data

    def start(self, headers: Iterable[tuple[bytes, bytes]], *, has_body: bool) -> Headers:
        """The response head to send: values scrubbed; framing fixed for the body mode.
        Raises ScrubError for a body in a coding the scrubber cannot read."""
        headers = [(bytes(k), bytes(v)) for k, v in headers]
        hs = [(k, self.scrub(v)) for k, v in headers]
        for st in self._stages:
            st.reset()
        self._gz = None
        if not has_body:
            self.mode = "none"
            return hs
        raw = [c.strip().lower() for k, v in headers if k.lower() == b"content-encoding"
               for c in v.split(b",")]
        codings = [c for c in raw if c and c != b"identity"]
        if not codings:
            self.mode = "identity"
        elif codings in ([b"gzip"], [b"x-gzip"]):
            self.mode = "gzip"
        else:
            names = ", ".join(c.decode("ascii") if c in _KNOWN_CODINGS else "unknown"
                              for c in codings[:4])
            raise ScrubError(f"response not scrubbable: content-encoding {names}")
        if not self._stages and self.mode == "identity":
            return hs
        drop = {b"content-length"}
        if self.mode == "gzip":
            drop.add(b"content-encoding")
        return [(k, v) for k, v in hs if k.lower() not in drop]

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Body bytes as they arrive -> the scrubbed bytes that may be sent now."""
        if self.mode == "none":
            if data:
                yield data
            return
        if self.mode == "gzip":
            for piece in self._inflate(data):
                out = self._scan(piece, final=False)
                if out:
                    yield out
            return
        out = self._scan(data, final=False)
        if out:
            yield out

    def end(self) -> bytes:
        """The end of the body: what was held back. Raises ScrubError for a gzip stream that
        stopped inside a member."""
        if self.mode == "none":
            return b""
        if self.mode == "gzip" and self._gz is not None and not self._gz.eof:
            raise ScrubError("gzip body ended early")
        return self._scan(b"", final=True)

    def _inflate(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._gz is None or self._gz.eof:
                if not b"\x1f\x8b".startswith(data[:2]):
                    return                       # padding after the last member: dropped
                self._gz = zlib.decompressobj(16 + zlib.MAX_WBITS)
            gz = self._gz
            try:
                out = gz.decompress(data, _PIECE)
                while True:
                    if out:
                        yield out
                    if not gz.unconsumed_tail:
                        break
                    out = gz.decompress(gz.unconsumed_tail, _PIECE)
            except zlib.error:
                raise ScrubError("bad gzip body from upstream") from None
            data = gz.unused_data if gz.eof else b""

    def _scan(self, data: bytes, *, final: bool) -> bytes:
        for st in self._stages:
            data = st.scan(data, final=final)
        return data

    def __repr__(self) -> str:                   # the stages hold values
        return f"ResponseScrubber(mode={self.mode!r}, {len(self._stages)} stages)"


def _pairs(m: Mapping[bytes | str, bytes | str]) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for k, v in m.items():
        kb = k.encode() if isinstance(k, str) else bytes(k)
        vb = v.encode() if isinstance(v, str) else bytes(v)
        if kb:
            out[kb] = vb
    return out


class _Compiled:
    """Patterns compiled into one regex (an alternation, one group per pattern, in
    priority order), with a prefilter regex of the two-character prefixes any match begins
    with: the prefilter skips ahead in C, and only where it hits is the full regex tried.
    A pattern with a `lead` (a base64 edge class, which would make the prefilter hit at
    every fourth byte of base64 text) is found by the prefix after its first character:
    where the prefilter hits at j, the full regex is tried at j - 1 first, then at j."""

    def __init__(self, pats: list[forms.Pattern]) -> None:
        self.pats = pats
        self.full = re.compile(b"|".join(b"(" + p.regex() + b")" for p in pats))
        starts: dict[int, set[bytes]] = {}
        for p in pats:
            for pre in p.prefixes():
                starts.setdefault(pre[0], set()).add(pre[1:])
        alts = []
        for c, rests in sorted(starts.items()):
            head = re.escape(bytes([c]))
            if b"" in rests:
                alts.append(head)
            else:
                alts.append(head + b"[" + b"".join(forms._class_char(r[0])
                                                   for r in sorted(rests)) + b"]")
        self.prefilter = re.compile(b"|".join(alts))
        self.hold = max(p.max_len for p in pats) - 1
        self.lead = any(p.lead for p in pats)

    def sub(self, buf: bytes, cut: int) -> tuple[list[bytes], int]:
        """Replace every match that starts before `cut`: (the pieces up to the end of the
        last one, or to `cut`, and where the pieces end)."""
        out: list[bytes] = []
        pos = i = 0          # i: the first position not yet tried
        search, match, lead = self.prefilter.search, self.full.match, self.lead
        while True:
            q = search(buf, i)
            if q is None:
                break
            j = q.start()
            m = None
            # j - 1 >= i: a position the prefilter skipped, where only a lead pattern
            # can start (any other would have hit the prefilter there)
            for k in ((j - 1, j) if lead and j - 1 >= i else (j,)):
                if k >= cut:
                    break
                m = match(buf, k)
                if m is not None:
                    break
            if m is None:
                if j >= cut:
                    break
                i = j + 1
                continue
            out.append(buf[pos:m.start()])
            out.append(self.pats[m.lastindex - 1].replace(m.group()))
            pos = i = m.end()
        end = max(cut, pos)
        out.append(buf[pos:end])
        return out, end

    def __repr__(self) -> str:
        return f"_Compiled({len(self.pats)} patterns)"


class _Stage:
    """One streaming pass of a `_Compiled` over the body: what it holds back between
    reads."""

    def __init__(self, comp: _Compiled) -> None:
        self.comp = comp
        self.pending = b""

    def reset(self) -> None:
        self.pending = b""

    def sub(self, data: bytes) -> bytes:
        out, _ = self.comp.sub(data, len(data))
        return b"".join(out)

    def scan(self, data: bytes, *, final: bool) -> bytes:
        buf = self.pending + data if self.pending else data
        cut = len(buf) if final else max(0, len(buf) - self.comp.hold)
        out, end = self.comp.sub(buf, cut)
        self.pending = buf[end:]
        return b"".join(out)


def _exact_stage(echoes: dict[bytes, bytes]) -> _Stage | None:
    if not echoes:
        return None
    pats = [forms.exact(k, echoes[k]) for k in sorted(echoes, key=len, reverse=True)]
    return _Stage(_Compiled(pats))


@functools.lru_cache(maxsize=8)
def _value_patterns(pairs: tuple[tuple[bytes, bytes], ...]) -> _Compiled | None:
    """Compiled once per set of grants (the proxy's values do not change; a long value
    takes a while to compile)."""
    pats: list[forms.Pattern] = []
    for value, placeholder in sorted(pairs, key=lambda kv: len(kv[0]), reverse=True):
        pats += forms.patterns(value, placeholder)        # longest value first
    return _Compiled(pats) if pats else None


def _value_stage(pairs: tuple[tuple[bytes, bytes], ...]) -> _Stage | None:
    comp = _value_patterns(pairs)
    return None if comp is None else _Stage(comp)


__all__ = [
    "EXFILTRATION",
    "EXPIRED",
    "GRANTED",
    "PLAIN_HTTP",
    "Injection",
    "ResponseScrubber",
    "ScrubError",
    "grants_for",
    "inject",
    "make_placeholder",
    "readable_accept_encoding",
    "scrub_map",
    "secret_event",
]
