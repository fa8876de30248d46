"""Policy -> Plan: a neutral list of setup operations, one per rule. Pure, no I/O.

Like bubblewrap's SetupOp list: each op names the policy rule it enforces (`rule`, a dotted
key path, or "" for corral's fixed hardening), so a tier that cannot perform an op can say,
before anything runs, which rule it cannot enforce. `corral explain` and `corral run` read
the same plan.
"""

from __future__ import annotations

from ._record import Record
from .policy import Policy

#: host paths that make up the read-only root (each bound if it is a directory, recreated
#: as the same symlink if it is one, skipped if absent)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: the parts of the host's /etc a normal program needs; everything else of /etc (users,
#: shadow, ssh keys, sudoers, machine-id, ...) stays hidden
ETC_BINDS = ("/etc/alternatives", "/etc/ssl", "/etc/ca-certificates", "/etc/ld.so.cache",
             "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/mime.types",
             "/etc/protocols", "/etc/services", "/etc/os-release", "/etc/debian_version",
             "/etc/python3", "/etc/python3.11", "/etc/gitconfig", "/etc/inputrc")
PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
#: set in the sandbox when network.mode = "allow", before env.set (which may override them);
#: NO_PROXY and no_proxy too, from `no_proxy`
PROXY_ENV = (
    ("HTTP_PROXY", PROXY_URL), ("HTTPS_PROXY", PROXY_URL),
    ("http_proxy", PROXY_URL), ("https_proxy", PROXY_URL),
    ("PIP_PROXY", PROXY_URL), ("npm_config_proxy", PROXY_URL),
    ("npm_config_https_proxy", PROXY_URL), ("YARN_HTTP_PROXY", PROXY_URL),
    ("YARN_HTTPS_PROXY", PROXY_URL),
)
#: the sandbox's own loopback, which clients reach without the proxy (NO_PROXY) unless the
#: policy allows it: then it means the host's, which only the proxy can reach
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def no_proxy(cfg) -> str:
    """NO_PROXY for a sandbox whose proxy enforces `cfg` (egress NetConfig): the names of
    LOOPBACK_NAMES that no allow rule names, at any port (NO_PROXY has no ports for curl).
    Inside the sandbox nothing listens on loopback but what the command starts itself; a
    loopback host the policy allows is the host's, so its requests must go to the proxy."""
    from ipaddress import ip_address

    def allowed(name: str) -> bool:
        if name == "localhost":
            return any(r.matches_name(name) for r in cfg.allow)
        return any(r.matches_ip(ip_address(name)) for r in cfg.allow)

    return ",".join(n for n in LOOPBACK_NAMES if not allowed(n))


SCRATCH = "/scratch"
WORKSPACE = "/workspace"


class Op(Record):
    rule: str


class Namespaces(Op):
    """user, mount, pid, net, uts, ipc and cgroup namespaces; new session; no new
    privileges; every capability dropped; sandbox root mapped to an unprivileged uid."""


class SystemRoot(Op):
    """The host's system directories, read-only, and a minimal /etc."""


class ImageRoot(Op):
    """An image from the store as the read-only root, in place of SystemRoot. build_plan
    names it (`ref`); runtime.tiers resolves it to a digest and tree before any check."""
    ref: str
    digest: str = ""
    tree: str = ""           # the base tree (host path)
    pinned: bool = False     # the policy named the digest itself, not a name
    #: the image's layers over `tree` (host paths, bottom first): the tiers mount them and
    #: the tree as one read-only overlay (backends/host/imageroot.py)
    layers: tuple[str, ...] = ()


class Scratch(Op):
    size: int
    inodes: int


class WorkspaceMount(Op):
    path: str            # on the host (no symbolic link in it: see hostpath.py)
    writable: bool
    dest: str = WORKSPACE   # inside the sandbox: /workspace, or `path` (mount_at = "same")
    #: mode "review": writable inside through an overlay whose upper layer is in the
    #: sandbox's scratch; the host directory itself is only read (writable stays False)
    review: bool = False


class ReadOnlyBind(Op):
    path: str            # on the host and inside the sandbox


class Environment(Op):
    env: tuple[tuple[str, str], ...]


class MemoryLimit(Op):
    bytes: int


class PidsLimit(Op):
    count: int


class CpuQuota(Op):
    cpus: float


class CpuTime(Op):
    seconds: float


class WallClock(Op):
    seconds: float


class OutputCap(Op):
    bytes: int


class Rlimit(Op):
    name: str            # "nofile" | "fsize" | "core"
    value: int


class Seccomp(Op):
    """The kernel-surface syscall filter: an allow list and refusals (seccomp.py)."""


class NoNetwork(Op):
    """An empty network namespace: loopback only."""


class EgressProxy(Op):
    """corral's egress proxy, listening on 127.0.0.1:PROXY_PORT inside the sandbox's
    (still empty) network namespace; the proxy itself runs on the host side."""
    config_json: str
    #: (name, placeholder) of each secret grant; values are read when the sandbox opens
    grants: tuple[tuple[str, str], ...] = ()


