"""The one policy schema. Every setting of corral is a field here, with its default.

Defaults are the safe ones: no network, read-only root, a small scratch area, nothing
inherited from the host's environment. A missing field never means "allow".

The FIELDS table drives everything else: loading from TOML, dicts and flags (load.py),
printing back as TOML (dump.py) and the reference in docs/policy.md (docs.py). Pure
data, no I/O.
"""

from __future__ import annotations

from .._record import Default, Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

TIERS = ("namespace", "gvisor", "process", "microvm", "wasm", "auto")
#: corral defaults that are set in every sandbox; [env].set may override them
BASE_ENV = (
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/scratch"),
    ("LANG", "C.UTF-8"),
    ("TERM", "dumb"),
)


class Limits(Record):
    timeout: float = 60.0          # wall clock, seconds
    cpu_time: float = 30.0         # CPU seconds, summed over every process of the run
    memory: int = 512 * MiB        # bytes, swap included, whole run (cgroup)
    cpus: float = 1.0              # CPU quota in cores (cgroup)
    pids: int = 256                # processes and threads alive at once (cgroup)
    scratch: int = 256 * MiB       # bytes in /scratch, /tmp and /dev/shm together
    scratch_inodes: int = 65536    # files and directories in those
    output: int = 1 * MiB          # bytes kept per stream (stdout, stderr)
    open_files: int = 256          # RLIMIT_NOFILE per process
    file_size: int = 128 * MiB     # RLIMIT_FSIZE: largest file a process may write
    idle_timeout: float = 0.0      # a live sandbox ends after this long unused; 0: never


#: where the workspace is mounted by default; mount_at = "same" mounts it at its host path
WORKSPACE_AT = "/workspace"


class Workspace(Record):
    path: str                      # absolute host path, no symbolic link in it, a directory
    mode: Literal["ro", "rw", "review"] = "ro"   # review: writes kept apart (docs/sessions.md)
    mount_at: str = WORKSPACE_AT   # "/workspace" or "same" (its host path)


class Filesystem(Record):
    workspace: Workspace | None = None   # mounted at /workspace (or mount_at); none by default
    ro_binds: tuple[str, ...] = ()       # host paths shown read-only at the same path


class Env(Record):
    pass_: tuple[str, ...] = ()                  # host variables passed through by name
    set: tuple[tuple[str, str], ...] = ()        # NAME=VALUE pairs, in order


class Budget(Record):
    """Per domain (per wildcard rule for `*.suffix` rules); past it the connection closes."""
    bytes_out: int = 10 * MiB
    bytes_in: int = 1 * GiB
    requests: int = 1000


class Network(Record):
    mode: Literal["none", "allow"] = "none"
    allow: tuple[str, ...] = ()          # host rules the egress proxy lets through
    deny: tuple[str, ...] = ()           # wins over allow
    allow_private: tuple[str, ...] = ()  # CIDRs the proxy may reach despite the SSRF guard
    nameservers: tuple[str, ...] = ()    # "IP" or "IP:PORT"; empty: the host's resolv.conf
    upstream_ca: str | None = None       # CA file for upstream TLS of granted hosts (tests)
    budget: Budget = Default(Budget)


class Secret(Record):
    """A credential grant: the sandbox sees a placeholder in $name; the egress proxy puts
    the real value in requests to `hosts` only, until `ttl` after the sandbox opens."""
    name: str                      # the variable name inside the sandbox
    source: str                    # "env:VAR" | "file:/path" | "literal" (Python API only)
    hosts: tuple[str, ...]         # allow-rule grammar
    ttl: float = 900.0             # seconds
    plain_http: bool = False       # also inject into unencrypted HTTP
    value: str | None = None       # only for source "literal"; never printed

    def __repr__(self) -> str:
        return (f"Secret(name={self.name!r}, source={self.source!r}, hosts={self.hosts!r}, "
                f"ttl={self.ttl!r}, plain_http={self.plain_http!r})")


