"""The rule grammar of network.allow, network.deny, allow_private and nameservers. Pure.

Rule grammar (``network.allow`` and ``network.deny``)::

    pypi.org                 exactly this name                   ports 80 and 443
    *.pythonhosted.org       any name *below* pythonhosted.org   ports 80 and 443
    github.com:22            exactly this name                   port 22 only
    127.0.0.9:8080           this address (any spelling)         port 8080 only
    10.1.0.0/16              these addresses                     ports 80 and 443
    [::1]:8443, ::1, [fd00::/8]:443                              IPv6, brackets when a port follows

``*.suffix`` matches label by label and never the apex: ``*.example.com`` matches
``a.example.com`` and ``a.b.example.com`` but not ``example.com`` nor ``badexample.com``
(httpx's ``URLPattern`` reads ``*.example.com`` the same way). Write both rules to allow both.
Names are compared in canonical form (hosts.parse_host: lower case, no trailing dot, A-labels).

A rule without a port means ports 80 and 443 in ``allow``, and **every** port in ``deny``
(so ``deny = ["uploads.github.com"]`` also closes ``uploads.github.com:22``).

Address rules only let an IP literal past the name check; the address guard still applies:
an address that is loopback, private, link-local, metadata, ... must also be covered by
``allow_private``.

`admits(allow, deny, name, port)` is the decision for a name, made here once: the
egress proxy's decide_target and the policy's own checks both call it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Literal

from ..errors import PolicyError
from .hosts import HostError, parse_host

IPNetwork = IPv4Network | IPv6Network


#: ports an allow rule without ":port" covers
DEFAULT_PORTS: tuple[int, ...] = (80, 443)


_PORT = re.compile(r"[0-9]{1,5}")          # fullmatch: "$" matches before a final "\n"


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of network.allow or network.deny.

    kind "host": ``name`` matches exactly; "suffix": ``name`` is the part after "*." and
    matches strictly below it; "net": ``net`` holds the addresses. ``ports`` is None when the
    rule named no port (see DEFAULT_PORTS and the module docstring)."""

    text: str                        # as written, for messages and to_json
    kind: Literal["host", "suffix", "net"]
    name: str = ""
    net: IPNetwork | None = None
    ports: tuple[int, ...] | None = None

    def covers_port(self, port: int, *, deny: bool) -> bool:
        if self.ports is None:
            return deny or port in DEFAULT_PORTS
        return port in self.ports

    def matches_name(self, name: str) -> bool:
        if self.kind == "host":
            return name == self.name
        if self.kind == "suffix":
            labels, suffix = name.split("."), self.name.split(".")
            return len(labels) > len(suffix) and labels[-len(suffix):] == suffix
        return False

    def matches_ip(self, addr: IPv4Address | IPv6Address) -> bool:
        return self.kind == "net" and self.net is not None and addr in self.net


def parse_rule(text: object, field: str) -> Rule:
    """One allow/deny rule (grammar in the module docstring). Raises PolicyError with the fix."""
    if not isinstance(text, str):
        raise PolicyError(f"expected a string such as \"example.com\" or \"*.example.com:443\", "
                          f"got {type(text).__name__}", field=field)
    raw = text
    text = text.strip()
    if not text:
        raise PolicyError("empty rule; write a host such as \"example.com\"", field=field)
    if "://" in text:
        rest = text.split("://", 1)[1]
        host = re.split(r"[/?#]", rest, maxsplit=1)[0]
        host = host.rsplit("@", 1)[-1]
        raise PolicyError(f"\"{raw}\" is a URL, not host[:port]; write \"{host}\"", field=field)
    if any(c.isspace() for c in text):
        raise PolicyError(f"\"{raw}\" contains whitespace; write one host[:port] per entry",
                          field=field)

    host, port_text = _split_port(text)
    if port_text is not None and not _valid_port(port_text):
        raise PolicyError(f"\"{raw}\" is not host[:port]; write \"{host}:443\"", field=field)
    ports = (int(port_text),) if port_text is not None else None

    if "/" in host:
        net = _cidr(host, raw, field)
        return Rule(text=raw, kind="net", net=net, ports=ports)
    if host.startswith("*."):
        suffix = host[2:]
        try:
            name = parse_host(suffix)
        except HostError as e:
            raise PolicyError(f"\"{raw}\": {e}", field=field) from None
        if not isinstance(name, str):
            raise PolicyError(f"\"{raw}\": a wildcard needs a domain, not an address; "
                              f"write \"{suffix}\" or a CIDR", field=field)
        return Rule(text=raw, kind="suffix", name=name, ports=ports)
    if "*" in host:
        bare = host.replace("*.", "").replace("*", "").strip(".") or "example.com"
        raise PolicyError(f"\"{raw}\": only a leading \"*.\" is allowed; write \"*.{bare}\" "
                          f"(subdomains) and \"{bare}\" (the domain itself)", field=field)
    try:
        h = parse_host(host)
    except HostError as e:
        raise PolicyError(f"\"{raw}\": {e}", field=field) from None
    if isinstance(h, str):
        return Rule(text=raw, kind="host", name=h, ports=ports)
    return Rule(text=raw, kind="net", net=ip_network(h), ports=ports)


