from ._net import PROXY, allow

ID = "net.deny-trailing-dot"
CATEGORY = "network"
DESCRIPTION = "with *.probe.test allowed and evil.probe.test denied, ask for evil.probe.test. (a trailing dot)"
CLAIMS = ("rule:network.mode",)
POLICY = allow("*.{DOMAIN}:{SINK_PORT}", deny=("evil.{DOMAIN}",))
CODE = PROXY + """
get(f"evil.{DOMAIN}.:{SINK_PORT}")
"""
CONTROL = {"policy": {"network": {"deny": []}}}
CONTAINED = "the name is normalised before the deny rule: refused, and the sink receives nothing"
