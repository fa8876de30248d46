"""Learn mode: run a command under a permissive policy that still keeps every host secret
out, record what it needed, and write the least-privilege policy that would have let that
run succeed (docs/audit.md, "Learn mode").

    sb = corral.Sandbox(policy, learn=True)      # or Sandbox.create(..., learn=True)
    sb.exec(["make", "test"])
    print(sb.learned_policy(margin=1.5))         # TOML that `corral run --policy` loads

What the learn run is (learn_policy): the policy asked for, with

- no credentials: a policy with secrets or env.pass is refused (no host variable, no
  grant; HOME is the fresh /scratch as in every run);
- the network open to every *public* host at any port: the egress proxy in learn mode
  (egress.config.NetConfig.learn, which only this path sets: no policy key reaches it).
  Deny rules, the metadata names and the address guard still refuse (a private, loopback,
  link-local or metadata address needs network.allow_private, as in any run);
- the workspace, if any, in review mode: every write lands in an overlay and is listed
  afterwards (the host directory is never written); a written workspace is learned as
  "rw", an untouched one as "ro". The rest of the root is read-only in a learn run as in
  every run, so the only place a policy can grant writes (the workspace) is the only one
  to observe; a write elsewhere fails in the learn run just as it would under the
  learned policy;
- limits not set explicitly raised (LEARN_LIMITS), so the command shows what it needs.

What is learned (Learner): the hosts and ports the proxy let through (one allow rule per
host, exactly the ports used), what it refused, peak memory, wall and CPU time, whether the
workspace was written, and, where the tier observes them (a live sandbox of the namespace
tier, which `corral learn` uses there, or the process tier: linux/seccomp_notify.py), the
syscalls the seccomp
profile refused, listed in the policy's comments (no policy key allows one: the command did
without, or failed for want of it). The learned limits are the observation times the margin
(1.5 by default), never below FLOORS. Not observed (stated in the policy's comments): peak
pids (cgroup v1 keeps no peak), and refused syscalls on gvisor (docs/audit.md).
"""

from __future__ import annotations

import math

from ..errors import PolicyError
from ..policy import Policy

MiB = 1 << 20
GiB = 1 << 30

#: the default margin: learned limits are the observed use times this
MARGIN = 1.5

#: learned limits never go below these (a run's start-up costs vary with the machine's load)
FLOORS = {"memory": 32 * MiB, "timeout": 5.0, "cpu_time": 5.0}

#: the limits of a learn run, where the policy did not set its own
LEARN_LIMITS = {"timeout": 600.0, "cpu_time": 600.0, "memory": 2 * GiB, "pids": 1024}


def learn_policy(policy: Policy) -> Policy:
    """The policy a learn run runs under (module docstring). Raises PolicyError for a
    policy that would bring a host secret in."""
    if policy.secrets:
        raise PolicyError("learn mode keeps every credential out of the sandbox: drop the "
                          "secret grants (add them to the learned policy afterwards)",
                          field="secrets")
    if policy.env.pass_:
        raise PolicyError("learn mode passes no host environment variable: drop env.pass "
                          "(use env.set for values that are not secrets)", field="env.pass")
    explicit = set(policy.explicit)
    lim = policy.limits.replace(**{k: v for k, v in LEARN_LIMITS.items()
                                   if f"limits.{k}" not in explicit})
    fs = policy.filesystem
    ws = fs.workspace
    if ws is not None and ws.mode != "review":
        fs = fs.replace(workspace=ws.replace(mode="review"))
    net = policy.network.replace(mode="allow")
    explicit.add("network.mode")
    return policy.replace(limits=lim, filesystem=fs, network=net, explicit=frozenset(explicit))