class Install(Record):
    """[install]: Python packages installed into `image` before the run, once: the result
    is an image of its own, reused while the base and the requirements stay the same
    (images/policy_install.py)."""
    requirements: str | None = None      # a requirements file on the host
    packages: tuple[str, ...] = ()       # requirement strings, e.g. "requests==2.32.3"
    index_urls: tuple[str, ...] = ()     # default: PyPI
    allow_names: tuple[str, ...] = ()    # names the typosquat check lets through
    timeout: float = 900.0               # of the install phase

    def requested(self) -> bool:
        return bool(self.requirements or self.packages)


class Audit(Record):
    """[audit]: what the run records beyond the audit store's defaults (docs/audit.md)."""
    syscalls: bool = False   # refused syscalls as "syscall" events, where observable


class Batch(Record):
    """[batch]: how `corral batch` (scale/) uses this policy's sandboxes."""
    reuse: bool = False            # one sandbox runs many jobs, scratch wiped between them


class Policy(Record):
    """A validated policy: the tier, limits, filesystem, network, environment and secret
    grants of a sandbox. Build one with load_policy (TOML) or policy_from_dict."""

    isolation: str = "namespace"
    image: str = "host"            # "host", an image name, or "sha256:..." (images/store.py)
    install: Install = Default(Install)
    audit: Audit = Default(Audit)
    limits: Limits = Default(Limits)
    filesystem: Filesystem = Default(Filesystem)
    env: Env = Default(Env)
    network: Network = Default(Network)
    secrets: tuple[Secret, ...] = ()
    batch: Batch = Default(Batch)
    #: dotted key paths the user set explicitly (file or flags); the rest are defaults.
    #: A tier that cannot enforce an explicit rule refuses; a default it cannot enforce
    #: is reported as an "unenforced" event instead.
    explicit: frozenset[str] = frozenset()

    def sandbox_env(self, host_env: dict[str, str], extra=()) -> dict[str, str]:
        """The environment the sandboxed command starts with: corral's base (and `extra`,
        the proxy variables), then the host variables named in env.pass (those that
        exist), then env.set."""
        env = dict(BASE_ENV)
        env.update(extra)
        for name in self.env.pass_:
            if name in host_env:
                env[name] = host_env[name]
        env.update(self.env.set)
        return env


class Spec(Record):
    """One key of the schema: where it lives, how it is read, and what it means."""

    path: str            # dotted key, e.g. "limits.memory"
    kind: str            # duration | size | int | float | bool | tier | netmode | paths | names | envset | workspace | requirements | urls
    doc: str
    minimum: float | None = None
    maximum: float | None = None


