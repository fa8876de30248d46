"""The process tier: rlimits + Landlock + seccomp, no namespaces at all. The weakest tier.

For hosts where namespaces are unavailable (an unprivileged container, a locked-down host)
and for users without root. Like Codex's Linux sandbox: the command runs as an ordinary
process of the host, fenced by the kernel's Landlock LSM and a seccomp filter.

What it enforces, and with what:
 - filesystem (Landlock): read and execute only the system paths (/usr, /bin, /lib*, ...),
   the few /etc entries the namespace tier also shows, /proc (read), /dev/null and friends;
   write only under the run's scratch directory and a rw workspace; read a ro workspace and
   ro_binds. Home directories (/home, /root), the rest of /etc, /var, /run, /tmp, /sys are
   simply not in the allowed set: opening or listing them fails with EACCES.
 - network "none" (seccomp; Landlock ABI 4+ as a second layer for TCP): sockets only AF_UNIX
   stream and seqpacket, no connect/bind/listen/accept (process_seccomp.py).
 - network "allow" (root, cgroup2, bpf(2), Landlock ABI 4+; check() refuses otherwise, naming
   network.mode): per command, the egress proxy listens on the host's 127.0.0.1 at a free
   port P, runs as a uid of its own outside the command's cgroup, and admits a connection
   only if the socket at the other end belongs to the sandbox's uid (egress peer_uid:
   one sock_diag lookup per connection). The command gets HTTP(S)_PROXY=http://127.0.0.1:P and three fences:
   a cgroup v2 directory of its own (`<run cgroup>/sandbox` on cgroup v2 hosts, `<cgroup2
   mount>/corral/<run id>` on hybrid ones) with socket programs (cgroup_bpf.py) that allow
   connect only to 127.0.0.1:P or ::ffff:127.0.0.1:P over TCP and refuse UDP sends, binds
   and non-TCP inet sockets; Landlock allowing TCP connect to port P only; seccomp allowing
   only AF_INET/AF_INET6 stream sockets (unix sockets only from socketpair; no bind, listen,
   accept or TCP Fast Open). Before exec the command checks that the cgroup programs apply
   to it (a UDP socket must be refused) and refuses to run otherwise. The cgroup directory
   is noted in the run dir and removed with the exec (or by the stale sweep); removing it
   frees the programs. With secret grants the run's CA bundle is a file in the run dir
   (SSL_CERT_FILE and friends point at it; there is no /etc/corral-ca.pem here).
 - kernel surface (seccomp): the namespace tier's allow list and refusals, namespaces and
   mounts included.
 - signals and ptrace (Landlock): no ptrace of processes outside the sandbox (ABI 1+), no
   signals to them and no connecting to their abstract unix sockets (ABI 6+).
 - identity: as root, corral switches the command to a dedicated uid/gid per sandbox
   (UID_BASE scheme of the namespace tier; in a user namespace that does not map that range,
   e.g. a rootless container, the upper part of the mapped range) with no supplementary
   groups, an empty capability bounding set and no capabilities; RLIMIT_NPROC = limits.pids
   then counts this sandbox only. Root that cannot switch uids (no CAP_SETUID) is refused:
   the command never runs as root. Without root it runs as the caller's uid. no_new_privs
   always.
 - limits: rlimits (nofile, fsize, core 0, cpu, nproc); wall clock, CPU time and output caps
   by the supervisor; memory, pids and CPU quota by a per-run cgroup when corral can create
   one (root here); scratch is a size-capped tmpfs when corral is root with CAP_SYS_ADMIN
   (root in a container usually lacks it: then scratch is a plain directory, reported).
 - teardown: the command runs under a small reaper process (a fork of the supervisor, a
   child subreaper) that is outside the sandbox's Landlock domain and uid; when the command
   exits, times out or the supervisor dies, it SIGKILLs every descendant (double-forked
   daemons reparent to it), then the run's cgroup, if any, is killed as a whole.

What it cannot do, plainly:
 - no PID namespace: host processes and their command lines are visible in /proc (their
   memory, environment and fds are not: Landlock's ptrace rule); no network namespace; no
   IPC namespace (seccomp refuses System V IPC and POSIX message queues instead) and no UTS
   namespace; the host's mount table is visible in /proc/self/mountinfo.
 - host files outside the allowed set are hidden from open() and listing only: stat(2),
   access(2), readlink and inotify still reveal names, sizes and times where Unix
   permissions allow (Landlock does not cover metadata).
 - /scratch, /tmp and /workspace do not exist: HOME (and cwd) is the real directory
   `<rundir>/scratch/home`, TMPDIR is `<rundir>/scratch/tmp`, a workspace is at its host
   path. /scratch and /workspace in the policy's env values are rewritten to those paths.
   /tmp and /dev/shm are not writable (multiprocessing's semaphores need /dev/shm).
 - without root: no size cap on scratch (a plain directory), no memory or CPU cap unless
   the host delegates a cgroup, only an approximate RLIMIT_NPROC (it counts all of the
   caller's processes), and the command has the caller's uid inside the allowed paths; on
   Landlock ABI < 6 it can also signal the caller's other processes (check() says so).
 - no unix-socket servers or clients by path (connect and bind are refused, see above);
   socketpair(2) works. No servers on localhost either, and no name resolution at all
   (/etc/hosts is not readable, DNS needs an inet socket). No terminals: /dev/pts and
   /dev/ptmx are the host's, so they stay out of reach.
 - as root, the dedicated uid reads a workspace and ro_binds with "other" permissions, and
   cannot own files in a rw workspace: a rw workspace is refused (use the namespace tier,
   or run corral as the workspace's owner).
 - network "allow": the host's network namespace stays shared (the command sees the host's
   interfaces, routes and /proc/net/tcp, i.e. who talks to whom on this host); services the
   host runs on 127.0.0.1 stay unreachable (only 127.0.0.1:P, the proxy, is allowed); on a
   hybrid host where a v1 net_cls/net_prio controller was ever activated the kernel ignores
   cgroup v2 socket programs, and the command refuses to start.
"""

