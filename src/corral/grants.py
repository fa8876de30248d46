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
    return f"corral-{name.lower().replace('_', '-')}-{os.urandom(16).hex()}"


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