class Plan(Record):
    tier: str
    ops: tuple[Op, ...]
    cwd: str
    explicit: frozenset[str]

    def find(self, cls: type) -> list:
        """The ops of type `cls`, in order (a new list each call). Indexed once by every
        class in each op's __mro__ (what isinstance() walks for a plain class): a plan is
        frozen, and a sandbox's every exec looks up the same dozen types."""
        found = self.__dict__.get("_found")
        if found is None:
            found = self.__dict__["_found"] = {}
            for op in self.ops:
                for k in type(op).__mro__:
                    found.setdefault(k, []).append(op)
        if type(cls) is type:   # not an ABC (whose registered classes are in no __mro__)
            return list(found.get(cls, ()))
        return [op for op in self.ops if isinstance(op, cls)]


def build_plan(policy: Policy, host_env: dict[str, str], *, learn: bool = False) -> Plan:
    """`learn`: the egress proxy in learn mode (runtime/learn.py: `corral learn`), which
    lets any public host through and records it; no policy key can ask for it."""
    lim = policy.limits
    ops: list[Op] = [
        Namespaces(rule=""),
        SystemRoot(rule="") if policy.image == "host" else ImageRoot(rule="image",
                                                                    ref=policy.image),
        Seccomp(rule=""),
        Scratch(rule="limits.scratch", size=lim.scratch, inodes=lim.scratch_inodes),
        MemoryLimit(rule="limits.memory", bytes=lim.memory),
        PidsLimit(rule="limits.pids", count=lim.pids),
        CpuQuota(rule="limits.cpus", cpus=lim.cpus),
        CpuTime(rule="limits.cpu_time", seconds=lim.cpu_time),
        WallClock(rule="limits.timeout", seconds=lim.timeout),
        OutputCap(rule="limits.output", bytes=lim.output),
        Rlimit(rule="limits.open_files", name="nofile", value=lim.open_files),
        Rlimit(rule="limits.file_size", name="fsize", value=lim.file_size),
        Rlimit(rule="", name="core", value=0),
        NoNetwork(rule=""),
    ]
    extra_env: list[tuple[str, str]] = []
    if policy.network.mode == "allow":
        grants: tuple[tuple[str, str], ...] = ()
        cfg = net_config(policy, learn=learn)
        bypass = no_proxy(cfg)
        extra_env += [*PROXY_ENV, ("NO_PROXY", bypass), ("no_proxy", bypass)]
        if policy.secrets:
            from .grants import CA_BUNDLE, CA_ENV, placeholder

            grants = tuple((s.name, placeholder(s.name)) for s in policy.secrets)
            # not net_config's: the proxy gets upstream_ca with the grants, at open time
            extra_env += [(name, CA_BUNDLE) for name in CA_ENV]
            extra_env += grants
        ops.append(EgressProxy(rule="network.mode", config_json=cfg.to_json(),
                               grants=grants))
    ops.append(Environment(rule="env", env=tuple(
        policy.sandbox_env(host_env, extra_env).items())))
    ws = policy.filesystem.workspace
    binds: list[Op] = [ReadOnlyBind(rule="filesystem.ro_binds", path=p)
                       for p in policy.filesystem.ro_binds]
    if ws is not None:
        binds.append(WorkspaceMount(rule="filesystem.workspace", path=ws.path,
                                    writable=ws.mode == "rw",
                                    review=ws.mode == "review",
                                    dest=ws_dest(ws)))
    # a mount lands on top of whatever is at its path: the outer ones first, so a ro_bind
    # inside a workspace at its host path stays read-only, and a workspace inside a
    # ro_bind stays visible (stable: at the same path the workspace comes last and wins)
    binds.sort(key=lambda op: len(_dest(op).rstrip("/").split("/")))
    ops += binds
    return Plan(tier=policy.isolation, ops=tuple(ops), cwd=ws_dest(ws) if ws else SCRATCH,
                explicit=policy.explicit)


def _dest(op: Op) -> str:
    return op.dest if isinstance(op, WorkspaceMount) else op.path


def ws_dest(ws) -> str:
    """Where a policy's workspace is inside the sandbox."""
    return ws.path if ws.mount_at == "same" else WORKSPACE


def net_config(p: Policy, *, learn: bool = False):
    """The egress proxy's configuration for this policy (mode must be "allow"); `learn`:
    for a learn run only (build_plan)."""
    from .egress.config import NetConfig

    b = p.network.budget
    return NetConfig.from_dict({
        "allow": list(p.network.allow), "deny": list(p.network.deny),
        "allow_private": list(p.network.allow_private),
        "nameservers": list(p.network.nameservers),
        "budget": {"bytes_out": b.bytes_out, "bytes_in": b.bytes_in, "requests": b.requests},
        **({"learn": True} if learn else {})})


#: every kind of op a plan can hold: each tier's match over a plan's ops handles all of
#: them and ends in assert_never (backends/base.py), which a type checker holds against
#: this union; adding an op here without a case in every tier is an error
AnyOp = (Namespaces | SystemRoot | ImageRoot | Scratch | WorkspaceMount | ReadOnlyBind
         | Environment | MemoryLimit | PidsLimit | CpuQuota | CpuTime | WallClock | OutputCap
         | Rlimit | Seccomp | NoNetwork | EgressProxy)
