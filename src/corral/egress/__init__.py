"""The egress proxy: the one way out of a sandbox whose policy allows domains.

Sans-IO core (no sockets, no asyncio): hosts.py (canonical hosts, IP spellings,
classify_ip), config.py (NetConfig, the rule grammar), decide.py (decide_target before DNS,
check_address after), tls.py (SNI from a ClientHello), conn.py (ProxyConnection, an
h11-shaped state machine for HTTP/1.1 proxy requests), secrets.py (credential grants:
inject() and ResponseScrubber). mitm.py makes the per-run CA (make_ca, for the supervisor)
and the leaf certificates the proxy terminates granted hosts' TLS with. The asyncio layer
is server.py; the process entry is ``python -m corral.egress`` (__main__.py).
"""

from ..policy.hosts import HostError, classify_ip, parse_host
from ..policy.rules import Rule, parse_rule
from .config import Budget, Grant, NetConfig
from .conn import ProxyConnection, ProxyProtocolError
from .decide import Decision, check_address, decide_target

__all__ = ["Budget", "Decision", "Grant", "HostError", "NetConfig", "ProxyConnection",
           "ProxyProtocolError", "Rule", "check_address", "classify_ip", "decide_target",
           "parse_host", "parse_rule"]