class Learner:
    """What the commands of one learn sandbox did (add each Result), and the policy that
    follows from it."""

    def __init__(self, asked: Policy) -> None:
        self.asked = asked                       # the policy as given (before learn_policy)
        self.hosts: dict[tuple[str, int], list[int]] = {}   # (host, port) -> [conns, in, out]
        self.refused: dict[tuple[str, int, str], int] = {}  # (host, port, reason) -> count
        self.wall_s = 0.0
        self.cpu_s: float | None = None
        self.memory_peak: int | None = None
        self.verdicts: list[str] = []
        self.changes: list[tuple[str, str]] = []  # (kind, path) in the workspace
        self.isolation = asked.isolation
        #: name -> [count, errno name]; None while the tier does not observe them
        self.syscalls: dict[str, list] | None = None

    def observing_syscalls(self) -> None:
        """The sandbox observes refused syscalls (runtime/live.py): list them."""
        if self.syscalls is None:
            self.syscalls = {}

    def add(self, result) -> None:
        self.verdicts.append(result.verdict)
        self.isolation = result.isolation or self.isolation
        u = result.usage
        self.wall_s = max(self.wall_s, u.wall_s or 0.0)
        if u.cpu_s is not None:
            self.cpu_s = max(self.cpu_s or 0.0, u.cpu_s)
        if u.memory_peak_bytes is not None:
            self.memory_peak = max(self.memory_peak or 0, u.memory_peak_bytes)
        for e in result.events:
            if e.get("kind") == "syscall" and self.syscalls is not None:
                seen = self.syscalls.setdefault(str(e.get("name", "")),
                                                [0, str(e.get("errno", ""))])
                seen[0] += int(e.get("count") or 0)
                continue
            if e.get("kind") != "net":
                continue
            host, port = str(e.get("host", "")), int(e.get("port") or 0)
            if e.get("decision") == "allow":
                seen = self.hosts.setdefault((host, port), [0, 0, 0])
                seen[0] += 1
                seen[1] += int(e.get("bytes_in") or 0)
                seen[2] += int(e.get("bytes_out") or 0)
            else:
                key = (host, port, str(e.get("reason", "")))
                self.refused[key] = self.refused.get(key, 0) + 1

    def add_changes(self, changes) -> None:
        self.changes = [(c.kind, c.path) for c in changes]

    # --- what was seen, and the policy ------------------------------------------------

    def observed(self) -> dict:
        return {
            "commands": len(self.verdicts), "verdicts": list(self.verdicts),
            "isolation": self.isolation,
            "hosts": [{"host": h, "port": p, "connections": c, "bytes_in": i, "bytes_out": o}
                      for (h, p), (c, i, o) in sorted(self.hosts.items())],
            "refused": [{"host": h, "port": p, "reason": r, "count": n}
                        for (h, p, r), n in sorted(self.refused.items())],
            "wall_s": round(self.wall_s, 3),
            "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 3),
            "memory_peak_bytes": self.memory_peak,
            "pids_peak": None,
            "workspace_changes": [{"kind": k, "path": p} for k, p in self.changes],
            "syscalls_refused": None if self.syscalls is None else [
                {"name": n, "errno": e, "count": c} for n, (c, e) in self._syscalls()],
        }

    def _syscalls(self) -> list[tuple[str, list]]:
        return sorted((self.syscalls or {}).items(), key=lambda t: (-t[1][0], t[0]))

    def limits(self, margin: float) -> dict[str, tuple[float | int, str]]:
        """limit -> (value, the comment saying where it came from)."""
        out: dict[str, tuple[float | int, str]] = {}
        if self.memory_peak is not None:
            v = max(_ceil_to(self.memory_peak * margin, MiB), FLOORS["memory"])
            out["memory"] = (v, f"peak memory {self.memory_peak / MiB:.1f}M x {margin:g}"
                                f"{_floor_note(v, FLOORS['memory'], _size)}")
        t = max(math.ceil(self.wall_s * margin), FLOORS["timeout"])
        out["timeout"] = (t, f"wall time {self.wall_s:.2f}s x {margin:g}"
                             f"{_floor_note(t, FLOORS['timeout'], _secs)}")
        if self.cpu_s is not None:
            c = max(math.ceil(self.cpu_s * margin), FLOORS["cpu_time"])
            out["cpu_time"] = (c, f"CPU time {self.cpu_s:.2f}s x {margin:g}"
                                  f"{_floor_note(c, FLOORS['cpu_time'], _secs)}")
        return out

    def policy_toml(self, margin: float = MARGIN) -> str:
        """The least-privilege policy for what was observed, each rule with a comment
        saying which observation produced it. Checked by loading it back."""
        if not (isinstance(margin, (int, float)) and 1.0 <= margin <= 100):
            raise PolicyError(f"margin {margin!r} is not a number from 1 to 100; write "
                              f"1.5 for 50% headroom", field="margin")
        a = self.asked
        ok = bool(self.verdicts) and all(v == "ok" for v in self.verdicts)
        lines = ["# corral policy learned by `corral learn` from "
                 f"{len(self.verdicts)} command(s): {', '.join(self.verdicts) or 'none'}",
                 f"# limits are the observed use x {margin:g} (at least "
                 f"{_size(FLOORS['memory'])} of memory, {_secs(FLOORS['timeout'])} of wall "
                 f"and CPU time); everything not written here is corral's default"]
        if not ok:
            lines.append("# WARNING: the learn run did not succeed: this policy may not "
                         "let the command succeed either")
        lines += ["", "# the tier the learn run used",
                  f"isolation = {_q(self.isolation)}"]
        if a.image != "host":
            lines += ["# the image the learn run used", f"image = {_q(a.image)}"]
        lines += ["", "[limits]"]
        for key, (value, why) in self.limits(margin).items():
            text = _q(_size(value)) if key == "memory" else _q(_secs(value))
            lines += [f"# {why}", f"{key} = {text}"]
        for key in ("cpus", "scratch", "output", "open_files", "file_size", "scratch_inodes"):
            if f"limits.{key}" in a.explicit:
                lines += ["# as the learn run was given it",
                          f"{key} = {_limit_text(key, getattr(a.limits, key))}"]
        lines.append("# pids: not measured (the cgroups here keep no peak of processes): "
                     "corral's default applies")
        lines += ["", "[network]"]
        if not self.hosts:
            lines += ["# no connection was made (the proxy saw none): the network stays "
                      "closed", 'mode = "none"']
        else:
            lines += [f"# the proxy let {len(self.hosts)} host:port(s) through", 'mode = "allow"',
                      "allow = ["]
            for (host, port), (conns, b_in, b_out) in sorted(self.hosts.items()):
                lines.append(f"    {_q(_rule(host, port))},   # {conns} connection(s), "
                             f"{b_in} bytes in, {b_out} out")
            lines.append("]")
            if a.network.deny:
                lines += ["# as the learn run was given them",
                          f"deny = {_list(a.network.deny)}"]
            if a.network.allow_private:
                lines += ["# as the learn run was given them: private addresses the hosts "
                          "above may resolve to", f"allow_private = {_list(a.network.allow_private)}"]
            if a.network.nameservers:
                lines += ["# the resolvers the learn run's proxy asked",
                          f"nameservers = {_list(a.network.nameservers)}"]
        for (host, port, reason), n in sorted(self.refused.items()):
            lines.append(f"# refused in the learn run too, not allowed here: {host}:{port} "
                         f"({n}x: {_one_line(reason)})")
        ws = a.filesystem.workspace
        if ws is not None or a.filesystem.ro_binds:
            lines += ["", "[filesystem]"]
        if ws is not None:
            if ws.mode == "review":
                mode, why = "review", "review mode, as the learn run was given it"
            elif self.changes:
                mode, why = "rw", (f"the command wrote {len(self.changes)} path(s) in the "
                                   f"workspace (first: {_one_line(self.changes[0][1])})")
            else:
                mode, why = "ro", "the command wrote nothing in the workspace"
            table = f"{{ path = {_q(ws.path)}, mode = {_q(mode)}"
            if ws.mount_at == "same":
                table += ', mount_at = "same"'
            lines += [f"# {why}", f"workspace = {table} }}"]
        if a.filesystem.ro_binds:
            lines += ["# as the learn run was given them", f"ro_binds = {_list(a.filesystem.ro_binds)}"]
        if a.env.set:
            lines += ["", "[env]", "# as the learn run was given them",
                      "set = { " + ", ".join(f"{k} = {_q(v)}" for k, v in a.env.set) + " }"]
        lines.append("")
        if self.syscalls is None:
            lines.append("# not observed: syscalls refused by the seccomp profile (this tier "
                         "does not report them; docs/audit.md)")
        elif not self.syscalls:
            lines.append("# the seccomp profile refused no syscall in the learn run")
        else:
            lines.append("# syscalls the seccomp profile refused in the learn run (no policy "
                         "key allows one: the command did without them, or failed for want "
                         "of them):")
            lines += [f"#   {_one_line(n)}: {c}x {_one_line(e)}" for n, (c, e) in self._syscalls()]
        lines += ["# a write outside /scratch and the workspace fails in a learn run as it "
                  "would under this policy", "# (the root is read-only in both)"]
        text = "\n".join(lines) + "\n"
        _check_loads(text)
        return text


