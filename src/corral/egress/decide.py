"""The two decisions of the egress proxy. Pure: no I/O.

1. `decide_target(cfg, host, port)` runs on what the client asked for, **before** any DNS
   query, so a denied name costs no lookup (and leaks nothing through the resolver):
   bad host -> deny; metadata name -> deny; a deny rule -> deny (deny wins); an allow rule
   -> allow; learn mode (cfg.learn, never from a policy) -> allow; otherwise deny. IP
   literals (any spelling) need a rule naming the address or a CIDR holding it (or learn).
2. `check_address(cfg, addr, port)` runs on each address the proxy is about to connect to
   (the resolved ones, or the literal): deny rules naming addresses apply, and an address
   that is not "public" (hosts.classify_ip) needs an ``allow_private`` entry covering it.

Reasons are one line of ASCII: they go into the ``X-Corral-Reason`` header and the events,
and they tell an agent which rule to ask for.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from ..policy.hosts import (
    HostError,
    IPAddress,
    canonical_ip,
    classify_ip,
    embedded_ipv4,
    host_header_text,
    is_metadata_name,
    parse_host,
)
from ..policy.rules import admits
from .config import NetConfig

#: the reason of a target learn mode let through (cfg.learn); the address guard still runs
LEARN_REASON = "learn mode: any host (the address guard still applies)"


@dataclass(frozen=True, slots=True)
class Decision:
    allow: bool
    reason: str
    host: str                        # canonical: lower case name, or an IP in standard notation
    ip: IPAddress | None = None      # set when the target was an IP literal (no DNS then)
    #: what budgets count against: the host, or "*.suffix" for every name a wildcard rule
    #: let through (so a thousand subdomains share one budget instead of having a thousand)
    budget_key: str = ""

    def __post_init__(self) -> None:
        if not self.budget_key:
            object.__setattr__(self, "budget_key", self.host)


def decide_target(cfg: NetConfig, host: str, port: int) -> Decision:
    """May the client reach host:port at all? Decided on the name alone, before DNS."""
    try:
        h = parse_host(host)
    except HostError as e:
        return Decision(False, f"bad host: {e}", _printable(host))
    canon = str(h)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        return Decision(False, "bad port", canon)
    if isinstance(h, str):
        if is_metadata_name(h):
            return Decision(False, "metadata name", canon)
        found = admits(cfg.allow, cfg.deny, h, port)
        if found is not None:
            which, i, rule = found
            if which == "deny":
                return Decision(False, f"network.deny[{i}] \"{rule.text}\"", canon)
            key = f"*.{rule.name}" if rule.kind == "suffix" else canon
            return Decision(True, f"network.allow[{i}] \"{rule.text}\"", canon,
                            budget_key=key)
        if cfg.learn:
            return Decision(True, LEARN_REASON, canon)
        return Decision(False, f"not in network.allow; ask for \"{_rule_for(canon, port)}\"",
                        canon)
    for i, rule in enumerate(cfg.deny):
        if _ip_rule_matches(rule, h) and rule.covers_port(port, deny=True):
            return Decision(False, f"network.deny[{i}] \"{rule.text}\"", canon, h)
    for i, rule in enumerate(cfg.allow):
        if _ip_rule_matches(rule, h) and rule.covers_port(port, deny=False):
            return Decision(True, f"network.allow[{i}] \"{rule.text}\"", canon, h)
    if cfg.learn:
        return Decision(True, LEARN_REASON, canon, h)
    return Decision(False, f"ip literal not in network.allow; ask for "
                           f"\"{_rule_for(h, port)}\"", canon, h)


def check_address(cfg: NetConfig, addr: IPAddress, port: int | None = None) -> Decision:
    """May the proxy connect to this (resolved or literal) address?"""
    addr = canonical_ip(addr)
    canon = str(addr)
    for i, rule in enumerate(cfg.deny):
        if _ip_rule_matches(rule, addr) and (port is None or rule.covers_port(port, deny=True)):
            return Decision(False, f"network.deny[{i}] \"{rule.text}\"", canon, addr)
    kind = classify_ip(addr)
    if kind == "public":
        return Decision(True, "public address", canon, addr)
    for net in cfg.allow_private:
        if _in(addr, net):
            return Decision(True, f"network.allow_private \"{net}\"", canon, addr)
    return Decision(False, f"address {canon} is {kind}; ask for network.allow_private "
                           f"\"{canon}/{addr.max_prefixlen}\"", canon, addr)


def _in(addr: IPAddress, net) -> bool:
    if addr.version == net.version and addr in net:
        return True
    if isinstance(addr, IPv6Address):
        v4 = embedded_ipv4(addr)
        return v4 is not None and v4 in net if net.version == 4 else False
    return False


def _ip_rule_matches(rule, addr: IPAddress) -> bool:
    return rule.kind == "net" and rule.net is not None and _in(addr, rule.net)


def _rule_for(host, port: int) -> str:
    if isinstance(host, IPv6Address):
        return f"[{host}]:{port}"
    if port in (80, 443) and not isinstance(host, IPv4Address):
        return str(host)
    return f"{host_header_text(host, port, default_port=-1)}"


def _printable(text: object) -> str:
    """A safe, short, one-line rendering of a host we could not parse (for events)."""
    s = text if isinstance(text, str) else repr(text)
    s = "".join(c if 0x20 < ord(c) < 0x7F else "?" for c in s)
    return s[:255]


__all__ = ["LEARN_REASON", "Decision", "check_address", "decide_target"]
