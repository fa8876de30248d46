import socket

from ._net import HASH, h

ID = "info.interfaces"
CATEGORY = "info"
DESCRIPTION = "list the network interfaces (/proc/net/dev): the host's NICs, bridges and VPNs"
CLAIMS = ("network_namespace",)
NAMES = """
def names(text):
    return sorted(x.split(":")[0].strip() for x in text.splitlines()[2:] if ":" in x)
"""
CODE = HASH + NAMES + """
try:
    seen = [n for n in names(open("/proc/net/dev").read()) if n != "lo"]
    out("SEEN", " ".join(h(n) for n in seen) or "-")
except OSError as e:
    out("DENIED", f"/proc/net/dev: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "the sandbox sees no interface of the host's but loopback"


def score(obs):
    seen = obs.tag("SEEN")
    if seen is None:
        d = obs.tag("DENIED")
        return (True, d) if d is not None else (None, "inconclusive: no PROBE line")
    host = {h(n) for _, n in socket.if_nameindex() if n != "lo"}
    shared = host & set(seen.split())
    if shared:
        return False, f"the sandbox sees {len(shared)} of the host's {len(host)} interfaces"
    return True, f"none of the host's {len(host)} interfaces (saw {len(seen.split()) if seen != '-' else 0} of its own)"