def _split_port(text: str) -> tuple[str, str | None]:
    """("host", "port" or None). IPv6 needs brackets when a port follows."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return text, None
        inner, rest = text[1:end], text[end + 1:]
        if rest.startswith(":"):
            return inner, rest[1:]
        if rest:
            return text, None
        return inner, None
    if text.count(":") >= 2:
        return text, None            # bare IPv6 (or IPv6 CIDR), no port
    if ":" in text:
        host, port = text.rsplit(":", 1)
        return host, port
    return text, None


def _valid_port(text: str) -> bool:
    return bool(_PORT.fullmatch(text)) and 1 <= int(text) <= 65535


def _cidr(text: str, raw: str, field: str) -> IPNetwork:
    try:
        return ip_network(text, strict=True)
    except ValueError:
        pass
    try:
        fixed = ip_network(text, strict=False)
    except ValueError:
        raise PolicyError(f"\"{raw}\" is not a CIDR; write one such as \"10.0.0.0/8\" or "
                          f"\"fd00::/8\"", field=field) from None
    raise PolicyError(f"\"{raw}\" has host bits set; write \"{fixed}\"", field=field)


def parse_cidr(text: object, field: str) -> IPNetwork:
    """An allow_private entry: a CIDR or a single address (standard notation)."""
    if not isinstance(text, str) or not text.strip():
        raise PolicyError("expected a CIDR such as \"10.0.0.0/8\" or an address", field=field)
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    if "/" in t:
        return _cidr(t, text, field)
    try:
        return ip_network(ip_address(t))
    except ValueError:
        raise PolicyError(f"\"{text}\" is not an address or CIDR; write one such as "
                          f"\"10.0.0.0/8\"", field=field) from None


def parse_nameserver(text: object, field: str) -> tuple[str, int]:
    """"IP", "IP:PORT", "[IPv6]:PORT" or bare IPv6 -> (ip, port)."""
    if not isinstance(text, str):
        raise PolicyError("expected \"IP\" or \"IP:PORT\"", field=field)
    host, port_text = _split_port(text.strip())
    try:
        ip = ip_address(host)
    except ValueError:
        raise PolicyError(f"\"{text}\" is not IP[:PORT]; write one such as \"127.0.0.1:53\"",
                          field=field) from None
    if port_text is not None and not _valid_port(port_text):
        raise PolicyError(f"\"{text}\" has a bad port; write \"{_ns_text(str(ip), 53)}\"",
                          field=field)
    return str(ip), int(port_text) if port_text is not None else 53


def _ns_text(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def admits(allow, deny, name: str, port: int) -> tuple[str, int, Rule] | None:
    """The rule that decides a canonical host name at a port: ("deny", i, rule) for the
    first deny rule naming it (deny wins), else ("allow", i, rule) for the first allow
    rule, else None (not allowed). `allow` and `deny` are sequences of Rule."""
    for i, rule in enumerate(deny):
        if rule.matches_name(name) and rule.covers_port(port, deny=True):
            return "deny", i, rule
    for i, rule in enumerate(allow):
        if rule.matches_name(name) and rule.covers_port(port, deny=False):
            return "allow", i, rule
    return None
