"""A token's ceiling: a policy its sandboxes cannot exceed. Pure: two Policy objects in,
the first rule the request loosens out (or None).

"Exceeds" per rule kind, each a loosening the agent holding the token must not get:

- isolation: a weaker tier than the ceiling's (microvm > gvisor = wasm > namespace >
  process, policy/narrow.py's table, as for a batch job's override; "auto" counts as the
  weakest tier it may pick, process); a wasm ceiling admits wasm only (every other tier
  runs native code);
- network: a mode, an allow rule, a private range, a nameserver, an upstream CA or a bigger
  budget the ceiling does not grant (an allow rule is granted when one ceiling rule covers
  every host and port it matches); the ceiling's deny rules are added to every sandbox by
  the service (`narrow`), so they need no check here;
- secrets: a name the ceiling does not grant, a host outside the ceiling's hosts for it, a
  longer TTL, plain http the ceiling does not allow;
- filesystem: a workspace (or a path, mode or read-only bind) outside the ceiling's: the
  requested path must be the ceiling's or below it, mode ro < review < rw;
- env.pass: a host variable the ceiling does not pass;
- limits: any limit above the ceiling's (an idle_timeout of 0, never, is above any other);
- image and install: another root than the ceiling's "host" choice allows, an install phase
  or package index the ceiling does not have, a package the ceiling does not list (as
  written there: "requests" is not "requests==2.32.3"), a name let past the typosquat
  check that the ceiling does not let past;
- audit: the syscall audit off when the ceiling turns it on (a request that leaves it out
  takes the ceiling's).
"""

from __future__ import annotations

import os

from ..policy.narrow import CODE_ONLY
from ..policy.narrow import TIER_RANK as _STRENGTH
from ..policy.rules import DEFAULT_PORTS, parse_cidr, parse_rule

#: how strong each tier is (policy/narrow.py's table: one order for ceilings and batch
#: overrides); "auto" may pick any, so it counts as the weakest
TIER_RANK = {**_STRENGTH, "auto": _STRENGTH["process"]}
MODE_RANK = {"ro": 0, "review": 1, "rw": 2}


