"""The host's /etc/hosts, as the egress proxy reads it: names there resolve through it, in
the proxy, before any DNS query (the order glibc's "hosts: files dns" gives every program on
the host, so `localhost` means the host's loopback for the proxy as it does for curl).

The proxy reads the file once when it starts (`load`); the sandbox never supplies it. What a
name resolves to still goes through `check_address`: `localhost` is 127.0.0.1 and ::1, which
need ``allow_private`` like any other loopback address.

Parsed strictly (`parse`): at most MAX_BYTES (a larger file is not used at all); per line,
everything from ``#`` on is a comment; the first field must be an address in standard
notation (`ipaddress.ip_address`: no ``127.1``, no zone ids such as ``fe80::1%eth0``), the
others names that `hosts.parse_host` takes as names (canonical: lower case, no trailing dot);
a line with anything else (a bad address, non-ASCII, a field that is no name) is skipped
whole. A name on several lines gets every address, in file order, IPv4 first (the proxy's DNS
path asks for A before AAAA too).
"""

from __future__ import annotations

from ipaddress import IPv4Address, ip_address

from ..policy.hosts import HostError, IPAddress, canonical_ip, parse_host

PATH = "/etc/hosts"
#: far above any real hosts file, small enough that reading it costs nothing
MAX_BYTES = 1 << 20
#: addresses kept per name, at most
MAX_ADDRESSES = 16

Table = dict[str, tuple[IPAddress, ...]]


def parse(data: bytes) -> Table:
    """name -> addresses (IPv4 first, each once). Raises ValueError past MAX_BYTES."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    found: dict[str, list[IPAddress]] = {}
    for raw in data.split(b"\n"):
        line = raw.split(b"#", 1)[0]
        try:
            text = line.decode("ascii")
        except UnicodeDecodeError:
            continue
        fields = text.split()
        if len(fields) < 2:
            continue
        if "%" in fields[0]:
            continue                     # a zone id: an address only on one interface
        try:
            addr = canonical_ip(ip_address(fields[0]))
            names = [parse_host(f) for f in fields[1:]]
        except (ValueError, HostError):
            continue
        if not all(isinstance(n, str) for n in names):
            continue
        for name in names:
            addrs = found.setdefault(name, [])
            if addr not in addrs and len(addrs) < MAX_ADDRESSES:
                addrs.append(addr)
    return {name: tuple(sorted(addrs, key=lambda a: not isinstance(a, IPv4Address)))
            for name, addrs in found.items()}


def load(path: str = PATH) -> tuple[Table, str | None]:
    """(table, None), or ({}, why) when the file cannot be used: names then go to DNS
    alone, as they would on a host without the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        return parse(data), None
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as e:
        return {}, f"{path} not used: {getattr(e, 'strerror', None) or e}"


__all__ = ["MAX_BYTES", "PATH", "Table", "load", "parse"]