def _fields() -> tuple[Spec, ...]:
    """FIELDS: ~30 Specs and their docs, made on first use (the policy loader, `policy
    show`, the docs), not at every `corral run` start, which reads none of them."""
    return (
        Spec("isolation", "tier", "Isolation tier: `namespace` (bubblewrap + seccomp + cgroups), "
             "`gvisor` (runsc: a user-space kernel between the code and the host's), `process` "
             "(rlimits + Landlock + seccomp, no namespaces: the weakest), `wasm` (Python code "
             "only, in wasmtime: CPython for WASI, no shell, no network, no native extensions; "
             "wasmtime's own process in a namespace sandbox), `microvm` (a QEMU virtual "
             "machine with its own kernel, KVM or TCG-emulated; needs an image, no network "
             "or workspace yet), or `auto` (the first of "
             "gvisor, namespace, process available here that enforces every rule set "
             "explicitly). docs/tiers.md compares them; `corral explain --isolation T` says what "
             "each enforces on this host."),
        Spec("image", "image", "The root the sandbox sees: \"host\" (the host's /usr and a "
             "minimal /etc, read-only), or an image from `corral image` by name or by "
             "\"sha256:...\" digest (pinned), bound read-only as `/`. The namespace and gvisor "
             "tiers can; the process tier cannot change its root and refuses an image."),
        Spec("limits.timeout", "duration", "Wall-clock limit for one command; then every process "
             "of the run is killed and the verdict is `timeout`.", 0.001, 7 * 86400),
        Spec("limits.cpu_time", "duration", "CPU time summed over all processes of the run "
             "(cgroup accounting, RLIMIT_CPU as a second layer); verdict `timeout`.", 0.001, 7 * 86400),
        Spec("limits.memory", "size", "Memory of the whole run, swap and scratch (tmpfs) pages "
             "included (on cgroup v1, also scratch files earlier commands of the same sandbox "
             "wrote), enforced by the memory cgroup; verdict `oom`.", 4 * MiB, 1 << 50),
        Spec("limits.cpus", "float", "CPU quota in cores (cgroup CFS quota); 0.5 is half a core.",
             0.01, 1024),
        Spec("limits.pids", "int", "Processes and threads alive at once (pids cgroup); "
             "contains fork bombs.", 1, 4_194_304),
        Spec("limits.scratch", "size", "Size cap of /scratch; /tmp and /dev/shm live on the same "
             "tmpfs and count against it. Writes past it fail with ENOSPC.", 64 * KiB, 1 << 50),
        Spec("limits.scratch_inodes", "int", "Files and directories allowed on the scratch tmpfs; "
             "past it, ENOSPC.", 16, 1 << 31),
        Spec("limits.output", "size", "Bytes kept per stream (stdout, stderr); the rest is read "
             "and dropped, the result is flagged truncated, the command keeps running.", 0, 1 << 40),
        Spec("limits.open_files", "int", "RLIMIT_NOFILE for each process.", 16, 1 << 20),
        Spec("limits.file_size", "size", "RLIMIT_FSIZE: the largest file a process may write "
             "(SIGXFSZ/EFBIG past it).", 1, 1 << 50),
        Spec("limits.idle_timeout", "duration", "A live sandbox (Sandbox.create) ends after "
             "this long with no command running and no call made to it; 0 (the default) "
             "never: only its own timeout ends it. One-shot runs ignore it.", 0, 7 * 86400),
        Spec("filesystem.workspace", "workspace", "A host directory mounted at /workspace and "
             "used as the working directory, `{ path = \"/abs/dir\", mode = \"ro\" }`, mode "
             "\"rw\", or mode \"review\": writable inside, but every write lands in an overlay "
             "kept in the sandbox's scratch (and counted against limits.scratch), never on the "
             "host, until the caller accepts it (`sb.changes()`, `sb.apply_changes()`, `corral "
             "run --apply`; see docs/sessions.md; namespace and gvisor tiers, as root); "
             "`mount_at = \"same\"` mounts it at its host path instead (so a venv or "
             "any tool that recorded absolute paths works inside). Default: none. A workspace "
             "is mounted nosuid and nodev; files written there can never be setuid, setgid or "
             "device nodes. The path may not contain a symbolic link at any component (corral "
             "opens it without following one and mounts what it opened) and may not be a "
             "system tree (/, /etc, /usr, /var, /boot, /root, /proc, /sys, /dev, /run); with "
             "\"same\" it may not replace /tmp, /scratch or /workspace nor lie in /proc, /dev, "
             "/sys or /etc."),
        Spec("filesystem.ro_binds", "paths", "Extra host paths made visible read-only at the "
             "same path. The same rules as for the workspace: no symbolic link in the path, no "
             "system tree as a whole, nothing that replaces /tmp, /proc, /dev, /sys, /etc, "
             "/scratch or /workspace or lies inside /proc, /dev, /sys, /etc or /workspace. A "
             "path below /tmp or /scratch (a CI checkout, a mktemp directory) is mounted on top "
             "of the sandbox's own tmpfs there."),
        Spec("env.pass", "names", "Host environment variables passed through by name. Nothing "
             "else is inherited."),
        Spec("env.set", "envset", "Variables set in the sandbox, NAME = \"value\". corral sets "
             "PATH, HOME=/scratch, LANG=C.UTF-8 and TERM=dumb; these override them."),
        Spec("network.mode", "netmode", "\"none\": nothing leaves the sandbox (namespace and "
             "gvisor: a network namespace with only loopback; process: seccomp refuses inet "
             "sockets). \"allow\": the same, plus one way out, corral's egress proxy (HTTP_PROXY "
             "and friends are set), which lets through only what network.allow names; where it "
             "listens depends on the tier (`corral explain` shows the path)."),
        Spec("network.allow", "rules", "Hosts the proxy lets through: `example.com` (that name "
             "only), `*.example.com` (its subdomains, not the name itself), an IP address or CIDR; "
             "each with an optional `:port` (default: 80 and 443). Needs mode = \"allow\"; the "
             "`--allow-domain` flag sets both."),
        Spec("network.deny", "rules", "Hosts refused even when allow matches; a deny rule without "
             "a port covers every port."),
        Spec("network.allow_private", "cidrs", "Private, loopback, link-local or metadata "
             "addresses the proxy may connect to anyway (it refuses them by default, after its "
             "own DNS lookup, so a public name cannot point it inside)."),
        Spec("network.nameservers", "nameservers", "Resolvers the proxy asks (\"IP\" or "
             "\"IP:PORT\"); default: the host's /etc/resolv.conf. The sandbox itself has none."),
        Spec("network.upstream_ca", "file", "A CA certificate file (PEM) the proxy verifies "
             "upstream TLS against, for hosts a secret grant names; default: the host's trust "
             "store. For tests and internal hosts."),
        Spec("network.budget.bytes_out", "size", "Bytes sent upstream per domain; past it the "
             "connection is closed and an event says so.", 0, 1 << 50),
        Spec("network.budget.bytes_in", "size", "Bytes received per domain.", 0, 1 << 50),
        Spec("network.budget.requests", "int", "Requests and tunnels per domain.", 0, 1 << 40),
        Spec("install.requirements", "file", "A requirements file (pip syntax, `--hash` lines "
             "for --require-hashes) installed into `image` before the run, by `corral install`'s "
             "install phase: wheels only, a network that reaches only the index hosts. The result "
             "is an image, reused while the base image and the requirements are the same."),
        Spec("install.packages", "requirements", "Requirement strings installed the same way, "
             "e.g. [\"requests==2.32.3\"]: NAME[extras], a version and a marker, at most 1024 "
             "characters each (a longer one is refused, naming its index)."),
        Spec("install.index_urls", "urls", "The package indexes (http or https URLs) the install "
             "phase may reach, the first as --index-url; default: PyPI. No other index is "
             "reachable, whatever a requirements file says."),
        Spec("install.allow_names", "requirements", "Names the typosquat check lets through "
             "(as `corral install --allow-name`)."),
        Spec("install.timeout", "duration", "Wall clock of the install phase.", 1, 86400),
        Spec("audit.syscalls", "bool", "Record the syscalls the seccomp profile refuses, each "
             "command's as `syscall` events (name, errno, count; `corral denials --kind "
             "syscall`), answered with the same errno as unobserved. A live sandbox of the "
             "namespace tier and any run of the process tier observe them (corral loads the "
             "filter itself, with a listener); a one-shot run of the namespace tier "
             "(bubblewrap loads the filter) and the other tiers cannot, and refuse the key "
             "(exit 3) rather than run unobserved. "
             "Learn mode turns it on. docs/audit.md, \"Refused syscalls\"."),
        Spec("batch.reuse", "bool", "`corral batch` only: `true` lets one sandbox run many "
             "jobs, one after another, its scratch (/scratch, /tmp, /dev/shm) wiped between "
             "them (each job's processes end with it; a job can still see what an earlier one "
             "changed elsewhere, e.g. a writable workspace); `false` (the default) gives every "
             "job a fresh sandbox from a warm pool. docs/scale.md."),
    )


def __getattr__(name: str):
    if name in ("FIELDS", "SPEC_BY_PATH"):   # made once, then module globals
        global FIELDS, SPEC_BY_PATH
        FIELDS = _fields()
        SPEC_BY_PATH = {s.path: s for s in FIELDS}
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SECTIONS = ("limits", "filesystem", "env", "network", "install", "audit", "batch")