def _check_loads(text: str) -> None:
    import tomllib

    from ..policy import policy_from_dict

    try:
        policy_from_dict(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:     # a bug here, never the user's: say so
        raise PolicyError(f"the learned policy is not valid TOML ({e}); please report it",
                          field="learn") from None


def _rule(host: str, port: int) -> str:
    if ":" in host:                      # an IPv6 literal
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _q(text: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters as \\uXXXX,
    the rest as it is (UTF-8). A lone surrogate (an undecodable file name) cannot be
    written: PolicyError."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        elif 0xD800 <= ord(c) <= 0xDFFF:
            raise PolicyError(f"{text!r} is not valid UTF-8 and cannot be written to a "
                              f"policy file", field="learn")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _list(items) -> str:
    return "[" + ", ".join(_q(str(i)) for i in items) + "]"


def _one_line(text: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:200]


def _ceil_to(value: float, unit: int) -> int:
    return int(math.ceil(value / unit)) * unit


def _size(n: float) -> str:
    n = int(n)
    for unit, name in ((GiB, "G"), (MiB, "M"), (1 << 10, "K")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{name}"
    if n >= MiB:
        return f"{n / MiB:.1f}M".replace(".0M", "M")
    return str(n)


def _secs(s: float) -> str:
    return f"{s:g}s"


def _floor_note(value, floor, fmt) -> str:
    return f" (raised to the floor of {fmt(floor)})" if value == floor else ""


def _limit_text(key: str, value) -> str:
    return str(int(value)) if key != "cpus" else f"{value:g}"


__all__ = ["FLOORS", "LEARN_LIMITS", "MARGIN", "Learner", "learn_policy"]
