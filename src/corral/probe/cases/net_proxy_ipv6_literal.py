from ._net import PROXY, allow

ID = "net.proxy-ipv6-literal"
CATEGORY = "network"
DESCRIPTION = "reach the sink's IPv6 listener through the proxy as the literal [::1] (and [0:0:0:0:0:0:0:1])"
CLAIMS = ("rule:network.mode",)
POLICY = allow(private=("{CIDR}", "::1/128"))
CODE = PROXY + """
get(f"[::1]:{SINK_PORT}")
get(f"[0:0:0:0:0:0:0:1]:{SINK_PORT}")
"""
CONTROL = {"policy": {"network": {"allow": ["[::1]:{SINK_PORT}"]}}}
CONTAINED = "an IPv6 literal no rule names is refused: the sink receives nothing"
