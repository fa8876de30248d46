"""Starts the egress proxy as root, loads everything it will need, then drops to the run's
unprivileged uid before it reads a single byte from the sandbox.

Why: the proxy parses what sandboxed code sends it, so it must not run as root; but
corral's code and virtual environment may live where that uid cannot read them (a
checkout under /root, a 0700 temp dir). Importing first and dropping second works
wherever corral is installed.

    python -I -c 'import corral.egress.boot as b; b.main()' UID GID -- PROXY ARGS...
"""

from __future__ import annotations

import os
import pkgutil
import sys

#: what the proxy imports lazily, loaded here before the privileges go
PRELOAD = (
    "asyncio", "ssl", "gzip", "zlib", "base64", "json", "h11",
    "dns.asyncresolver", "dns.asyncbackend", "dns._asyncio_backend", "dns.resolver",
    "dns.nameserver", "dns.exception", "dns.name", "dns.rdatatype", "dns.rdataclass",
    "dns.message", "dns.query", "dns.inet", "dns.rdtypes.IN.A", "dns.rdtypes.IN.AAAA",
    "dns.rdtypes.ANY.CNAME", "dns.rdtypes.ANY.SOA",
)
#: what TLS termination for secret grants adds (mitm.py); ~9 MB a proxy, so only with grants
PRELOAD_GRANTS = (
    "cryptography.x509", "cryptography.x509.oid", "cryptography.hazmat.primitives.hashes",
    "cryptography.hazmat.primitives.serialization",
    "cryptography.hazmat.primitives.asymmetric.ec",
    "cryptography.hazmat.primitives.asymmetric.rsa",
    "cryptography.hazmat.primitives.asymmetric.padding",
)


def _config(args: list[str]) -> dict | None:
    """The config (--config-fd, a memfd), read with pread so the proxy still reads it whole
    from offset 0. None if unreadable or not a JSON object (the proxy then says why)."""
    import json

    try:
        fd = int(args[args.index("--config-fd") + 1])
        data, off = b"", 0
        while chunk := os.pread(fd, 1 << 16, off):
            data, off = data + chunk, off + len(chunk)
        obj = json.loads(data)
    except (ValueError, IndexError, OSError):
        return None
    return obj if isinstance(obj, dict) else None


def has_grants(args: list[str]) -> bool:
    """Does the config hold secret grants? Unreadable or unknown: assume it does."""
    cfg = _config(args)
    return True if cfg is None else bool(cfg.get("secrets"))


def lift_nofile(args: list[str]) -> None:
    """As root, before the uid switch: lift the hard RLIMIT_NOFILE to what the config's
    connection cap needs (server.nofile_for), which the unprivileged proxy cannot do itself.
    Never lowers it; a failure leaves the proxy to lower its cap instead (__main__.py)."""
    import resource

    from corral.egress.config import NetConfig
    from corral.egress.server import nofile_for

    cfg = _config(args) or {}
    cap = cfg.get("max_connections", NetConfig().max_connections)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        return                               # the proxy refuses the config itself
    want = nofile_for(cap)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, want))
        except (OSError, ValueError):
            pass                             # past fs.nr_open, say


def preload(grants: bool = True) -> None:
    import importlib

    import corral.egress as pkg

    for mod in pkgutil.iter_modules(pkg.__path__, "corral.egress."):
        if mod.name != "corral.egress.boot":
            importlib.import_module(mod.name)
    for name in PRELOAD + (PRELOAD_GRANTS if grants else ()):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # optional pieces (an older dnspython layout, say)


#: the process that started us (the supervisor), read before anything else can happen
PARENT = os.getppid()


def main() -> None:
    uid, gid, sep, *args = sys.argv[1:]
    assert sep == "--"
    preload(has_grants(args))
    uid, gid = int(uid), int(gid)
    if os.getuid() == 0:
        lift_nofile(args)
    if os.getuid() == 0 and uid != 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    from corral.egress.__main__ import main as proxy_main

    sys.exit(proxy_main(args))