from __future__ import annotations

import _signal
import math
import os
import time

from ..errors import BackendUnavailable, SandboxSetupError
from ..events import TeardownEvent
from ..linux import landlock, limits, rundir
from ..linux._sys import MS_NODEV, MS_NOSUID, mount
from ..linux.supervise import (
    ExecFailed,
    Outcome,
    Stream,
    decode_status,
    spawn,
    supervise,
)
from ..plan import (
    ETC_BINDS,
    SCRATCH,
    SYSTEM_PATHS,
    WORKSPACE,
    CpuQuota,
    CpuTime,
    EgressProxy,
    Environment,
    ImageRoot,
    MemoryLimit,
    Namespaces,
    NoNetwork,
    Op,
    OutputCap,
    PidsLimit,
    Plan,
    ReadOnlyBind,
    Rlimit,
    Scratch,
    Seccomp,
    SystemRoot,
    WallClock,
    WorkspaceMount,
)
from ..result import Result
from .base import Backend, ExecLimits, LiveSandbox, TierCheck, assert_never
from .host import ids
from .host.cgroups import run_cgroup, usage_of
from .host.finish import finish
from .host.proxy import egress_files
from .host.scratch import open_source, scratch_events
from .process_net import NETWORK_ALLOW_NOTE, _Egress
from .process_reaper import (
    SIGTERM,
    _Child,
    _kill_uid,
    _tasks_of_uid,
    _wait_quietly,
)

#: the device files a program expects to open: (path, Landlock rights). /dev/tty opens the
#: opener's controlling terminal: with -t the run's own pty, else none (ENXIO: the command
#: is in a session of its own)
DEV_FILES = (("/dev/null", landlock.RW_FILE), ("/dev/zero", landlock.RW_FILE),
             ("/dev/full", landlock.RW_FILE), ("/dev/random", landlock.FS_READ_FILE),
             ("/dev/urandom", landlock.FS_READ_FILE), ("/dev/tty", landlock.RW_FILE))


CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN = 6, 7, 21


