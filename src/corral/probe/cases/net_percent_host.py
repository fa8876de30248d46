from ._net import PROXY, allow

ID = "net.percent-host"
CATEGORY = "network"
DESCRIPTION = "with *.probe.test allowed and evil.probe.test denied, ask for %65vil.probe.test (percent-encoded)"
CLAIMS = ("rule:network.mode",)
POLICY = allow("*.{DOMAIN}:{SINK_PORT}", deny=("evil.{DOMAIN}",))
CODE = PROXY + """
get(f"%65vil.{DOMAIN}:{SINK_PORT}")
"""
# the proxy refuses "%" in any host whatever the rules say, so the control is what a
# decoding parser would send: evil.probe.test itself, with the deny rule off
CONTROL = {"code": PROXY + 'get(f"evil.{DOMAIN}:{SINK_PORT}")\n', "where": "sandbox",
           "policy": {"network": {"deny": []}}}
CONTAINED = "the encoded name is refused (or decoded before the deny rule): the sink receives nothing"
