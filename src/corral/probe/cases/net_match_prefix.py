from ._net import ALLOW, PROXY

ID = "net.match-prefix"
CATEGORY = "network"
DESCRIPTION = "with sink.probe.test allowed, ask for evilsink.probe.test and evil-sink.probe.test (the allowed name as a suffix)"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
get(f"evilsink.{DOMAIN}:{SINK_PORT}")
get(f"evil-sink.{DOMAIN}:{SINK_PORT}")
"""
CONTROL = {"policy": {"network": {"allow": ["*.{DOMAIN}:{SINK_PORT}"]}}}
CONTAINED = "neither name matches the rule: both are refused and the sink receives nothing"