def _effective_caps() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _id_range(map_file: str) -> tuple[int, int] | None:
    """(first, count) of the ids to draw sandbox uids (or gids) from: the namespace tier's
    UID_BASE range when this user namespace maps it (a host, a rootful container), else
    the upper part (32768..65533) of the largest mapped extent (a rootless container maps
    only 65536 ids or so). None when nothing usable is mapped."""
    from .host.ids import UID_BASE, UID_SPAN

    try:
        with open(map_file) as f:
            extents = [(int(a), int(c)) for a, _, c in (line.split() for line in f)]
    except (OSError, ValueError):
        return None
    best = None
    for lo, n in extents:
        if lo <= UID_BASE and UID_BASE + UID_SPAN <= lo + n:
            return UID_BASE, UID_SPAN
        start, end = max(lo, 1 << 15), lo + n
        if start < 65534 < end:
            end = 65534  # stay clear of nobody/nogroup
        if end - start >= 1024 and (best is None or end - start > best[1]):
            best = (start, end - start)
    return best


def _others_can_read(path: str) -> str | None:
    """Why an unrelated uid cannot list and enter `path`, or None if it can."""
    import stat

    p = os.path.abspath(path)
    try:
        st = os.stat(p)
        if st.st_mode & (stat.S_IROTH | stat.S_IXOTH) != stat.S_IROTH | stat.S_IXOTH:
            return f"{p} is mode {stat.S_IMODE(st.st_mode):o}, not readable by others"
        while p != "/":
            p = os.path.dirname(p)
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return f"{p} is not searchable by others"
    except OSError as e:
        return f"{p}: {e.strerror}"
    return None


