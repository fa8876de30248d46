from ._net import HASH, h, host_file

ID = "info.mounts"
CATEGORY = "info"
DESCRIPTION = "read /proc/self/mountinfo: the host's mount table (devices, paths, other sandboxes' mounts)"
CLAIMS = ("rule:isolation",)
# a mount is the host's when its mount point, type and source are those of one in the host's
# table; a few (/proc) may match by chance, so it takes more than half of the host's mounts
KEY = """
def key(row):   # mount point, fs type, source
    left, _, right = row.partition(b" - ")
    return left.split()[4] + b" " + b" ".join(right.split()[:2])
"""
CODE = HASH + KEY + """
try:
    rows = open("/proc/self/mountinfo", "rb").read().splitlines()
    out("SEEN", " ".join(h(key(r)) for r in rows))
except OSError as e:
    out("DENIED", f"mountinfo: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "the sandbox's mount table holds none of the host's mounts"


def score(obs):
    seen = obs.tag("SEEN")
    if seen is None:
        d = obs.tag("DENIED")
        return (True, d) if d is not None else (None, "inconclusive: no PROBE line")
    rows = (host_file("/proc/self/mountinfo") or b"").splitlines()
    scope = {}
    exec(KEY, scope)
    host = {h(scope["key"](r)) for r in rows}
    shared = host & set(seen.split())
    if len(shared) * 2 > len(host):
        return False, f"the sandbox sees {len(shared)} of the host's {len(host)} mounts"
    return True, f"{len(shared)} of the host's {len(host)} mounts visible"
