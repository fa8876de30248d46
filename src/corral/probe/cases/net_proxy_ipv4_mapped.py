from ._net import ALLOW, PROXY

ID = "net.proxy-ipv4-mapped"
CATEGORY = "network"
DESCRIPTION = "reach the sink through the proxy as an IPv4-mapped IPv6 literal, [::ffff:127.X.Y.1] and [::ffff:7fXX:YY01]"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
a, b, c, d = (int(x) for x in SINK_HOST.split("."))
get(f"[::ffff:{SINK_HOST}]:{SINK_PORT}")
get(f"[::ffff:{a << 8 | b:x}:{c << 8 | d:x}]:{SINK_PORT}")
"""
CONTROL = {"policy": {"network": {"allow": ["{SINK_HOST}:{SINK_PORT}"]}}}
CONTAINED = "both spellings are refused (only the name is allowed, not the address): the sink receives nothing"
