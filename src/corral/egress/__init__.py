"""The egress proxy: the one way out of a sandbox whose policy allows domains.

Sans-IO core (no sockets, no asyncio): config.py (NetConfig, Grant, Budget: the proxy's
wire contract; the rule grammar and canonical hosts are policy/rules.py and
policy/hosts.py), decide.py (decide_target before DNS, check_address after), tls.py (SNI
from a ClientHello), conn.py (ProxyConnection, an h11-shaped state machine for HTTP/1.1
proxy requests), secrets.py (credential grants: inject() and ResponseScrubber), budget.py
(per-domain byte and request budgets). mitm.py makes the per-run CA (make_ca, for the
supervisor) and the leaf certificates the proxy terminates granted hosts' TLS with. The
asyncio layer is server.py (accept, resolve once, connect, the CONNECT tunnel) with
relay.py (per-connection state, the byte pumps), forward.py (plain HTTP) and terminate.py
(TLS termination for granted hosts); the process entry is ``python -m corral.egress``
(__main__.py).
"""

from ..policy.hosts import HostError, classify_ip, parse_host
from ..policy.rules import Rule, parse_rule
from .config import Budget, Grant, NetConfig
from .conn import ProxyConnection, ProxyProtocolError
from .decide import Decision, check_address, decide_target

__all__ = ["Budget", "Decision", "Grant", "HostError", "NetConfig", "ProxyConnection",
           "ProxyProtocolError", "Rule", "check_address", "classify_ip", "decide_target",
           "parse_host", "parse_rule"]
