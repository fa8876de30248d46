ID = 'info.hostname'
CATEGORY = 'info'
DESCRIPTION = "the host's name (uname -n)"
CLAIMS = ('rule:isolation',)
CODE = r"""
out("INFO", os.uname().nodename)
"""
CONTROL = 'host'
CONTAINED = 'the sandbox sees a hostname of its own'


import socket


def score(obs):
    seen = obs.tag("INFO")
    if seen is None:
        return None, "inconclusive: no PROBE line"
    if seen == socket.gethostname():
        return False, f"the host's name {seen!r}"
    return True, f"hostname {seen!r}, not the host's"
