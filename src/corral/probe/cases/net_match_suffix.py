from ._net import ALLOW, PROXY

ID = "net.match-suffix"
CATEGORY = "network"
DESCRIPTION = "with sink.probe.test allowed, ask the proxy for sink.probe.test.evil.probe.test (the allowed name as a prefix)"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
get(f"sink.{DOMAIN}.evil.{DOMAIN}:{SINK_PORT}")
"""
CONTROL = {"policy": {"network": {"allow": ["*.{DOMAIN}:{SINK_PORT}"]}}}
CONTAINED = "names are matched whole, label by label: the request is refused and the sink receives nothing"
