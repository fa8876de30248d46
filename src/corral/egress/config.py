"""What one egress proxy enforces: `NetConfig`, its budgets and secret grants. Pure: no I/O.

The rule grammar (network.allow, network.deny, allow_private, nameservers) is the policy's
own: corral.policy.rules; this module builds on it.

Secret grants (``secrets``, see secrets.py): each `Grant` names the hosts (same grammar; a
rule without a port means every port the allow list opens for that host) whose requests get
the grant's value in place of its placeholder. ``to_dict``/``to_json`` carry the values and
the run CA's private key: they exist to hand the proxy its configuration through a memfd and
must never be logged. ``repr()`` and ``str()`` of a `Grant` or a `NetConfig` show neither.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from ..errors import PolicyError
from ..policy.rules import (
    DEFAULT_PORTS,
    IPNetwork,
    Rule,
    _ns_text,
    parse_cidr,
    parse_nameserver,
    parse_rule,
)


@dataclass(frozen=True, slots=True)
class Budget:
    """Per canonical domain, summed over every connection of one proxy. None = unlimited."""

    bytes_out: int | None = None     # bytes sent upstream (request heads, bodies, tunnel data)
    bytes_in: int | None = None      # bytes received from upstream
    requests: int | None = None      # HTTP requests plus CONNECT tunnels


#: a placeholder: what the sandbox sees instead of the value (secrets.make_placeholder)
_PLACEHOLDER = re.compile(r"[A-Za-z0-9_-]{16,256}")            # both: fullmatch only


_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


#: shorter values would make the response scrubber rewrite ordinary text
MIN_SECRET_LEN = 8


MAX_SECRET_LEN = 8192


@dataclass(frozen=True, slots=True)
class Grant:
    """One credential grant: requests to ``hosts`` (while ``expires_at`` is in the future, and
    over HTTPS unless ``plain_http``) get ``value`` wherever the sandbox wrote
    ``placeholder``. ``value`` is printable ASCII and never appears in repr() or str()."""

    name: str                        # the variable name inside the sandbox, for events
    placeholder: str                 # what the sandbox holds: [A-Za-z0-9_-]{16,256}
    value: str = field(repr=False)   # the credential; never logged
    hosts: tuple[Rule, ...] = ()     # allow-rule grammar; no port = every port allowed
    expires_at: float = 0.0          # unix time after which the proxy refuses to use it
    plain_http: bool = False         # also inject into unencrypted http:// requests

    def covers(self, host, port: int) -> bool:
        """Does this grant name host:port? ``host`` is canonical (hosts.parse_host)."""
        for rule in self.hosts:
            if rule.ports is not None and port not in rule.ports:
                continue
            if isinstance(host, str):
                if rule.matches_name(host):
                    return True
            elif rule.matches_ip(host):
                return True
        return False

    def to_dict(self) -> dict:
        return {"name": self.name, "placeholder": self.placeholder, "value": self.value,
                "hosts": [r.text for r in self.hosts], "expires_at": self.expires_at,
                "plain_http": self.plain_http}


@dataclass(frozen=True, slots=True)
class NetConfig:
    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()                      # wins over allow
    allow_private: tuple[IPNetwork, ...] = ()        # addresses reachable despite the guard
    nameservers: tuple[tuple[str, int], ...] = ()    # (ip, port); empty: /etc/resolv.conf
    budget: Budget = field(default_factory=Budget)
    connect_timeout: float = 10.0    # seconds to open the upstream connection
    idle_timeout: float = 300.0      # seconds without a byte either way before a close
    header_timeout: float = 10.0     # seconds to receive a request head or a ClientHello
    dns_timeout: float = 5.0         # seconds for the A and AAAA lookups together
    max_connections: int = 512       # client connections open at once; more are refused
    max_header_bytes: int = 16384    # request head size cap (431 beyond it)
    secrets: tuple[Grant, ...] = ()  # credential grants (secrets.py); need the run CA
    ca_cert_pem: str | None = None   # the run CA the proxy terminates TLS with (mitm.make_ca)
    ca_key_pem: str | None = field(default=None, repr=False)   # its private key; never logged
    upstream_ca: str | None = None   # CA file for upstream TLS of granted hosts (default: system)
    #: accept a client only if its socket belongs to this uid (peer.py, sock_diag): for a
    #: listener on the host's loopback (the process tier), which any local user could reach
    peer_uid: int | None = None
    #: learn mode (`corral learn`, runtime/learn.py): every well-formed host at any port
    #: passes the name check (deny rules and the metadata names still refuse, and the
    #: address guard still refuses private and metadata addresses outside allow_private).
    #: Only the runtime sets it, for a learn run: no policy key reaches it (plan.net_config)
    learn: bool = False

    def to_dict(self) -> dict:
        return {
            "allow": [r.text for r in self.allow],
            "deny": [r.text for r in self.deny],
            "allow_private": [str(n) for n in self.allow_private],
            "nameservers": [_ns_text(ip, port) for ip, port in self.nameservers],
            "budget": {"bytes_out": self.budget.bytes_out, "bytes_in": self.budget.bytes_in,
                       "requests": self.budget.requests},
            "connect_timeout": self.connect_timeout,
            "idle_timeout": self.idle_timeout,
            "header_timeout": self.header_timeout,
            "dns_timeout": self.dns_timeout,
            "max_connections": self.max_connections,
            "max_header_bytes": self.max_header_bytes,
            "secrets": [g.to_dict() for g in self.secrets],
            "ca_cert_pem": self.ca_cert_pem,
            "ca_key_pem": self.ca_key_pem,
            "upstream_ca": self.upstream_ca,
            "peer_uid": self.peer_uid,
            **({"learn": True} if self.learn else {}),   # absent unless set: the old wire
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> NetConfig:
        try:
            obj = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise PolicyError(f"egress config is not JSON ({e})", field="network") from None
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, obj: object, prefix: str = "network") -> NetConfig:
        if not isinstance(obj, dict):
            raise PolicyError("expected a table (JSON object)", field=prefix)
        unknown = set(obj) - _KEYS
        if unknown:
            name = min(unknown)
            raise PolicyError(f"unknown key {name!r}; known keys: {', '.join(sorted(_KEYS))}",
                              field=f"{prefix}.{name}")
        kw: dict = {}
        for key in ("allow", "deny"):
            if key in obj:
                kw[key] = tuple(parse_rule(t, f"{prefix}.{key}[{i}]")
                                for i, t in enumerate(_list(obj[key], f"{prefix}.{key}")))
        if "allow_private" in obj:
            kw["allow_private"] = tuple(
                parse_cidr(t, f"{prefix}.allow_private[{i}]")
                for i, t in enumerate(_list(obj["allow_private"], f"{prefix}.allow_private")))
        if "nameservers" in obj:
            kw["nameservers"] = tuple(
                parse_nameserver(t, f"{prefix}.nameservers[{i}]")
                for i, t in enumerate(_list(obj["nameservers"], f"{prefix}.nameservers")))
        if "budget" in obj:
            kw["budget"] = _budget(obj["budget"], f"{prefix}.budget")
        for key in ("connect_timeout", "idle_timeout", "header_timeout", "dns_timeout"):
            if key in obj:
                kw[key] = _number(obj[key], f"{prefix}.{key}", minimum=0.001)
        if "max_connections" in obj:
            kw["max_connections"] = _int(obj["max_connections"], f"{prefix}.max_connections", 1)
        if "max_header_bytes" in obj:
            kw["max_header_bytes"] = _int(obj["max_header_bytes"], f"{prefix}.max_header_bytes",
                                          1024)
        if obj.get("secrets"):
            kw["secrets"] = _grants(obj["secrets"], f"{prefix}.secrets")
        for key, marker in (("ca_cert_pem", "CERTIFICATE"), ("ca_key_pem", "PRIVATE KEY")):
            if obj.get(key) is not None:
                kw[key] = _pem(obj[key], marker, f"{prefix}.{key}")
        if obj.get("upstream_ca") is not None:
            v = obj["upstream_ca"]
            if not isinstance(v, str) or not v.strip():
                raise PolicyError("expected the path of a PEM file of CA certificates",
                                  field=f"{prefix}.upstream_ca")
            kw["upstream_ca"] = v
        if obj.get("peer_uid") is not None:
            kw["peer_uid"] = _int(obj["peer_uid"], f"{prefix}.peer_uid", 0)
        if obj.get("learn") is not None:
            if not isinstance(obj["learn"], bool):
                raise PolicyError("expected true or false", field=f"{prefix}.learn")
            kw["learn"] = obj["learn"]
        if ("ca_cert_pem" in kw) != ("ca_key_pem" in kw):
            missing = "ca_key_pem" if "ca_cert_pem" in kw else "ca_cert_pem"
            raise PolicyError("the run CA needs both its certificate and its key; pass both "
                              "halves of corral.egress.mitm.make_ca()", field=f"{prefix}.{missing}")
        if kw.get("secrets") and "ca_cert_pem" not in kw:
            raise PolicyError("secret grants need the run CA (the proxy terminates TLS for "
                              "granted hosts); pass corral.egress.mitm.make_ca()",
                              field=f"{prefix}.ca_cert_pem")
        return cls(**kw)


_KEYS = frozenset({"allow", "deny", "allow_private", "nameservers", "budget", "connect_timeout",
                   "idle_timeout", "header_timeout", "dns_timeout", "max_connections",
                   "max_header_bytes", "secrets", "ca_cert_pem", "ca_key_pem", "upstream_ca",
                   "peer_uid", "learn"})


_GRANT_KEYS = frozenset({"name", "placeholder", "value", "hosts", "expires_at", "plain_http"})


def _grants(value: object, field: str) -> tuple[Grant, ...]:
    """The "secrets" list. Messages name the field and never contain a value."""
    items = _list(value, field)
    out: list[Grant] = []
    for i, g in enumerate(items):
        f = f"{field}[{i}]"
        if not isinstance(g, dict):
            raise PolicyError("expected a table with name, placeholder, value, hosts, "
                              "expires_at, plain_http", field=f)
        unknown = set(g) - _GRANT_KEYS
        if unknown:
            name = min(unknown)
            raise PolicyError(f"unknown key {name!r}; known keys: "
                              f"{', '.join(sorted(_GRANT_KEYS))}", field=f"{f}.{name}")
        for key in ("name", "placeholder", "value", "hosts", "expires_at"):
            if key not in g:
                raise PolicyError(f"missing {key!r}", field=f"{f}.{key}")
        name = g["name"]
        if not isinstance(name, str) or not _SECRET_NAME.fullmatch(name):
            raise PolicyError("expected a variable name such as \"GITHUB_TOKEN\"",
                              field=f"{f}.name")
        ph = g["placeholder"]
        if not isinstance(ph, str) or not _PLACEHOLDER.fullmatch(ph):
            raise PolicyError("expected 16 to 256 characters of A-Z a-z 0-9 _ -; use "
                              "corral.egress.secrets.make_placeholder()", field=f"{f}.placeholder")
        val = g["value"]
        if not isinstance(val, str):
            raise PolicyError("expected a string", field=f"{f}.value")
        if not MIN_SECRET_LEN <= len(val) <= MAX_SECRET_LEN:
            raise PolicyError(f"the value of {name} has {len(val)} characters; a grant needs "
                              f"{MIN_SECRET_LEN} to {MAX_SECRET_LEN} (shorter ones would be "
                              f"scrubbed out of ordinary text)", field=f"{f}.value")
        if not all(" " <= c <= "~" for c in val) or val != val.strip():
            raise PolicyError(f"the value of {name} has a control, non-ASCII or edge space "
                              f"character; only printable ASCII can go into a header",
                              field=f"{f}.value")
        if ph in val or val in ph:
            raise PolicyError(f"the placeholder and the value of {name} contain one another; "
                              f"make a fresh placeholder", field=f"{f}.placeholder")
        hosts = tuple(parse_rule(t, f"{f}.hosts[{j}]")
                      for j, t in enumerate(_list(g["hosts"], f"{f}.hosts")))
        if not hosts:
            raise PolicyError("a grant needs at least one host", field=f"{f}.hosts")
        exp = g["expires_at"]
        if isinstance(exp, bool) or not isinstance(exp, (int, float)) or not math.isfinite(exp):
            raise PolicyError("expected a unix time in seconds", field=f"{f}.expires_at")
        plain = g.get("plain_http", False)
        if not isinstance(plain, bool):
            raise PolicyError("expected true or false", field=f"{f}.plain_http")
        for prev in out:
            if prev.name == name:
                raise PolicyError(f"a second grant named {name}", field=f"{f}.name")
            if prev.placeholder == ph:
                raise PolicyError(f"{name} reuses the placeholder of {prev.name}",
                                  field=f"{f}.placeholder")
            if prev.placeholder in val or ph in prev.value or val in prev.placeholder \
                    or prev.value in ph:
                raise PolicyError(f"a placeholder of one grant and the value of another ("
                                  f"{prev.name}, {name}) contain one another",
                                  field=f"{f}.placeholder")
        out.append(Grant(name=name, placeholder=ph, value=val, hosts=hosts,
                         expires_at=float(exp), plain_http=plain))
    return tuple(out)


def _pem(value: object, marker: str, field: str) -> str:
    if not isinstance(value, str) or "-----BEGIN " not in value or marker not in value:
        raise PolicyError(f"expected a PEM {marker.lower()} (corral.egress.mitm.make_ca)",
                          field=field)
    return value


def _list(value: object, field: str) -> list:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise PolicyError("expected a list of strings", field=field)
    return list(value)


def _budget(value: object, field: str) -> Budget:
    if not isinstance(value, dict):
        raise PolicyError("expected a table with bytes_out, bytes_in, requests", field=field)
    unknown = set(value) - {"bytes_out", "bytes_in", "requests"}
    if unknown:
        name = min(unknown)
        raise PolicyError(f"unknown key {name!r}; known keys: bytes_in, bytes_out, requests",
                          field=f"{field}.{name}")
    kw = {k: (None if value[k] is None else _int(value[k], f"{field}.{k}", 0))
          for k in value}
    return Budget(**kw)


def _int(value: object, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"expected a whole number >= {minimum}", field=field)
    if value < minimum:
        raise PolicyError(f"{value} is below the minimum {minimum}", field=field)
    return value


def _number(value: object, field: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError("expected a number of seconds", field=field)
    v = float(value)
    if not math.isfinite(v) or v < minimum:
        raise PolicyError(f"expected a finite number of seconds >= {minimum}", field=field)
    return v


__all__ = [
    "DEFAULT_PORTS",
    "Budget",
    "Grant",
    "NetConfig",
    "Rule",
    "parse_cidr",
    "parse_nameserver",
    "parse_rule",
]
