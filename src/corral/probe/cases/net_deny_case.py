from ._net import PROXY, allow

ID = "net.deny-case"
CATEGORY = "network"
DESCRIPTION = "with *.probe.test allowed and evil.probe.test denied, ask for EVIL.Probe.TEST (upper case)"
CLAIMS = ("rule:network.mode",)
POLICY = allow("*.{DOMAIN}:{SINK_PORT}", deny=("evil.{DOMAIN}",))
CODE = PROXY + """
get(f"EVIL.Probe.TEST:{SINK_PORT}")
"""
CONTROL = {"policy": {"network": {"deny": []}}}
CONTAINED = "the name is lower-cased before the deny rule: refused, and the sink receives nothing"
