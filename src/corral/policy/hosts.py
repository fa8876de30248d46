"""Host names and IP addresses as the egress proxy sees them. Pure: no I/O.

`parse_host(text)` turns whatever a client wrote (a CONNECT authority's host, the host of an
absolute URL, a Host header's host, a TLS SNI, a policy rule) into one canonical form:

- an IP literal, in **every** spelling that some parser would take for an address, becomes an
  `ipaddress` object: the forms glibc's ``inet_aton`` accepts (``2130706433``,
  ``0177.0.0.1``, ``0x7f.1``, ``127.1``), plus a trailing dot and ``0x`` alone (the WHATWG URL
  parser's forms); IPv6 with or without brackets; IPv4-mapped IPv6 (``::ffff:127.0.0.1``,
  ``::ffff:7f00:1``) becomes the IPv4 address, because that is where a dual-stack socket
  connects. IPv6 zone ids (``fe80::1%eth0``) are refused.
- a name becomes lower case ASCII without the trailing dot; non-ASCII labels become A-labels
  (``bücher.de`` -> ``xn--bcher-kva.de``) via the stdlib IDNA codec (nameprep + punycode);
  the IDNA 2003/2008 "deviation" characters (ß, ς, ZWJ, ZWNJ), on which the two standards
  disagree, are refused rather than guessed.

Refused (``HostError``): empty names or labels, labels over 63 bytes, names over 253 bytes,
any character outside letters, digits, ``-`` and ``_`` (so ``@``, userinfo, ``%``, ``/``,
``\\``, ``:``, whitespace and control characters never reach a rule), labels that begin or
end with ``-``, ``xn--`` labels that are not valid punycode, and names whose last label is
numeric (``1.2.3.4.5``, ``999.1.1.1``) since URL parsers treat those as broken addresses.
``_`` is accepted: it never separates anything, and real names (some CDN hosts) carry it.

`classify_ip(addr)` says why an address must not be reached without an explicit
``allow_private`` entry, or ``"public"``.
"""

from __future__ import annotations

import encodings.idna as _idna
import re
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IPAddress = IPv4Address | IPv6Address
Host = str | IPv4Address | IPv6Address

#: names that reach cloud metadata services; refused whatever the rules say
METADATA_NAMES = frozenset({
    "metadata.google.internal",
    "metadata.goog",
    "metadata",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.azure.internal",
    "metadata.tencentyun.com",
    "metadata.platformequinix.com",
})

_DOTS = re.compile("[.\u3002\uff0e\uff61]")
# always used with fullmatch: "$" would also match before a final "\n"
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")
_DEVIATIONS = frozenset("\u00df\u03c2\u200c\u200d")


class HostError(ValueError):
    """The text is neither a usable host name nor an IP literal. The message says why."""


def parse_host(text: str) -> Host:
    """The canonical host: an `ipaddress` object for any IP literal, else a lower-case ASCII
    name. Raises HostError."""
    if not isinstance(text, str):
        raise HostError("host must be text")
    if not text:
        raise HostError("empty host")
    if len(text) > 1024:
        raise HostError("host too long")
    if text.startswith("["):
        if not text.endswith("]"):
            raise HostError("unbalanced [ in host")
        return _parse_ipv6(text[1:-1])
    if ":" in text:
        return _parse_ipv6(text)
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
        if not text:
            raise HostError("empty host")
    v4 = parse_ipv4(text)
    if v4 is not None:
        return v4
    return _canonical_name(text)


def host_text(host: Host) -> str:
    """Standard notation for events and rules: names as they are, IPv6 without brackets."""
    return str(host)


def host_header_text(host: Host, port: int, default_port: int = 80) -> str:
    """The value of a Host header for this target (IPv6 in brackets, port when not default)."""
    h = f"[{host}]" if isinstance(host, IPv6Address) else str(host)
    return h if port == default_port else f"{h}:{port}"


def parse_ipv4(text: str) -> IPv4Address | None:
    """An IPv4 address in any inet_aton spelling (1 to 4 parts, each decimal, 0-octal or
    0x-hex, the last part filling the remaining bytes), else None. Raises HostError for a
    text that looks like an address but is not one (``1.2.3.256``, ``08.1.1.1``)."""
    parts = text.split(".")
    if not parts or not all(parts):
        # an empty part: not an address; a name check refuses it later
        if parts and parts[-1] and _NUMERIC_LABEL.fullmatch(parts[-1]):
            raise HostError(f"{text!r} is neither a name nor an IPv4 address")
        return None
    if not _NUMERIC_LABEL.fullmatch(parts[-1]):
        return None
    if len(parts) > 4:
        raise HostError(f"{text!r} is neither a name nor an IPv4 address")
    values = []
    for p in parts:
        v = _ipv4_part(p)
        if v is None:
            raise HostError(f"{text!r} is neither a name nor an IPv4 address")
        values.append(v)
    last = values.pop()
    if any(v > 255 for v in values) or last >= 1 << (8 * (4 - len(values))):
        raise HostError(f"{text!r} is out of range for an IPv4 address")
    n = last
    for i, v in enumerate(values):
        n |= v << (8 * (3 - i))
    return IPv4Address(n)


def _ipv4_part(p: str) -> int | None:
    if p[:2] in ("0x", "0X"):
        digits = p[2:]
        if digits and not all(c in "0123456789abcdefABCDEF" for c in digits):
            return None
        return int(digits, 16) if digits else 0
    if not p.isascii() or not p.isdigit():
        return None
    if len(p) > 1 and p[0] == "0":
        if any(c in "89" for c in p):
            return None
        return int(p, 8)
    return int(p, 10)