class Exceeds(Exception):
    """The request asks for more than the ceiling allows: `field` names the rule."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def check(request, ceiling) -> None:
    """Raise Exceeds naming the first rule of `request` (a Policy) that `ceiling` (a
    Policy) does not allow; return None when the request stays within it."""
    _isolation(request, ceiling)
    _limits(request, ceiling)
    _network(request.network, ceiling.network)
    _secrets(request, ceiling)
    _filesystem(request.filesystem, ceiling.filesystem)
    for name in request.env.pass_:
        if name not in ceiling.env.pass_:
            raise Exceeds("env.pass", f"passing the host variable {name} is not within "
                          "this token's ceiling")
    _image(request, ceiling)
    if ceiling.audit.syscalls and not request.audit.syscalls:
        raise Exceeds("audit.syscalls", "turning off the syscall audit (refused syscalls "
                      "recorded as events) is not within this token's ceiling: leave "
                      "audit.syscalls out or true")


def requested(raw: dict, ceiling_data: dict):
    """The policy a request (`raw`, a dict in the TOML layout) asks for, checked against a
    ceiling (`ceiling_data`, the same layout): the ceiling's isolation, image and limits
    (and audit) where the request leaves them out; each secret names hosts (and a ttl) only, its source
    the ceiling's; the ceiling's deny rules added. PolicyError for a bad request, Exceeds
    for one beyond the ceiling."""
    from ..errors import PolicyError
    from ..policy.load import merge, policy_from_dict

    if not isinstance(raw, dict):
        raise PolicyError("a policy is a table (JSON object) of sections", field="policy")
    ceiling = policy_from_dict(ceiling_data, allow_literal=False)
    base = {k: ceiling_data[k] for k in ("isolation", "limits", "image", "audit")
            if k in ceiling_data}
    data = merge(base, raw) if base else dict(raw)
    secrets = data.get("secrets")
    if secrets is not None:
        if not isinstance(secrets, dict):
            raise PolicyError("[secrets] must be a table of secret names", field="secrets")
        own = {s.name: s for s in ceiling.secrets}
        filled = {}
        for name, table in secrets.items():
            if isinstance(table, dict) and ({"from", "value"} & set(table)):
                raise PolicyError("a secret's source and value are the server's: name the "
                                  "secret and its hosts only", field=f"secrets.{name}")
            if name not in own:
                raise Exceeds(f"secrets.{name}", f"the secret {name} is not within this "
                              "token's ceiling")
            filled[name] = {**(table if isinstance(table, dict) else {}),
                            "from": own[name].source}
        data["secrets"] = filled
    host_paths(data, ceiling)
    policy = policy_from_dict(data, allow_literal=False)
    check(policy, ceiling)
    return narrow(policy, ceiling)


def _raw_path(raw) -> str | None:
    """A path the loader would look up on the host, or None for a value it refuses by its
    text alone (not a string, relative, NUL, newline, '..'): those answers tell nothing."""
    if not isinstance(raw, str) or not raw.startswith("/") or "\0" in raw or "\n" in raw \
            or ".." in raw.split("/"):
        return None
    return os.path.normpath(raw)


def host_paths(data: dict, ceiling) -> None:
    """Every host path the request (`data`, the TOML layout, unvalidated) names, checked
    against the ceiling (a Policy) by its text, before the loader looks at the host: its
    answers (does not exist, not a directory, a system tree, a link) would tell the token
    holder what is there. Exceeds for a path outside the ceiling's; a path below one the
    ceiling grants is walked with lstat from there, and a symbolic link on the way is
    refused before anything follows it (the loader's realpath would, out of the grant)."""

    def table(name):
        t = data.get(name)
        return t if isinstance(t, dict) else {}

    fs = table("filesystem")
    ws = fs.get("workspace")
    if ws is not None:
        raw = ws.get("path") if isinstance(ws, dict) else ws
        if ceiling.filesystem.workspace is None:
            raise Exceeds("filesystem.workspace", "a workspace is not within this token's "
                          "ceiling")
        path, top = _raw_path(raw), ceiling.filesystem.workspace.path
        if path is not None:
            if not _below(path, top):
                raise Exceeds("filesystem.workspace.path", f"{raw} is not the ceiling's "
                              f"workspace ({top}) or below it")
            _no_link(path, top, raw, "filesystem.workspace.path")
    binds = fs.get("ro_binds")
    if isinstance(binds, (list, tuple)):
        for i, raw in enumerate(binds):
            path = _raw_path(raw)
            if path is None:
                continue
            top = next((c for c in ceiling.filesystem.ro_binds if _below(path, c)), None)
            if top is None:
                raise Exceeds("filesystem.ro_binds", f"showing the host's {raw} is not "
                              "within this token's ceiling")
            _no_link(path, top, raw, f"filesystem.ro_binds[{i}]")
    for section, key, granted in (
            ("network", "upstream_ca", ceiling.network.upstream_ca),
            ("install", "requirements", ceiling.install.requirements)):
        raw = table(section).get(key)
        path = _raw_path(raw)
        if path is not None and path != granted:
            what = ("an upstream CA file" if key == "upstream_ca" else
                    "a requirements file on the host")
            raise Exceeds(f"{section}.{key}", f"{what} is not within this token's "
                          "ceiling" + (f" (it grants {granted} only)" if granted else ""))


def _no_link(path: str, top: str, raw: str, field: str) -> None:
    """Walk from `top` (a granted, resolved path) down to `path` with lstat: a symbolic
    link on the way is refused by name, never followed; a missing or non-directory
    component ends the walk (the loader says so: that is inside the grant)."""
    import stat

    from ..errors import PolicyError

    cur = top.rstrip("/")
    for name in path[len(cur):].split("/"):
        if not name:
            continue
        cur += "/" + name
        try:
            st = os.lstat(cur)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise PolicyError(f"{raw!r} has a symbolic link in it ({cur}), and corral follows "
                        "none; name the real path", field=field)


def narrow(request, ceiling):
    """The policy the service runs: the request with the ceiling's deny rules added (deny
    only narrows, and wins over allow)."""
    extra = tuple(d for d in ceiling.network.deny if d not in request.network.deny)
    if not extra:
        return request
    return request.replace(network=request.network.replace(deny=request.network.deny + extra))


def _isolation(request, ceiling) -> None:
    want, most = request.isolation, ceiling.isolation
    if most in CODE_ONLY and want != most:
        # no tier is "stronger" than wasm here: any other runs native programs, shells and
        # subprocesses, which a wasm ceiling never grants
        raise Exceeds("isolation", f"tier {want!r} runs native code; this token's ceiling "
                      f"({most!r}) runs only {most} modules: ask for {most!r}")
    # a tier of neither table (none: policies are validated) is refused, never admitted
    if TIER_RANK.get(want, -1) < TIER_RANK.get(most, max(TIER_RANK.values()) + 1):
        raise Exceeds("isolation", f"tier {want!r} is weaker than this token's ceiling "
                      f"({most!r}); ask for {most!r} or a stronger tier")


def _limits(request, ceiling) -> None:
    for name in _fields(request.limits):
        mine, most = getattr(request.limits, name), getattr(ceiling.limits, name)
        if name == "idle_timeout" and most and not mine:
            # 0 is "never ends for idleness": the loosest value, not the smallest
            raise Exceeds(f"limits.{name}", f"0 (never) is above this token's ceiling of "
                          f"{most}")
        if mine > most and not (name == "idle_timeout" and not most):
            raise Exceeds(f"limits.{name}", f"{mine} is above this token's ceiling of {most}")


def _fields(record) -> tuple[str, ...]:
    return type(record)._fields


def _network(req, ceil) -> None:
    if req.mode == "allow" and ceil.mode != "allow":
        raise Exceeds("network.mode", "network access is not within this token's ceiling "
                      "(its network.mode is \"none\")")
    granted = [parse_rule(t, "ceiling.network.allow") for t in ceil.allow]
    for text in req.allow:
        rule = parse_rule(text, "network.allow")
        if not any(_covers(g, rule) for g in granted):
            raise Exceeds("network.allow", f"{text!r} is not within this token's ceiling "
                          f"(it allows {', '.join(ceil.allow) or 'no host'})")
    nets = [parse_cidr(t, "ceiling.network.allow_private") for t in ceil.allow_private]
    for text in req.allow_private:
        net = parse_cidr(text, "network.allow_private")
        if not any(net.version == n.version and net.subnet_of(n) for n in nets):
            raise Exceeds("network.allow_private", f"the private range {text} is not within "
                          "this token's ceiling")
    for ns in req.nameservers:
        if ns not in ceil.nameservers:
            raise Exceeds("network.nameservers", f"the resolver {ns} is not within this "
                          "token's ceiling (leave nameservers unset for the host's)")
    if req.upstream_ca is not None and req.upstream_ca != ceil.upstream_ca:
        raise Exceeds("network.upstream_ca", "an upstream CA file is not within this "
                      "token's ceiling")
    for name in _fields(req.budget):
        mine, most = getattr(req.budget, name), getattr(ceil.budget, name)
        if mine > most:
            raise Exceeds(f"network.budget.{name}", f"{mine} is above this token's ceiling "
                          f"of {most}")


def _ports(rule) -> tuple[int, ...] | None:
    return rule.ports if rule.ports is not None else DEFAULT_PORTS


def _covers(granted, rule) -> bool:
    """Whether every (host, port) `rule` matches, `granted` matches too."""
    gp = _ports(granted)
    if not all(p in gp for p in _ports(rule)):
        return False
    if granted.kind == "net":
        return rule.kind == "net" and rule.net.version == granted.net.version and \
            rule.net.subnet_of(granted.net)
    if rule.kind == "net":
        return False
    if granted.kind == "host":
        return rule.kind == "host" and rule.name == granted.name
    # granted "*.suffix": names strictly below suffix
    if rule.kind == "host":
        return granted.matches_name(rule.name)
    return rule.name == granted.name or granted.matches_name(rule.name)


def _secrets(request, ceiling) -> None:
    granted = {s.name: s for s in ceiling.secrets}
    for s in request.secrets:
        g = granted.get(s.name)
        if g is None:
            raise Exceeds(f"secrets.{s.name}", f"the secret {s.name} is not within this "
                          "token's ceiling")
        rules = [parse_rule(h, f"ceiling.secrets.{s.name}.hosts") for h in g.hosts]
        for h in s.hosts:
            rule = parse_rule(h, f"secrets.{s.name}.hosts")
            if not any(_covers(r, rule) for r in rules):
                raise Exceeds(f"secrets.{s.name}.hosts", f"sending {s.name} to {h!r} is not "
                              "within this token's ceiling")
        if s.ttl > g.ttl:
            raise Exceeds(f"secrets.{s.name}.ttl", f"{s.ttl}s is above this token's ceiling "
                          f"of {g.ttl}s")
        if s.plain_http and not g.plain_http:
            raise Exceeds(f"secrets.{s.name}.plain_http", "sending the secret over plain "
                          "http is not within this token's ceiling")


def _below(path: str, top: str) -> bool:
    path, top = os.path.normpath(path), os.path.normpath(top)
    return path == top or path.startswith(top.rstrip("/") + "/")


def _filesystem(req, ceil) -> None:
    ws, most = req.workspace, ceil.workspace
    if ws is not None:
        if most is None:
            raise Exceeds("filesystem.workspace", "a workspace is not within this token's "
                          "ceiling")
        if not _below(ws.path, most.path):
            raise Exceeds("filesystem.workspace.path", f"{ws.path} is not the ceiling's "
                          f"workspace ({most.path}) or below it")
        if MODE_RANK[ws.mode] > MODE_RANK[most.mode]:
            raise Exceeds("filesystem.workspace.mode", f"mode {ws.mode!r} is looser than "
                          f"this token's ceiling ({most.mode!r})")
    for p in req.ro_binds:
        if not any(_below(p, c) for c in ceil.ro_binds):
            raise Exceeds("filesystem.ro_binds", f"showing the host's {p} is not within "
                          "this token's ceiling")


def _image(request, ceiling) -> None:
    if request.image != ceiling.image and ceiling.image != "host":
        raise Exceeds("image", f"image {request.image!r} is not this token's ceiling's "
                      f"({ceiling.image!r})")
    ri, ci = request.install, ceiling.install
    if ri.requested():
        if not ci.requested():
            raise Exceeds("install", "an install phase (it reaches package indexes) is not "
                          "within this token's ceiling")
        if tuple(ri.index_urls) != tuple(ci.index_urls) and not set(ri.index_urls) <= set(
                ci.index_urls):
            raise Exceeds("install.index_urls", "a package index is not within this "
                          "token's ceiling")
        if ri.requirements is not None and ri.requirements != ci.requirements:
            raise Exceeds("install.requirements", "a requirements file on the host is not "
                          "within this token's ceiling")
        for i, pkg in enumerate(ri.packages):
            if pkg not in ci.packages:
                raise Exceeds("install.packages", f"the package {pkg[:80]!r} is not "
                              "within this token's ceiling; ask for one it lists, as "
                              f"written there: {', '.join(ci.packages) or 'none'}")
        for name in ri.allow_names:
            if name not in ci.allow_names:
                raise Exceeds("install.allow_names", f"letting {name[:80]!r} past the "
                              "typosquat check is not within this token's ceiling")
        if ri.timeout > ci.timeout:
            raise Exceeds("install.timeout", f"{ri.timeout}s is above this token's ceiling "
                          f"of {ci.timeout}s")

