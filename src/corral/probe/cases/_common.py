"""Scorers shared by several cases (not a case: the loader skips files starting with _)."""


def killed_at_limit(obs, limit_s, what):
    """A run that must end at a wall-clock or CPU limit well before it finishes by itself."""
    if obs.tag("ALLOWED") is not None:
        return False, f"{what} ran to its end: {obs.tag('ALLOWED')}"
    if obs.result is None:
        return None, "inconclusive: no Result"
    wall = obs.result["usage"]["wall_s"]
    if obs.verdict == "timeout" and wall < limit_s + 1.5:
        kinds = sorted({e.get("limit") for e in obs.events if e.get("kind") == "limit"})
        return True, f"verdict timeout ({', '.join(filter(None, kinds)) or 'no event'}) after {wall:.2f}s"
    return False, f"verdict {obs.verdict} after {wall:.2f}s"


def bounded(obs, cap, unit):
    """The code printed DENIED '<n> <unit>: <errno>' and n stayed near the cap."""
    if obs.tag("ALLOWED") is not None:
        return False, obs.tag("ALLOWED")
    d = obs.tag("DENIED")
    if d is None:
        if obs.verdict in ("oom", "killed", "timeout"):
            return True, f"the run was stopped: verdict {obs.verdict}"
        return None, "inconclusive: no PROBE line"
    n = int(d.split()[0])
    if n <= cap:
        return True, f"stopped at {d}"
    return False, f"got to {n} {unit}, past the {cap} the policy sets: {d}"


def write_back(path):
    """CODE for the kernel-helper cases: write a root-only file (core_pattern, modprobe,
    uevent_helper) with its own current value, nothing else; ALLOWED if the write took."""
    return f"""
p = {path!r}
if ON_HOST and not os.path.exists(p):
    out("UNSUPPORTED", f"{{p}} does not exist in this kernel")
    sys.exit(0)
if ON_HOST and os.geteuid() != 0:
    out("UNSUPPORTED", "the host control needs root")
    sys.exit(0)
try:
    with open(p, "rb") as f:
        cur = f.read()
except OSError as e:
    out("DENIED", f"read {{p}}: {{ename(e)}}")
    sys.exit(0)
try:
    with open(p, "wb") as f:
        f.write(cur)                      # its own current value, nothing else
    out("ALLOWED", f"wrote {{p}} (its own value back)")
except OSError as e:
    out("DENIED", f"write {{p}}: {{ename(e)}}")
"""