def _parse_ipv6(text: str) -> IPAddress:
    if "%" in text:
        raise HostError("IPv6 zone ids are not allowed")
    if not text or not all(c in "0123456789abcdefABCDEF:." for c in text):
        raise HostError(f"{text!r} is not an IPv6 address")
    try:
        addr = IPv6Address(text)
    except ValueError:
        raise HostError(f"{text!r} is not an IPv6 address") from None
    return canonical_ip(addr)


def canonical_ip(addr: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 becomes the IPv4 address; everything else is returned as is."""
    if isinstance(addr, IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _canonical_name(text: str) -> str:
    if not text.isascii():
        if any(c in _DEVIATIONS for c in text):
            raise HostError("host has a character IDNA 2003 and 2008 disagree on (ß, ς, ZWJ, ZWNJ)")
        labels = []
        for label in _DOTS.split(text):
            if not label:
                raise HostError("empty label in host")
            if label.isascii():
                labels.append(label)
                continue
            try:
                labels.append(_idna.ToASCII(label).decode("ascii"))
            except (UnicodeError, ValueError):
                raise HostError("host is not a valid internationalised name") from None
        text = ".".join(labels)
    name = text.lower()
    if len(name) > 253:
        raise HostError("host longer than 253 characters")
    labels = name.split(".")
    for label in labels:
        if not label:
            raise HostError("empty label in host")
        if not _LABEL.fullmatch(label):
            if len(label) > 63:
                raise HostError("label longer than 63 characters")
            bad = next((c for c in label if not (c.isascii() and (c.isalnum() or c in "-_"))),
                       None)
            if bad is not None:
                raise HostError(f"host has {_show(bad)}; only letters, digits, '-' and '_' "
                                "are allowed")
            raise HostError(f"label {label[:63]!r} begins or ends with '-'")
        if label.startswith("xn--"):
            try:
                round_trip = _idna.ToASCII(_idna.ToUnicode(label)).decode("ascii").lower()
            except (UnicodeError, ValueError):
                raise HostError("host has an invalid punycode label") from None
            if round_trip != label:
                raise HostError("host has a non-canonical punycode label")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise HostError("host ends in a number but is not an IPv4 address")
    return name


def _show(c: str) -> str:
    return repr(c) if c.isprintable() and not c.isspace() else f"U+{ord(c):04X}"


# --- address classification --------------------------------------------------------------

_V4_TABLE: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(net), reason) for net, reason in (
        ("169.254.169.254/32", "metadata"),      # AWS, GCP, Azure, OpenStack, ...
        ("169.254.170.2/32", "metadata"),        # ECS task credentials
        ("100.100.100.200/32", "metadata"),      # Alibaba Cloud
        ("168.63.129.16/32", "metadata"),        # Azure wireserver
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "cgnat"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),            # IETF protocol assignments
        ("192.0.2.0/24", "reserved"),            # documentation
        ("192.88.99.0/24", "reserved"),          # 6to4 relay anycast
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "reserved"),           # benchmarking
        ("198.51.100.0/24", "reserved"),         # documentation
        ("203.0.113.0/24", "reserved"),          # documentation
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
    ))

_V6_TABLE: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(net), reason) for net, reason in (
        ("fd00:ec2::254/128", "metadata"),       # AWS IMDS over IPv6
        ("fd00:ec2::23/128", "metadata"),        # AWS time sync / DNS
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "private"),           # local-use NAT64
        ("100::/64", "reserved"),                # discard-only
        ("2001::/32", "reserved"),               # Teredo: the client address is obfuscated
        ("2001:2::/48", "reserved"),             # benchmarking
        ("2001:10::/28", "reserved"),            # ORCHID
        ("2001:20::/28", "reserved"),            # ORCHIDv2
        ("2001:db8::/32", "reserved"),           # documentation
        ("3fff::/20", "reserved"),               # documentation
        ("fc00::/7", "private"),                 # unique local
        ("fe80::/10", "link-local"),
        ("fec0::/10", "private"),                # site-local (deprecated)
        ("ff00::/8", "multicast"),
    ))

_GLOBAL_V6 = IPv6Network("2000::/3")
_NAT64 = IPv6Network("64:ff9b::/96")
_V4_COMPAT = IPv6Network("::/96")


def embedded_ipv4(addr: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries and reaches: IPv4-mapped, IPv4-compatible,
    NAT64 (64:ff9b::/96) and 6to4 (2002::/16). None when it carries none."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in _NAT64 or (addr in _V4_COMPAT and int(addr) > 1):
        return IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.sixtofour is not None:
        return addr.sixtofour
    return None


def classify_ip(addr: IPAddress) -> str:
    """"public", or why the address is refused: "metadata", "loopback", "private", "cgnat",
    "link-local", "multicast", "unspecified", "broadcast" or "reserved". IPv6 forms that
    carry an IPv4 address (mapped, compatible, NAT64, 6to4) are classified by it. IPv6
    outside 2000::/3 is "reserved": only global unicast is public."""
    if isinstance(addr, IPv4Address):
        for net, reason in _V4_TABLE:
            if addr in net:
                return reason
        return "public"
    for net, reason in _V6_TABLE[:4]:
        if addr in net:
            return reason
    v4 = embedded_ipv4(addr)
    if v4 is not None:
        return classify_ip(v4)
    for net, reason in _V6_TABLE[4:]:
        if addr in net:
            return reason
    if addr not in _GLOBAL_V6:
        return "reserved"
    return "public"


def is_metadata_name(name: str) -> bool:
    """True for the names of cloud metadata services (canonical names only)."""
    return name in METADATA_NAMES


__all__ = [
    "METADATA_NAMES",
    "Host",
    "HostError",
    "IPAddress",
    "canonical_ip",
    "classify_ip",
    "embedded_ipv4",
    "host_header_text",
    "host_text",
    "is_metadata_name",
    "parse_host",
    "parse_ipv4",
]