class ProcessBackend(Backend):
    name = "process"
    mechanism = "rlimits + Landlock + seccomp, no namespaces"
    #: explain's summary of the network for an allow policy
    egress_note = ("only through the egress proxy on the host's 127.0.0.1 at a port of "
                   "its own per command (HTTP_PROXY and friends), which admits only the "
                   "sandbox's uid; cgroup socket programs, Landlock and seccomp refuse "
                   "every other connect, UDP send and bind; no resolver of its own")
    own_kernel = False
    #: a one-shot run can report the syscalls its filter refused ([audit] syscalls):
    #: corral loads the filter itself, in the command's process (ProcessSandbox)
    observes_syscalls = True

    def __init__(self) -> None:
        self.root = os.geteuid() == 0
        self.abi = landlock.abi()
        caps = _effective_caps() if self.root else 0
        #: root that can switch uids (false in a container that dropped CAP_SETUID)
        self.can_setuid = bool(caps >> CAP_SETUID & 1 and caps >> CAP_SETGID & 1)
        #: root that can mount the scratch tmpfs (false without CAP_SYS_ADMIN)
        self.can_mount = bool(caps >> CAP_SYS_ADMIN & 1)
        self.uid_range = _id_range("/proc/self/uid_map") if self.root else None
        self.gid_range = _id_range("/proc/self/gid_map") if self.root else None

    # -- what this tier can enforce here -------------------------------------------------
    def check(self, plan: Plan) -> TierCheck:
        if self.abi < 1:
            raise BackendUnavailable(
                f"Landlock is unavailable ({landlock.unavailable_reason()}); without it the "
                f"process tier can neither keep writes inside scratch nor hide home "
                f"directories: enable Landlock or use isolation = \"namespace\"",
                field="isolation")
        if os.uname().machine != "x86_64":
            raise BackendUnavailable(f"the process tier's seccomp filter is written for "
                                     f"x86_64 only, not {os.uname().machine}",
                                     field="isolation")
        if self.root and not (self.can_setuid and self.uid_range and self.gid_range):
            raise BackendUnavailable(
                "corral runs as root but cannot switch the command to an unprivileged uid "
                + ("(no CAP_SETUID/CAP_SETGID)" if not self.can_setuid else
                   "(this user namespace maps no spare uid or gid range)")
                + "; the process tier never runs a command as root: run corral as an "
                  "ordinary user", field="isolation")
        cg = limits.detect()
        missing: list[tuple[Op, str]] = []
        for op in plan.ops:
            match op:
                case Namespaces():
                    missing.append((op, self._namespaces_reason()))
                case Scratch():
                    if not self.root:
                        missing.append((op, ("a size-capped scratch is a tmpfs, which needs "
                                            "root; here scratch is a plain directory with no "
                                            "size or inode cap")))
                    elif not self.can_mount:
                        missing.append((op, ("a size-capped scratch is a tmpfs, and corral "
                                            "lacks CAP_SYS_ADMIN to mount one; here scratch "
                                            "is a plain directory with no size or inode cap")))
                case MemoryLimit():
                    if not cg.memory:
                        missing.append((op, f"no usable memory cgroup: {cg.reason}"))
                case PidsLimit():
                    if not cg.pids and not self.root:
                        missing.append((op, (f"no usable pids cgroup ({cg.reason}), and "
                                            f"RLIMIT_NPROC is only approximate when the "
                                            f"command runs as the caller's own uid")))
                case CpuQuota():
                    if not cg.cpu:
                        missing.append((op, f"no usable cpu cgroup: {cg.reason}"))
                case CpuTime():
                    if not cg.cpu:
                        missing.append((op, ("only per-process RLIMIT_CPU, not the run's "
                                            f"total: {cg.reason}")))
                case EgressProxy():
                    why = self.network_allow_unusable()
                    if why:
                        missing.append((op, why))
                case WorkspaceMount() if op.review:
                    missing.append((op, "a workspace in review mode is an overlay mount, "
                                        "and the process tier makes no mounts"))
                case WorkspaceMount():
                    if self.root and op.writable:
                        missing.append((op, ("as root the process tier runs the command as a "
                                            "dedicated uid, and without namespaces corral "
                                            "cannot idmap the workspace to it: files would "
                                            "land with a foreign owner; run corral as the "
                                            "workspace's owner (no root needed) or use "
                                            "isolation = \"namespace\"")))
                    elif self.root:
                        why = _others_can_read(op.path)
                        if why:
                            missing.append((op, (f"as root the process tier runs the command "
                                                f"as a dedicated uid, which reads the "
                                                f"workspace with 'other' permissions: {why}; "
                                                f"run corral as the workspace's owner or use "
                                                f"isolation = \"namespace\"")))
                case ImageRoot():
                    missing.append((op, "the process tier has no mount namespace, so it "
                                        "cannot change the root the command sees"))
                case (SystemRoot() | Seccomp() | WallClock() | OutputCap() | Rlimit()
                      | Environment() | NoNetwork() | ReadOnlyBind()):
                    pass
                case _:
                    assert_never(op)
        return TierCheck.of(self.name, plan, missing)

    def network_allow_unusable(self) -> str | None:
        """Why `network.mode = "allow"` cannot be enforced here, or None. It needs root (a
        uid of the command's own, which the proxy admits, and bpf(2) for the cgroup
        programs that pin its connects to the proxy), a writable cgroup2 mount, and
        Landlock ABI 4+ (TCP ports)."""
        fix = "; use isolation = \"namespace\" (as root) for network allow"
        if not self.root:
            return ("network allow on the process tier needs root: the proxy on the host's "
                    "loopback admits only the sandbox's own uid, and the cgroup programs "
                    "that let the command reach nothing but the proxy need bpf(2); run "
                    "corral as root" + fix)
        if self.abi < 4:
            return (f"this kernel's Landlock (ABI {self.abi} < 4) cannot restrict TCP "
                    f"connects to the proxy's port" + fix)
        from ..linux import cgroup_bpf

        mnt = cgroup_bpf.cgroup2_mount()
        if mnt is None:
            return ("no cgroup2 filesystem is mounted, and the cgroup programs that keep "
                    "the command's connects on the proxy attach to a cgroup2 directory; "
                    "mount cgroup2 (e.g. at /sys/fs/cgroup/unified)" + fix)
        if not os.access(mnt, os.W_OK | os.X_OK):
            return f"cannot create cgroups in the cgroup2 mount {mnt} (read-only?)" + fix
        why = cgroup_bpf.unusable_reason()
        if why:
            return why + fix
        return None

    def _namespaces_reason(self) -> str:
        reason = ("no namespaces in the process tier: the command shares the host's PID, "
                  "network, IPC and UTS namespaces (host processes and their command lines "
                  "are visible in /proc; System V IPC and POSIX message queues are refused "
                  "by seccomp) and sees the host's mount table")
        if self.abi < 6 and not self.root:
            reason += (f"; this kernel's Landlock (ABI {self.abi} < 6) cannot scope signals, "
                       f"so the command can signal the caller's other processes")
        return reason

    @property
    def properties(self) -> dict[str, bool]:
        """The tier's fixed properties on this host, for `corral explain`."""
        return {
            "own_kernel": False,
            "pid_isolation": False,
            "network_namespace": False,
            "host_fs_hidden": self.abi >= 1,      # contents; names and sizes stay stat-able
            "no_host_root": True,                 # the command never runs as root
            "kernel_surface_filtered": True,
            "read_only_root": self.abi >= 1,      # Landlock: writes only to scratch/workspace
            "signals_scoped": self.abi >= 6 or self.root,
        }

    def describe(self, op: Op) -> tuple[str, str]:
        """How this tier enforces an op it can enforce: (enforced_by, note)."""
        cg = "the run's cgroup" if self.root else "a delegated cgroup"
        match op:
            case MemoryLimit():
                return "kernel", f"memory cgroup ({cg}), swap included"
            case PidsLimit():
                return "kernel", ("RLIMIT_NPROC on the sandbox's own uid, and the pids cgroup"
                                  if self.root else f"pids cgroup ({cg})")
            case CpuQuota():
                return "kernel", f"cpu cgroup ({cg}, CFS quota)"
            case CpuTime():
                return "supervisor", ("the run's cgroup CPU counter, polled; RLIMIT_CPU as a "
                                     "second layer")
            case WallClock():
                return "supervisor", "wall clock; then the reaper kills every process of the run"
            case OutputCap():
                return "supervisor", "bytes past the cap are read and dropped"
            case Rlimit():
                return "kernel", f"RLIMIT_{op.name.upper()}"
            case Scratch():
                return "kernel", ("a tmpfs with size= and nr_inodes= at <rundir>/scratch, "
                                  "which holds HOME and TMPDIR (/scratch itself does not "
                                  "exist in this tier); Landlock allows writes only there")
            case WorkspaceMount():
                return "kernel", ("Landlock: " + ("read and write" if op.writable else
                                                  "read only") + f" beneath {op.path}, "
                                  f"used at that path (no /workspace in this tier)")
            case ReadOnlyBind():
                return "kernel", "Landlock: read only beneath the path"
            case Environment():
                return "supervisor", ("only corral's base, env.pass and env.set; HOME and "
                                      "TMPDIR point at the real scratch directory, and "
                                      "/scratch or /workspace in values at the real paths")
            case NoNetwork():
                return "kernel", ("seccomp: no inet sockets, no connect/bind on unix "
                                  "sockets (socketpair only)" + (
                                      "; Landlock denies TCP bind and connect"
                                      if self.abi >= 4 else "")
                                  + "; the host's network namespace is shared (with "
                                    "network.mode = \"allow\": see network.mode)")
            case EgressProxy():
                return "proxy", NETWORK_ALLOW_NOTE
            case Seccomp():
                return "kernel", ("seccomp allow list and refusals of the namespace tier "
                                 "(seccomp.py), with the socket rules of process_seccomp.py")
            case Namespaces():
                return "none", self._namespaces_reason()
            case SystemRoot():
                return "kernel", ("Landlock: read and execute only /usr, /bin, /lib*, a "
                                  "minimal /etc, /proc and /dev/null and friends; home "
                                  "directories and the rest of the host are unreadable "
                                  "(names and sizes stay visible to stat)")
            case _:
                assert_never(op)

    def open(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None
             ) -> ProcessSandbox:
        return ProcessSandbox(self, plan, check.admit(self.name), list(granted), upstream_ca)


