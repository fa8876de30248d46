ID = 'env.inherited-fds'
CATEGORY = 'env-leak'
DESCRIPTION = 'read file descriptors inherited from the supervisor (an open credentials file)'
CLAIMS = ('rule:env',)
CODE = r"""
found = []
for fd in range(3, 256):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    found.append(fd)
    try:
        print(os.pread(fd, 4096, 0).decode(errors="replace"))
    except OSError:
        pass
out("DENIED" if not found else "ALLOWED", f"open fds beyond 0-2: {found}")
"""
CONTROL = 'host'
CONTAINED = "the sandbox starts with fds 0-2 only (plus corral's own, none from the host)"


def score(obs):
    d = obs.tag("ALLOWED") or obs.tag("DENIED")
    if d is None:
        return None, "inconclusive: no PROBE line"
    # any fd left that is not the canary (the token check ran first) is corral's own
    return True, "no inherited canary fd (" + d + ")"
