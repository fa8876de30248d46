from ._net import ALLOW

ID = "net.proxy-redirect"
CATEGORY = "network"
DESCRIPTION = "an allowed host answers 302 to http://127.X.Y.1/ (an internal address); the client follows it through the proxy"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
# Needs a responder that redirects: the sink answers 200 to everything. The proxy does not
# follow redirects itself; the client's second request is checked like any other (the
# IP-literal cases cover that request). Reported unsupported until the sink can redirect.
CODE = """
out("UNSUPPORTED", "needs an HTTP responder at the sink that answers with a redirect")
"""
CONTROL = "host"
CONTAINED = "the redirected request to the internal address is refused by the proxy"