class ProcessSandbox(LiveSandbox):
    def __init__(self, backend: ProcessBackend, plan: Plan, check: TierCheck,
                 granted: list | None = None, upstream_ca: str | None = None) -> None:
        self.granted = granted or []
        self.upstream_ca = upstream_ca
        self.ca: tuple[str, str] | None = None
        self.ca_file: str | None = None
        self.egress = plan.find(EgressProxy)
        self.backend = backend
        self.plan = plan
        self.check = check   # what it leaves unenforced here (backends/base.py)
        self.events = check.events()   # standing events, copied per exec
        self.root = backend.root
        self.execs = 0
        self._ruleset: landlock.Ruleset | None = None
        #: the seccomp listeners' observer (observe_syscalls()), else None
        self.observer = None
        # root's usual base (/run/corral) is a private tmpfs mount; without CAP_SYS_ADMIN
        # (root in a container) use a plain directory instead
        base = None if not self.root or backend.can_mount else f"/tmp/corral-{os.geteuid()}"
        rundir.sweep_if_due(base)
        self.dir = rundir.RunDir(base)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------------------
    def _setup(self) -> None:
        plan = self.plan
        if self.root:
            pick = ids.pick(0, 1 << 32)   # one draw: uid and gid at the same offset
            (ubase, uspan), (gbase, gspan) = self.backend.uid_range, self.backend.gid_range
            self.uid, self.gid = ubase + pick % uspan, gbase + pick % gspan
            # the egress proxy gets a uid of its own too: the command cannot signal it
            self.proxy_uid, self.proxy_gid = (ubase + (pick + 1) % uspan,
                                              gbase + (pick + 1) % gspan)
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
        scratch = plan.find(Scratch)[0]
        self.scratch = self.dir.sub("scratch")
        if self.root and self.backend.can_mount and not self._unenforced(scratch):
            try:
                mount("tmpfs", self.scratch, "tmpfs", MS_NOSUID | MS_NODEV,
                      f"size={scratch.size},nr_inodes={scratch.inodes},mode=0700,"
                      f"uid={self.uid},gid={self.gid}")
            except OSError as e:
                raise SandboxSetupError(f"mounting the scratch tmpfs on {self.scratch}: "
                                        f"{e.strerror}", step="scratch", errno=e.errno) from None
            self.dir.mounts.append(self.scratch)
        elif self.root:
            os.chown(self.scratch, self.uid, self.gid)
        self.home = os.path.join(self.scratch, "home")
        self.tmp = os.path.join(self.scratch, "tmp")
        for p in (self.home, self.tmp):
            os.mkdir(p, 0o700)
            if self.root:
                os.chown(p, self.uid, self.gid)
        ws = plan.find(WorkspaceMount)
        self.workspace = ws[0].path if ws else None
        self.cwd = self.workspace or self.home
        # the workspace and ro_binds, each opened without following a symbolic link
        # (host/scratch.open_source): the Landlock rules land on these fds' inodes and the
        # command's cwd is the workspace's fd, so a path swapped later for a link grants
        # nothing (its target is not beneath any rule)
        self.fds: dict[str, int] = {}
        for op in ws:
            self.fds[op.path] = open_source(op.path, op.rule, directory=True)
        for op in plan.find(ReadOnlyBind):
            self.fds.setdefault(op.path, open_source(op.path, op.rule))
        self.cwd_fd = self.fds[self.workspace] if self.workspace else None
        if self.egress:
            self._setup_egress()
        self.env = self._env()
        if not self.egress:  # with a proxy the ruleset names its port: built per exec
            self._ruleset = self._landlock()
        from ..linux import process_seccomp

        bpf = process_seccomp.bpf_bytes(os.path.join(self.dir.base, "cache"), self.backend.abi,
                                        "allow" if self.egress else "none")
        self._bpf = bpf
        self._seccomp = process_seccomp.Loader(bpf)

    def observe_syscalls(self) -> None:
        """From now on each command loads the filter with a listener, handed to this
        sandbox's observer, which answers every refusal with the same errno and counts it
        (linux/seccomp_notify.py; docs/audit.md)."""
        if self.observer is not None:
            return
        from ..linux import process_seccomp
        from ..linux.seccomp_notify import Observer, notifying

        try:
            prog = notifying(self._bpf)
        except ValueError as e:
            raise SandboxSetupError(f"the seccomp program cannot be observed: {e}",
                                    step="seccomp") from None
        self.observer = Observer(self._bpf, name=f"corral-seccomp-{self.dir.id}")
        self._seccomp = process_seccomp.Loader(prog, listen=True)

    def _setup_egress(self) -> None:
        """The run's CA bundle (secret grants) where the command can read it, and a copy of
        upstream_ca the proxy's uid can read."""
        self.ca, self.ca_file, self.upstream_ca = egress_files(self.dir, self.granted,
                                                               self.upstream_ca)

    def _unenforced(self, op: Op) -> bool:
        return not self.check.enforces(op)

    def _env(self) -> dict[str, str]:
        """The plan's environment, with the sandbox paths of the other tiers (/scratch,
        /workspace) pointed at the real directories, and TMPDIR at scratch."""
        real = {SCRATCH: self.home}
        if self.workspace:
            real[WORKSPACE] = self.workspace

        def fix(part: str) -> str:
            for virtual, path in real.items():
                if part == virtual or part.startswith(virtual + "/"):
                    return path + part[len(virtual):]
            return part

        env = {k: ":".join(fix(p) for p in v.split(":"))
               for k, v in self.plan.find(Environment)[0].env}
        env.setdefault("TMPDIR", self.tmp)
        if self.ca_file:  # no /etc/corral-ca.pem in this tier: the real file
            from ..grants import CA_BUNDLE

            env = {k: self.ca_file if v == CA_BUNDLE else v for k, v in env.items()}
        return env

    def _env_for_proxy(self, port: int) -> dict[str, str]:
        """The environment of one command: the proxy variables point at this exec's port."""
        from ..plan import PROXY_URL

        url = f"http://127.0.0.1:{port}"
        return {k: v.replace(PROXY_URL, url) for k, v in self.env.items()}

    def _landlock(self, proxy_port: int | None = None) -> landlock.Ruleset:
        rs = landlock.Ruleset(self.backend.abi)
        try:
            for p in SYSTEM_PATHS:
                rs.allow_path(p, landlock.READ_EXEC)
            for p in ETC_BINDS:
                rs.allow_path(p, landlock.READ_EXEC)
            rs.allow_path("/proc", landlock.READ)
            for p, rights in DEV_FILES:
                rs.allow_path(p, rights)
            rs.allow_path(self.scratch, landlock.WRITE_TREE)
            for op in self.plan.find(WorkspaceMount):
                rs.allow_path(self.fds[op.path], landlock.WRITE_TREE if op.writable
                              else landlock.READ_EXEC)
            for op in self.plan.find(ReadOnlyBind):
                rs.allow_path(self.fds[op.path], landlock.READ_EXEC)
            if self.ca_file:
                rs.allow_path(self.ca_file, landlock.FS_READ_FILE)
            # with TCP handled (ABI 4+), every bind and every connect but to the proxy's
            # port is denied
            if proxy_port is not None:
                rs.allow_port(proxy_port, landlock.NET_CONNECT_TCP)
        except BaseException:
            rs.close()
            raise
        return rs

    # -- exec ----------------------------------------------------------------------------
    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None, tty=None) -> Result:
        if not argv:
            raise SandboxSetupError("no command given", step="exec")
        if self.dir is None:
            raise SandboxSetupError("the sandbox is closed", step="exec")
        plan = self.plan
        self.execs += 1
        events = [dict(e) for e in self.events]
        lim = ExecLimits.from_plan(plan, timeout)
        wall, cpu, cap, rl, pids = lim.wall, lim.cpu, lim.cap, lim.rlimits, lim.pids
        nproc = pids if self.root else _tasks_of_uid(self.uid) + pids
        # root without a pids cgroup: RLIMIT_NPROC only
        run_id = f"{self.dir.id}-{self.execs}"
        cg = run_cgroup(self.dir, run_id, plan, self.check)
        attach: list[int] = []
        pidfd = -1
        net: _Egress | None = None
        proxy = None
        tally = theirs = None
        if self.observer is not None:   # the listener comes back on this socket
            import socket

            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            tally = self.observer.watch_socket(ours)
        try:
            attach = cg.attach_fds() if cg else []
            env, ruleset = self.env, self._ruleset
            if self.egress:
                net = _Egress(self, run_id, cg)
                attach += net.attach
                env, ruleset = self._env_for_proxy(net.port), net.ruleset
            child = _Child(argv=list(argv), env=env, cwd=self.cwd, cwd_fd=self.cwd_fd,
                           attach=attach,
                           nofile=rl["nofile"], fsize=rl["fsize"],
                           cpu_seconds=math.ceil(cpu) + 1, nproc=nproc,
                           uid=self.uid, gid=self.gid, root=self.root,
                           ruleset_fd=ruleset.fd, seccomp=self._seccomp,
                           parent=os.getpid(), bpf_cgroup=net is not None,
                           tty=tty is not None, listen_sock=theirs)
            if net is not None:  # listening before the command starts
                proxy = net.start_proxy(cg)
            if tty is not None:  # a host pty; the command takes it as its terminal
                stdin = tty.open()
            stdin_fd = stdin if stdin is not None else os.open(os.devnull, os.O_RDONLY)
            started = time.monotonic()
            failed = None
            try:
                # `path` is never exec'd: the reaper and the command's execvpe run inside
                # child_setup, which does not return
                pid, out_r, err_r = spawn("/nonexistent", ["corral-reaper"], {},
                                          stdin_fd=stdin_fd, pass_fds=(),
                                          child_setup=child.reaper,
                                          stdout_fd=stdin if tty is not None else None)
            except ExecFailed as e:   # the command never started (the reaper is reaped)
                failed = (argv[0], e)
            finally:
                if stdin is None:
                    os.close(stdin_fd)
                if theirs is not None:
                    theirs.close()
                    theirs = None
            if failed is None:
                pidfd = os.pidfd_open(pid)
                outcome = self._watch(pid, pidfd, out_r, err_r, wall, cpu, cap, cg, net,
                                      proxy, started, on_stdout, on_stderr, tty)
            else:
                outcome = Outcome()
                outcome.stdout, outcome.stderr = Stream(cap, None), Stream(cap, None)
                outcome.status = 0
                outcome.wall_s = time.monotonic() - started
            if proxy is not None:  # before the cgroup kill: its last events
                events += proxy.stop()
                proxy = None
            if cg is not None:
                cg.kill_all()
            usage, oom_kills = usage_of(outcome, cg)
        finally:
            if theirs is not None:
                theirs.close()
            if proxy is not None:
                proxy.stop()
            for fd in attach:
                os.close(fd)
            if pidfd >= 0:
                os.close(pidfd)
            for done in ((net.close() if net else []) + ([cg] if cg is not None else [])):
                try:
                    done.destroy()
                except SandboxSetupError as e:
                    events.append(TeardownEvent(str(e)).to_dict())
        exit_code, sig = decode_status(outcome.status or 0, signal_exit_codes=False)
        if tally is not None:
            from .host.syscalls import syscall_events

            events += syscall_events(tally)
        events += self._scratch_events()
        result = finish(outcome, exit_code=exit_code, sig=sig, events=events, usage=usage,
                        oom_kills=oom_kills, wall=wall, cpu=cpu,
                        memory=lim.memory, cap=cap, isolation="process",
                        failed=failed)
        if failed is not None and on_stderr is not None:
            on_stderr(result.stderr.encode())
        return result

    def _watch(self, pid, pidfd, out_r, err_r, wall, cpu, cap, cg, net, proxy, started,
               on_stdout, on_stderr, tty=None) -> Outcome:
        """supervise() the reaper; on the way out of an error, the run is killed."""
        def kill() -> None:
            try:  # the reaper kills every process of the run, then exits
                _signal.pidfd_send_signal(pidfd, SIGTERM)
            except ProcessLookupError:
                pass
            if net is not None:
                net.cgroup.kill_all()
            if cg is not None:
                cg.kill_all()

        try:
            if tty is not None:
                tty.start()
            return supervise(pid, out_r, err_r, timeout=wall, cpu_time=cpu,
                             cpu_seconds=cg.cpu_seconds if cg else None,
                             output_cap=cap, on_stdout=on_stdout, on_stderr=on_stderr,
                             kill=kill, started=started,
                             extra={proxy.events_r: proxy.lines} if proxy else None)
        except BaseException:
            kill()
            _wait_quietly(pid)
            raise

    def _scratch_events(self) -> list[dict]:
        if not self.dir or self.scratch not in self.dir.mounts:
            return []  # a plain directory: the host filesystem's fullness is not ours
        return scratch_events(self.scratch)

    # -- teardown ------------------------------------------------------------------------
    def close(self) -> list[str]:
        problems: list[str] = []
        if getattr(self, "observer", None) is not None:
            observer, self.observer = self.observer, None
            observer.close()
        if self._ruleset is not None:
            self._ruleset.close()
            self._ruleset = None
        for fd in getattr(self, "fds", {}).values():
            os.close(fd)
        self.fds = {}
        if self.root and getattr(self, "uid", None):
            _kill_uid(self.uid)  # belt and braces: the uid is this sandbox's alone
            if self.egress and getattr(self, "proxy_uid", None):
                _kill_uid(self.proxy_uid)
        if getattr(self, "dir", None) is not None:
            problems += self.dir.remove()
            self.dir = None
        return problems
