from ._net import ALLOW, PROXY

ID = "dns.proxy-connect"
CATEGORY = "dns"
DESCRIPTION = "CONNECT <data>.probe.test (not allowed): does the proxy resolve the name before refusing?"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
t = f"{DATA}.c.{DOMAIN}:{SINK_PORT}"
line = proxy_send(f"CONNECT {t} HTTP/1.1\\r\\nHost: {t}\\r\\n\\r\\n".encode())
out("DENIED", f"CONNECT <data>.c.{DOMAIN}: {line}; whether it resolved is seen in the DNS log")
"""
CONTROL = {"policy": {"network": {"allow": ["*.{DOMAIN}:{SINK_PORT}"]}}}
CONTAINED = "the proxy refuses before any DNS query: the DNS log holds no query with the data"
