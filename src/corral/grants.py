"""Secret grants on the supervisor's side: placeholders, values, the run's CA bundle.

The sandbox sees `NAME=<placeholder>`: random per sandbox, worthless anywhere else. The
value is read here, on the host, when the sandbox opens, and goes only to the egress proxy
(in its config memfd). Nothing in this module puts a value in a message, a repr or an
event.
"""

from __future__ import annotations

import os

from .errors import PolicyError

#: inside the sandbox: the system CAs plus the run's CA, for clients that verify TLS
CA_BUNDLE = "/etc/corral-ca.pem"
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT",
          "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")
SYSTEM_CAS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def placeholder(name: str) -> str:
    """Random per sandbox, in the grammar the proxy accepts (egress/config.py Grant)."""
    return f"corral_{name}_{os.urandom(16).hex()}"


class Granted:
    """What the supervisor keeps for one grant while the sandbox lives."""

    __slots__ = ("secret", "placeholder", "value", "expires_at")

    def __init__(self, secret, placeholder: str, value: Value, expires_at: float) -> None:
        self.secret, self.placeholder, self.value = secret, placeholder, value
        self.expires_at = expires_at

    def to_proxy(self) -> dict:
        s = self.secret
        return {"name": s.name, "placeholder": self.placeholder, "value": self.value.reveal(),
                "hosts": list(s.hosts), "expires_at": self.expires_at,
                "plain_http": s.plain_http}

    def __repr__(self) -> str:
        return f"Granted({self.secret.name}, expires_at={self.expires_at})"


def resolve(policy, placeholders: dict[str, str], host_env: dict[str, str]) -> list[Granted]:
    """Read every grant's value now (errors name the field), with its expiry."""
    import time

    now = time.time()
    return [Granted(s, placeholders[s.name], read_value(s, host_env), now + s.ttl)
            for s in policy.secrets]


def proxy_config(config_json: str, granted: list[Granted], ca: tuple[str, str] | None,
                 upstream_ca: str | None) -> str:
    """The proxy's full configuration: the plan's (no secrets in it) plus the grants and
    the run's CA. Validated by the proxy's own parser; goes straight into a memfd."""
    import json

    from .egress.config import NetConfig

    d = json.loads(config_json)
    if granted:
        d["secrets"] = [g.to_proxy() for g in granted]
        d["ca_cert_pem"], d["ca_key_pem"] = ca
    if upstream_ca:
        d["upstream_ca"] = upstream_ca
    try:
        return NetConfig.from_dict(d).to_json()
    except PolicyError as e:
        # messages from the proxy's parser never hold a value; name the policy's field
        field = e.field or "secrets"
        if field.startswith("network.secrets["):
            i = int(field.split("[")[1].split("]")[0])
            field = f"secrets.{granted[i].secret.name}"
        raise PolicyError(e.message, field=field) from None


class Value:
    """A secret value that does not print."""

    __slots__ = ("_v",)

    def __init__(self, v: str) -> None:
        self._v = v

    def reveal(self) -> str:
        return self._v

    def __repr__(self) -> str:
        return "Value(<hidden>)"

    __str__ = __repr__


def read_value(secret, host_env: dict[str, str]) -> Value:
    """The grant's value from its source, or a PolicyError naming the field and the fix."""
    field = f"secrets.{secret.name}"
    src = secret.source
    if src == "literal":
        v = secret.value or ""
    elif src.startswith("env:"):
        var = src[4:]
        if var not in host_env:
            raise PolicyError(f"the environment variable {var} is not set in corral's "
                              f"environment; export it or change the source",
                              field=f"{field}.from")
        v = host_env[var]
    elif src.startswith("file:"):
        path = src[5:]
        try:
            with open(path, encoding="utf-8") as f:
                v = f.read()
        except OSError as e:
            raise PolicyError(f"cannot read {path}: {e.strerror}", field=f"{field}.from") from None
        except UnicodeDecodeError:
            raise PolicyError(f"{path} is not UTF-8 text", field=f"{field}.from") from None
        v = v.rstrip("\r\n")
    else:
        raise PolicyError(f"unknown source {src!r}; use env:VAR or file:PATH",
                          field=f"{field}.from")
    if not v:
        raise PolicyError("the secret's value is empty; refusing to run without it",
                          field=f"{field}.from")
    if any(c in v for c in "\r\n\0"):
        raise PolicyError("the secret's value contains a line break or NUL; it cannot go "
                          "into an HTTP header", field=f"{field}.from")
    return Value(v)


def ca_bundle(ca_cert_pem: str) -> bytes:
    """The system's CA certificates followed by the run's CA."""
    for path in SYSTEM_CAS:
        try:
            with open(path, "rb") as f:
                return f.read().rstrip(b"\n") + b"\n" + ca_cert_pem.encode()
        except OSError:
            continue
    return ca_cert_pem.encode()
