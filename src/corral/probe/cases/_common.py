"""Scorers shared by several cases (not a case: the loader skips files starting with _)."""


def killed_at_limit(obs, limit, what):
    """A run that must be ended by `limit` ("timeout" or "cpu_time") before its bounded
    work (BOUND_S seconds of it, several times the limit) finishes by itself. Judged by
    order, not by time: the work printed nothing when it finished (no ALLOWED), the
    verdict is timeout and the limit's own event says which limit ended it. How long the
    kill took is reported, never judged (a slower machine kills more slowly)."""
    if obs.tag("ALLOWED") is not None:
        return False, f"{what} ran to its end: {obs.tag('ALLOWED')}"
    if obs.result is None:
        return None, "inconclusive: no Result"
    wall = obs.result["usage"]["wall_s"]
    kinds = sorted(filter(None, {e.get("limit") for e in obs.events if e.get("kind") == "limit"}))
    if obs.verdict == "timeout" and limit in kinds:
        return True, f"verdict timeout ({', '.join(kinds)}) after {wall:.2f}s"
    return False, f"verdict {obs.verdict} ({', '.join(kinds) or 'no limit event'}) after {wall:.2f}s"


#: how long the bounded work of the wall-clock and CPU-time cases runs when nothing stops
#: it: ten times their 0.5 s limits, so a kill that lands late on a slow or busy machine
#: still lands first (each control runs this long)
BOUND_S = 5


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


def _paths_code(paths) -> str:
    """A loop over paths, $SCRATCH and $TMP ($TMPDIR or /tmp) filled in inside the sandbox."""
    return (f"for p in {list(paths)!r}:\n"
            '    p = p.replace("$SCRATCH", SCRATCH).replace("$TMP", os.environ.get("TMPDIR", "/tmp"))\n')


def plant(paths) -> str:
    """CODE for the persistence cases: append a line to each path (made if need be)."""
    return "\n" + _paths_code(paths) + """    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "a") as f:
            f.write("planted by run 1\\n")
    except OSError as e:
        print("could not plant", p, ename(e))
"""


def planted(paths) -> str:
    """SECOND for the persistence cases: ALLOWED if a later run still sees any of them."""
    return "\nfound = []\n" + _paths_code(paths) + """    if os.path.exists(p):
        found.append(p)
out("ALLOWED" if found else "DENIED", ("found " + " ".join(found)) if found else "the next run starts clean")
"""
