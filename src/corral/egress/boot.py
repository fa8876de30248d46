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
    "cryptography.x509", "cryptography.x509.oid", "cryptography.hazmat.primitives.hashes",
    "cryptography.hazmat.primitives.serialization",
    "cryptography.hazmat.primitives.asymmetric.ec",
    "cryptography.hazmat.primitives.asymmetric.rsa",
    "cryptography.hazmat.primitives.asymmetric.padding",
)


def preload() -> None:
    import importlib

    import corral.egress as pkg

    for mod in pkgutil.iter_modules(pkg.__path__, "corral.egress."):
        if mod.name != "corral.egress.boot":
            importlib.import_module(mod.name)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # optional pieces (an older dnspython layout, say)


#: the process that started us (the supervisor), read before anything else can happen
PARENT = os.getppid()


def main() -> None:
    uid, gid, sep, *args = sys.argv[1:]
    assert sep == "--"
    preload()
    uid, gid = int(uid), int(gid)
    if os.getuid() == 0 and uid != 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    from corral.egress.__main__ import main as proxy_main

    sys.exit(proxy_main(args))
