"""The namespace tier: bubblewrap + seccomp + cgroups. The default and the workhorse.

Steps of one sandbox, in order (each names what enforces it):
 1. a run directory on the host, locked for the supervisor's life (rundir.py)
 2. /scratch: a tmpfs mounted by corral on the host with size= and nr_inodes=, owned by the
    run's own unprivileged uid; /tmp and /dev/shm are directories of the same tmpfs
 3. the workspace, if any: an idmapped mount (owner -> the run's uid), nosuid, nodev, of
    the directory as opened without following a symbolic link (host/scratch.open_source); the
    ro_binds opened the same way and mounted read-only in the run dir (without root:
    bwrap's --bind-fd / --ro-bind-fd of those fds)
 4. per exec: a cgroup (memory+swap, pids, cpu quota, cpu accounting), reused from earlier
    runs of this process when one with the same limits is idle (limits.py)
 5. bwrap starts as the run's uid (when corral is root) and builds user/mount/pid/net/uts/
    ipc/cgroup namespaces, the read-only root, no capabilities, no_new_privs; it then
    waits for its seccomp program on a pipe while the supervisor moves it into the cgroup
    and sets its rlimits (the gate: see exec()); then it loads the filter, forks the
    sandbox's init and execs the command. bwrap dies with the supervisor
    (--die-with-parent), its child with bwrap
 6. the supervisor watches output, wall clock and the cgroup's CPU counter; at the end it
    kills everything left in the cgroup and empties it
"""

from __future__ import annotations

import _signal  # the C module: `signal` would import enum on the start-up path
import math
import os
import select
import sys
import time

from ..errors import BackendUnavailable, SandboxSetupError
from ..linux import limits, rundir, seccomp_cache
from ..linux._sys import real_ids, subreaper_acquire, subreaper_release
from ..linux.supervise import (
    BWRAP_EXEC_FAILED,
    ENOENT,
    HeldLine,
    bwrap_child_pid,
    bwrap_exec_failure,
    bwrap_status_rest,
    decode_status,
    kill_pid,
    spawn,
    supervise,
)
from ..plan import (
    SCRATCH,
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
from .host.cgroups import keep_cgroup, remove_run, run_cgroup, usage_of, with_relay_tasks
from .host.etc import HOSTNAME, ensure_etc, system_binds
from .host.finish import Inflight, finish, interpreter_inside
from .host.scratch import mount_binds, mount_workspace, open_source, scratch_events, setup_scratch

#: on bwrap's command line, not in its --args: --hostname needs --unshare-uts, which is in
#: --args, so a bwrap whose supervisor died before writing them stops right away (before
#: it forks anything that could be left waiting outside the run's cgroup); and
#: --die-with-parent holds whatever was written
LINE_OPTIONS = ("--hostname", HOSTNAME, "--die-with-parent")
ESRCH = 3
ENOENT_TEXT = os.strerror(2)   # bwrap's "execvp CMD: No such file or directory"
#: what gives a tty exec's command its controlling terminal (see NamespaceSandbox._tty)
SETSID = "/usr/bin/setsid"
#: NamespaceSandbox.fds' key of the workspace's fd (the others are ro_binds' paths)
WORKSPACE_KEY = ""
#: self.fds's key of the user namespace a sandbox with a user account joins (bwrap --userns)
USERNS_KEY = "\0userns"
#: the unprivileged account inside a sandbox that has one (NamespaceLive(user_account=
#: True)): uid and gid USER_ID inside, a host uid of its own outside, its home USER_HOME
USER_ID = 1000
USER_HOME = "/home/user"
#: the tmpfs over /home that holds USER_HOME's mount point (nothing else is written there)
HOME_TMPFS_BYTES = 1 << 16
#: why review mode is refused without root (both its mounts need it)
REVIEW_NEEDS_ROOT = ("a workspace in review mode is an overlay corral mounts on the host, "
                     "which needs root; run corral as root, or use mode \"ro\" or \"rw\"")


def _image_note(op: ImageRoot) -> str:
    """explain's note for an image root: which image, and whether the policy pins it."""
    pin = ("pinned by digest" if op.pinned else
           f"by name (now {op.digest[:19]}; write image = \"{op.digest}\" to pin it)")
    how = (f"read-only overlay of its {len(op.layers)} layer(s) over the store's tree"
           if op.layers else "read-only bind of the store's tree")
    return f"image {op.ref}, {how} as /, {pin}"


def find_bwrap() -> str | None:
    for d in ("/usr/bin", "/usr/local/bin", "/bin"):
        p = os.path.join(d, "bwrap")
        if os.access(p, os.X_OK):
            return p
    import shutil

    return shutil.which("bwrap")


#: userns_available()'s answer, with when it was found: the two sysctls are read again
#: after USERNS_RECHECK_S (an admin may change them; a start need not read them every time)
USERNS_RECHECK_S = 1.0
_userns: tuple[float, bool | str] | None = None


def userns_available() -> bool | str:
    """True, or why unprivileged user namespaces cannot be made here."""
    global _userns
    now = time.monotonic()
    if _userns is None or now - _userns[0] >= USERNS_RECHECK_S:
        _userns = (now, _read_userns_sysctls())
    return _userns[1]


def _read_userns_sysctls() -> bool | str:
    try:
        with open("/proc/sys/user/max_user_namespaces") as f:
            if int(f.read()) == 0:
                return "user namespaces are disabled (user.max_user_namespaces = 0)"
    except OSError:
        pass
    try:
        with open("/proc/sys/kernel/unprivileged_userns_clone") as f:
            if f.read().strip() == "0":
                return "unprivileged user namespaces are off (kernel.unprivileged_userns_clone=0)"
    except OSError:
        pass
    return True


class NamespaceBackend(Backend):
    name = "namespace"
    mechanism = "bubblewrap + seccomp + cgroups"
    own_kernel = False
    #: fixed properties of the tier that `explain` reports and the probe suite cites
    properties = {"own_kernel": False, "pid_isolation": True, "host_fs_hidden": True,
                  "no_host_root": True, "kernel_surface_filtered": True,
                  "network_namespace": True, "read_only_root": True}

    def describe(self, op: Op) -> tuple[str, str]:
        """How this tier enforces an op: (enforced_by, note)."""
        match op:
            case MemoryLimit():
                return "kernel", "memory cgroup, swap included; oom verdict from its counter"
            case PidsLimit():
                return "kernel", "pids cgroup"
            case CpuQuota():
                return "kernel", "cpu cgroup (CFS quota)"
            case CpuTime():
                return "supervisor", "the run's cgroup CPU counter, polled; RLIMIT_CPU as a " \
                                     "second layer"
            case WallClock():
                return "supervisor", "wall clock; then every process of the run is killed"
            case OutputCap():
                return "supervisor", "bytes past the cap are read and dropped"
            case Rlimit():
                return "kernel", f"RLIMIT_{op.name.upper()}"
            case Scratch():
                return "kernel", "tmpfs with size= and nr_inodes=, /tmp and /dev/shm on it"
            case WorkspaceMount():
                if op.review:
                    return "kernel", (f"overlay at {op.dest} (nosuid, nodev) over a "
                                      "read-only idmapped clone of the workspace; writes "
                                      "go to its upper layer in scratch until applied")
                return "kernel", ("idmapped bind mount at " + op.dest + ", nosuid, nodev" + (
                    "" if op.writable else ", read-only") + "; opened without following "
                    "a symbolic link, and that fd mounted")
            case ReadOnlyBind():
                return "kernel", ("read-only bind mount of the path as opened without "
                                  "following a symbolic link")
            case Environment():
                return "supervisor", "only corral's base, env.pass and env.set"
            case NoNetwork():
                return "kernel", "empty network namespace (loopback only)"
            case EgressProxy():
                return "proxy", "egress proxy on 127.0.0.1:3128 inside the namespace"
            case Seccomp():
                return "kernel", "seccomp allow list and refusals (src/corral/linux/seccomp.py)"
            case Namespaces():
                return "kernel", "user/mount/pid/net/uts/ipc/cgroup namespaces, no " \
                                 "capabilities, no_new_privs, unprivileged host uid"
            case SystemRoot():
                return "kernel", "read-only binds of /usr, /lib*, a minimal /etc"
            case ImageRoot():
                return "kernel", _image_note(op)
            case _:
                assert_never(op)

    def __init__(self) -> None:
        self.bwrap = find_bwrap()
        self.root = os.geteuid() == 0

    def check(self, plan: Plan) -> TierCheck:
        if self.bwrap is None:
            raise BackendUnavailable("bubblewrap (bwrap) is not installed; "
                                     "apt-get install bubblewrap", field="isolation")
        userns = userns_available()
        if userns is not True:
            raise BackendUnavailable(f"{userns}; enable them or use another tier",
                                     field="isolation")
        cg = limits.detect()
        missing: list[tuple[Op, str]] = []
        for op in plan.ops:
            match op:
                case Scratch():
                    if not self.root:
                        missing.append((op, "a size-capped tmpfs needs root; run corral as "
                                            "root (scratch is a plain directory otherwise)"))
                case MemoryLimit():
                    if not cg.memory:
                        missing.append((op, f"no usable memory cgroup: {cg.reason}"))
                case PidsLimit():
                    if not cg.pids:
                        missing.append((op, f"no usable pids cgroup: {cg.reason}"))
                case CpuQuota():
                    if not cg.cpu:
                        missing.append((op, f"no usable cpu cgroup: {cg.reason}"))
                case CpuTime():
                    if not cg.cpu:
                        missing.append((op, "only per-process RLIMIT_CPU, not the run's "
                                            f"total: {cg.reason}"))
                case WorkspaceMount():
                    if op.review and not self.root:
                        missing.append((op, REVIEW_NEEDS_ROOT))
                    elif self.root:
                        from ..linux import idmap

                        ok = idmap.supported(op.path)
                        if ok is not True:
                            missing.append((op, f"the workspace cannot be idmapped: {ok}"))
                case EgressProxy():
                    if not self.root:
                        missing.append((op, "the egress proxy's socket is made inside the "
                                            "sandbox's network namespace, which needs root; "
                                            "run corral as root"))
                case ImageRoot():
                    if op.layers and not self.root:
                        from .host.imageroot import LAYERED_NEEDS_ROOT

                        missing.append((op, LAYERED_NEEDS_ROOT))
                    binds = [b.path for b in plan.find(ReadOnlyBind)]
                    if binds:
                        from ..images.resolve import missing_mount_points

                        for path in missing_mount_points(op, binds):
                            missing.append((op, f"{path} (filesystem.ro_binds) has no "
                                                f"mount point in image {op.ref}"))
                case (Namespaces() | SystemRoot() | Seccomp() | WallClock() | OutputCap()
                      | Rlimit() | Environment() | NoNetwork() | ReadOnlyBind()):
                    pass
                case _:
                    assert_never(op)
        return TierCheck.of(self.name, plan, missing)

    def open(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None
             ) -> NamespaceSandbox:
        return NamespaceSandbox(self, plan, check.admit(self.name), list(granted), upstream_ca)

    def open_live(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None, *,
                  user_account: bool = False):
        """One bwrap for the sandbox's life, commands entered from the host side;
        `user_account`: with an unprivileged account beside root (namespace_live.py)."""
        from .namespace_live import NamespaceLive

        return NamespaceLive(self, plan, check.admit(self.name), list(granted), upstream_ca,
                             user_account=user_account)


class NamespaceSandbox(LiveSandbox):
    #: whether the sandbox has an unprivileged account (USER_ID) beside its root: its
    #: user namespace maps a second host uid (`user_uid`), and USER_HOME is a directory of
    #: the scratch tmpfs owned by it (namespace_live.py sets it; corral must be root)
    user_account = False
    user_uid = -1
    #: set by corral.run() on its one-shot sandbox: its exec keeps the sandbox's mount
    #: namespace for close() to free (host/mountns.py); `_held_ns`: that fd, if kept
    one_shot = False
    _held_ns: tuple[int, ...] = ()

    @property
    def defers_teardown(self) -> bool:
        """close(defer_as=...) may leave the removal of emptied resources to
        host/deferred.py (not a subclass's own close())."""
        return type(self).close is NamespaceSandbox.close

    def __init__(self, backend: NamespaceBackend, plan: Plan, check: TierCheck,
                 granted: list | None = None, upstream_ca: str | None = None) -> None:
        self.granted = granted or []
        self.upstream_ca = upstream_ca
        self.ca: tuple[str, str] | None = None
        self.ca_file: str | None = None
        self.backend = backend
        self.plan = plan
        self.check = check   # what it leaves unenforced here (backends/base.py)
        self.events = check.events()   # standing events, copied per exec
        self.root = backend.root
        self.execs = 0
        #: emptied cgroups of earlier execs, for the next ones (host/cgroups.CgroupPool)
        self._cgroups: list = []
        #: the execs running now, which close() ends (one in another thread, say)
        self._inflight = Inflight()
        rundir.sweep_if_due(off_path=_sweep_off_path())
        #: (run dir, uid, its scratch) made ahead by the teardown thread (host/deferred.py)
        self._ready = self._take_ready()
        self.dir = self._ready[0] if self._ready else rundir.RunDir()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------------------
    def _setup(self) -> None:
        plan = self.plan
        if self._ready:
            self.uid = self.gid = self._ready[1]
        elif self.root:
            self.uid = self.gid = ids.pick()
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
        self.etc, self.etc_dirs = ensure_etc(self.dir.base, prebind=self.root)
        #: the root of a layered image: its overlay, mounted here (check(): root only)
        self.image_root = None
        for op in plan.find(ImageRoot):
            if op.layers:
                from .host.imageroot import image_root

                self.image_root = image_root(self.dir, op)
        scratch = plan.find(Scratch)[0]
        if self._ready:
            self.scratch = self._ready[2]
        else:
            self.scratch = setup_scratch(self.dir, scratch.size, scratch.inodes, self.uid,
                                         self.gid,
                                         enforce=self.root and not self._unenforced(scratch))
        self.fds: dict[str, int] = {}
        if self.user_account:
            self._user_account()
        # the workspace and ro_binds, each opened without following a symbolic link
        # (host/scratch.open_source) and mounted from that fd. As root: a clone of the fd's tree
        # (idmapped for the workspace) mounted at a path of the run dir, which bwrap binds.
        # Without root: bwrap's --bind-fd / --ro-bind-fd, which binds /proc/self/fd/N and
        # dies if the mount is not the fd's inode; those fds stay open for the sandbox's
        # life (each exec's bwrap gets them).
        self.workspace_src = None
        self.bind_src: dict[str, str] = {}
        for ws in plan.find(WorkspaceMount):
            fd = open_source(ws.path, ws.rule, directory=True)
            if ws.review:  # an overlay over it, writes kept in scratch (check(): root)
                from .host.review import mount_review

                self.review = mount_review(self.dir, fd, self.scratch, self.uid, self.gid,
                                           ws.path)   # keeps fd
                self.workspace_src = self.review.merged
            elif self.root:  # seccomp.py's SETID rules keep set-id files out of it
                try:
                    self.workspace_src = mount_workspace(self.dir, fd, ws.writable, self.uid,
                                                         self.gid)
                finally:
                    os.close(fd)
            else:
                self.fds[WORKSPACE_KEY] = fd
        if self.root:
            self.bind_src = mount_binds(self.dir, plan.find(ReadOnlyBind))
        else:
            for op in plan.find(ReadOnlyBind):
                self.fds[op.path] = open_source(op.path, op.rule)
        if self.granted or self.upstream_ca:   # host/proxy.py: only for an egress proxy
            from .host.proxy import egress_files

            self.ca, self.ca_file, self.upstream_ca = egress_files(self.dir, self.granted,
                                                                   self.upstream_ca)
        self.bpf = seccomp_cache.bpf_bytes(os.path.join(self.dir.base, "cache"))
        if len(self.bpf) > 4096:  # PIPE_BUF: the gate's one write must not be split
            raise AssertionError(f"the seccomp program is {len(self.bpf)} bytes, over 4096")
        #: bwrap's argv up to the command, without the per-exec fds (exec() adds
        #: --seccomp, --json-status-fd and --block-fd)
        self.argv_prefix = self._bwrap_args()
        self._args_blob = ("\0".join(self.argv_prefix[1:]) + "\0").encode()

    def _user_account(self) -> None:
        """A second host uid, mapped to USER_ID inside beside root (0 -> self.uid), in a
        user namespace this supervisor makes and bwrap joins (--userns): only a process
        with CAP_SETUID over the host's namespace may map two ids, so bwrap (the sandbox's
        uid) cannot make it itself. Its home: scratch/user, user:root, mode 0775."""
        if not self.root:
            raise SandboxSetupError("a sandbox with a user account (an unprivileged uid "
                                    "beside its root) needs corral to run as root: mapping "
                                    "two uids into its user namespace needs CAP_SETUID on "
                                    "the host", step="userns")
        from ..linux.idmap import userns

        while True:
            self.user_uid = ids.pick()
            if self.user_uid != self.uid:
                break
        home = os.path.join(self.scratch, "user")
        os.mkdir(home)
        os.chown(home, self.user_uid, self.gid)   # user:root inside, 0775: a command as
        os.chmod(home, 0o775)                      # root (no capabilities) may write too
        pairs = [(0, self.uid), (USER_ID, self.user_uid)]
        try:
            self.fds[USERNS_KEY] = userns(pairs, pairs, owner=self.uid)
        except OSError as e:
            raise SandboxSetupError(f"the user namespace with a user account: {e.strerror}",
                                    step="userns", errno=e.errno) from None

    def _ready_key(self) -> tuple[int, int] | None:
        """What a run dir made ahead must match: its scratch's (size, inodes); None when
        this sandbox does not take one (not root, or scratch not enforced)."""
        scratch = self.plan.find(Scratch)[0]
        if not self.root or self._unenforced(scratch):
            return None
        return (scratch.size, scratch.inodes)

    def _take_ready(self):
        key = self._ready_key()
        # made only by the teardown thread of host/deferred.py, imported by the first
        # deferred close(): a process that never defers (the CLI) never imports it
        deferred = sys.modules.get("corral.backends.host.deferred")
        return deferred.DEFERRED.take_ready(key) if key is not None and deferred else None

    def _unenforced(self, op: Op) -> bool:
        return not self.check.enforces(op)

    def _bwrap_args(self) -> list[str]:
        a = [self.backend.bwrap or "bwrap"]
        for op in self.plan.ops:
            match op:
                case Namespaces():
                    if USERNS_KEY in self.fds:   # joined, made with two uids (_user_account)
                        a += ["--userns", str(self.fds[USERNS_KEY])]
                    else:
                        a += ["--unshare-user"]
                    a += ["--unshare-pid", "--unshare-ipc", "--unshare-uts",
                          "--unshare-cgroup-try", "--uid", "0", "--gid", "0",
                          "--new-session", "--die-with-parent",
                          "--cap-drop", "ALL"]
                case NoNetwork():
                    a += ["--unshare-net"]
                case EgressProxy():
                    # per exec: --block-fd, a listener in the namespace, the proxy
                    if self.ca_file:
                        from ..grants import CA_BUNDLE

                        a += ["--ro-bind", self.ca_file, CA_BUNDLE]
                case SystemRoot():
                    a += system_binds()
                    a += ["--ro-bind", self.etc, "/etc"]   # ETC_BINDS: etc.py
                    for p in self.etc_dirs:
                        a += ["--ro-bind", p, p]
                    a += ["--proc", "/proc", "--dev", "/dev"]
                case ImageRoot():   # the store's tree (or the layers' overlay) as /
                    a += ["--ro-bind", self.image_root or op.tree, "/", "--proc", "/proc",
                          "--dev", "/dev"]
                case Scratch():
                    a += ["--bind", os.path.join(self.scratch, "home"), SCRATCH,
                          "--bind", os.path.join(self.scratch, "tmp"), "/tmp",
                          "--bind", os.path.join(self.scratch, "shm"), "/dev/shm"]
                case WorkspaceMount():
                    if self.workspace_src is not None:   # the idmapped mount (root)
                        rw = op.writable or op.review    # review: the overlay, writable
                        a += ["--bind" if rw else "--ro-bind", self.workspace_src,
                              op.dest]
                    else:
                        a += ["--bind-fd" if op.writable else "--ro-bind-fd",
                              str(self.fds[WORKSPACE_KEY]), op.dest]
                case ReadOnlyBind():
                    if op.path in self.bind_src:     # mounted from its fd (root)
                        a += ["--ro-bind", self.bind_src[op.path], op.path]
                    else:
                        a += ["--ro-bind-fd", str(self.fds[op.path]), op.path]
                case Seccomp():
                    pass  # per exec: --seccomp on the gate pipe (exec())
                case (Environment() | MemoryLimit() | PidsLimit() | CpuQuota() | CpuTime()
                      | WallClock() | OutputCap() | Rlimit()):
                    pass  # enforced by the supervisor, the cgroup or rlimits, not by bwrap
                case _:
                    assert_never(op)
        if USERNS_KEY in self.fds:   # the account's home, its mount point on a small tmpfs
            a += ["--size", str(HOME_TMPFS_BYTES), "--tmpfs", "/home",
                  "--bind", os.path.join(self.scratch, "user"), USER_HOME]
        a += ["--remount-ro", "/", "--chdir", self.plan.cwd]
        return a

    # -- exec ----------------------------------------------------------------------------
    def bwrap_line(self, argv: list[str], *, args_r: int, gate_r: int, status_w: int,
                   block_r: int = -1) -> tuple[list[str], bytes]:
        """bwrap's command line for argv, and the options it reads from `args_r` (--args,
        NUL-separated). bwrap takes only options from --args; the command, the gate
        (--seccomp) and LINE_OPTIONS stay on the command line, so an --args cut short or
        never written still meets the gate (see exec())."""
        line = [self.argv_prefix[0], "--args", str(args_r), *LINE_OPTIONS, "--seccomp",
                str(gate_r), "--json-status-fd", str(status_w)]
        if block_r >= 0:
            line += ["--block-fd", str(block_r)]
        return [*line, "--", *argv], self._args_blob

    def direct_argv(self, argv: list[str], seccomp_fd: int) -> list[str]:
        """The same sandbox as one plain bwrap command line, without the gate (no cgroup,
        no rlimits): for benchmarks against raw bwrap and for debugging."""
        return [*self.argv_prefix, *LINE_OPTIONS, "--seccomp", str(seccomp_fd), "--", *argv]

    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None, tty=None) -> Result:
        """Run argv in fresh namespaces. Every limit holds from bwrap's first clone on, and
        a supervisor that dies or fails half way leaves nothing running outside them:

         1. bwrap starts (supervise.spawn: a C vfork+exec from a thread holding the run's
            ids when corral is plain root, else a C fork+exec) with `--args PIPE --hostname
            corral --die-with-parent --seccomp GATE --json-status-fd STATUS -- COMMAND`:
            it reads its other options from the pipe before anything else, so it waits.
         2. The supervisor moves it into the run's cgroup and sets its rlimits, then writes
            the options (namespaces, mounts, ...). bwrap's clone of the sandbox's pid 1
            (and the cgroup namespace, rooted at the run's cgroup) comes after, so every
            process of the sandbox inherits both.
         3. bwrap builds the namespaces and the root, reports its child on
            --json-status-fd (by then it has its parent-death signal), and reads its seccomp
            program from the gate pipe, which the supervisor fills only on that report.
         4. A supervisor that dies (or fails) before 3 ends leaves the gate empty, whatever
            it wrote of the options: bwrap refuses an empty seccomp program and exits
            without running the command."""
        if not argv:
            raise SandboxSetupError("no command given", step="exec")
        if self.dir is None:
            raise SandboxSetupError("the sandbox is closed", step="exec")
        with self._inflight.run() as slot:
            return self._exec(argv, stdin, on_stdout, on_stderr, timeout, tty, slot)

    def _exec(self, argv, stdin, on_stdout, on_stderr, timeout, tty, slot) -> Result:
        plan = self.plan
        self.execs += 1
        events = [dict(e) for e in self.events]
        lim = ExecLimits.from_plan(plan, timeout)
        wall, cpu, cap, rl = lim.wall, lim.cpu, lim.cap, lim.rlimits
        cg = run_cgroup(self.dir, f"{self.dir.id}-{self.execs}", plan, self.check,
                        kept=self._cgroups, pids=with_relay_tasks(plan))
        attach: list[int] = []
        try:
            attach = cg.attach_fds() if cg else []
            uid, gid = self.uid, self.gid
            env = dict(plan.find(Environment)[0].env)
            egress = plan.find(EgressProxy)
            if tty is not None:   # a pty of the sandbox's own: see _tty()
                argv, stdin, extra_args = self._tty(argv, tty)
            stdin_fd = stdin if stdin is not None else os.open(os.devnull, os.O_RDONLY)
            args_r, args_w = os.pipe()
            status_r, status_w = os.pipe()
            gate_r, gate_w = os.pipe()
            ours = [args_w, status_r, gate_w]          # the supervisor's ends
            theirs = [args_r, status_w, gate_r]        # bwrap's, closed here once it runs
            block_r = -1
            if egress:  # hold the command until the proxy's listener exists inside
                block_r, block_w = os.pipe()
                ours.append(block_w)
                theirs.append(block_r)
            line, blob = self.bwrap_line(argv, args_r=args_r, gate_r=gate_r,
                                         status_w=status_w, block_r=block_r)
            if tty is not None:
                blob += extra_args
            started = time.monotonic()
            subreaper_acquire()
            try:
                pid, out_r, err_r = spawn(
                    line[0], line, env,
                    stdin_fd=stdin_fd, pass_fds=(*theirs, *self.fds.values()),
                    uid=uid if self.root else None, gid=gid if self.root else None,
                    stdout_fd=stdin if tty is not None else None)
            except BaseException:
                subreaper_release()
                for fd in ours:
                    os.close(fd)
                raise
            finally:
                for fd in theirs:
                    os.close(fd)
                if stdin is None:
                    os.close(stdin_fd)

            def kill() -> None:
                kill_pid(pid)
                if cg is not None:
                    cg.kill_all()

            slot.kill = kill

            proxy = None
            init_pid = init_fd = None
            status_rest = b""
            # bwrap's own "execvp" failure goes to the stderr the command would have had
            gate = HeldLine(on_stderr, BWRAP_EXEC_FAILED)
            try:
                try:
                    # False, or a broken pipe: bwrap is gone already (it failed), and
                    # supervise() reports how it ended
                    if _confine(pid, attach, nofile=rl["nofile"], fsize=rl["fsize"],
                                cpu_seconds=math.ceil(cpu) + 1,
                                as_ids=(uid, gid) if self.root else None):
                        _write_all(args_w, blob)
                        os.close(args_w)
                        args_w = -1
                        init_pid = bwrap_child_pid(status_r, block=True)
                        init_fd = _pidfd(init_pid)
                        if init_fd is not None:  # None: bwrap failed building the sandbox
                            if self.one_shot:
                                self._keep_mount_ns(init_fd)
                            os.write(gate_w, self.bpf)
                except BrokenPipeError:
                    pass
                except BaseException:
                    kill()
                    raise
                finally:
                    for fd in (args_w, gate_w):
                        if fd >= 0:
                            os.close(fd)
                if egress:
                    try:
                        if init_fd is None:
                            raise SandboxSetupError("bubblewrap exited before it started "
                                                    "the sandbox", step="bwrap-status")
                        from ..grants import proxy_config

                        config = proxy_config(egress[0].config_json, self.granted, self.ca,
                                              self.upstream_ca)
                        from .host.launch import listen_in_netns
                        from .host.proxy import start_proxy

                        proxy = start_proxy(config, listen_in_netns(init_pid), attach, uid,
                                            gid)
                    except BaseException:
                        kill()
                        raise
                    finally:
                        try:
                            os.write(block_w, b"x")
                        except BrokenPipeError:
                            pass  # bwrap is gone already (killed above): keep the real error
                        os.close(block_w)
                if tty is not None:
                    tty.start()
                outcome = supervise(pid, out_r, err_r, timeout=wall, cpu_time=cpu,
                                    cpu_seconds=cg.cpu_seconds if cg else None, output_cap=cap,
                                    on_stdout=on_stdout, on_stderr=gate.feed, kill=kill,
                                    started=started,
                                    extra={proxy.events_r: proxy.lines} if proxy else None)
            finally:
                if init_pid is None:
                    init_fd = _pidfd(bwrap_child_pid(status_r, block=False))
                else:
                    status_rest = bwrap_status_rest(status_r)
                os.close(status_r)
                if proxy is not None:
                    events += proxy.stop()
                _reap_init(init_fd, cg)
                subreaper_release()
                for fd in attach:
                    os.close(fd)
            usage, oom_kills = usage_of(outcome, cg)  # _reap_init emptied the cgroup
        finally:
            if cg is not None:
                problems = keep_cgroup(cg, self._cgroups)
                if problems:
                    from ..events import TeardownEvent

                    events += [TeardownEvent(p).to_dict() for p in problems]
        exit_code, sig = decode_status(outcome.status or 0, signal_exit_codes=True)
        failed = None
        if (init_pid is not None and exit_code == 1 and not outcome.timed_out
                and not oom_kills and b'"exit-code"' not in status_rest):
            failed = bwrap_exec_failure(gate.line(), argv[0])
            if failed is not None and failed[1].errno == ENOENT:
                failed[1].interpreter = interpreter_inside(self, argv[0])
        events += scratch_events(self.scratch)
        result = finish(outcome, exit_code=exit_code, sig=sig, events=events, usage=usage,
                        oom_kills=oom_kills, wall=wall, cpu=cpu,
                        memory=lim.memory, cap=cap,
                        isolation="namespace", failed=failed)
        if failed is not None:
            gate.replace(result.stderr[:-1])
        else:
            gate.release()
        return result

    def _keep_mount_ns(self, init_fd: int) -> None:
        """host/mountns.py: as root, when nothing is mounted in the run dir but scratch."""
        if self.root and not self._held_ns and self.dir.mounts == [self.scratch]:
            from .host import mountns  # not on `corral run`'s path: corral.run() only

            self._held_ns = mountns.keep(init_fd)

    def _release_mount_ns(self) -> list[str]:
        held, self._held_ns = self._held_ns, ()
        if not held:
            return []
        from .host import mountns

        return mountns.release(held)

    def _tty(self, argv: list[str], term) -> tuple[list[str], int, bytes]:
        """For a tty exec: (argv, the pty slave, bwrap options to add).

        The pty comes from a devpts instance of the run's own (root; mounted once per
        sandbox at <run dir>/pts, bound over the sandbox's /dev/pts, so ttyname() inside
        says /dev/pts/N), else from the host's /dev/ptmx (bwrap then binds it at
        /dev/console). bwrap's --new-session puts the sandbox in a session of bwrap's init
        with no controlling terminal, so the command starts under util-linux's setsid
        --ctty: the command is not a process group leader there, so setsid does not fork:
        it makes a session of the command's own, takes the pty as its controlling terminal
        (TIOCSCTTY) and execs the command in the same process (pid, exit status and
        signals are the command's own). Then ^C on the pty signals the command's
        foreground group, never bwrap."""
        if not os.access(SETSID, os.X_OK):
            raise BackendUnavailable(f"a terminal (-t) on the namespace tier needs "
                                     f"util-linux's {SETSID} (apt-get install util-linux); "
                                     f"or run without -t", field="tty")
        extra = b""
        devpts = None
        if self.root:
            devpts = os.path.join(self.dir.path, "pts")
            if devpts not in self.dir.mounts:
                from ..linux.tty import mount_devpts

                if not os.path.isdir(devpts):
                    os.mkdir(devpts, 0o755)
                try:
                    mount_devpts(devpts, self.uid, self.gid)
                except OSError as e:
                    raise SandboxSetupError(f"mounting a devpts instance on {devpts}: "
                                            f"{e.strerror}", step="tty",
                                            errno=e.errno) from None
                self.dir.mounts.append(devpts)  # close() and the stale sweep unmount it
            extra = f"--dev-bind\0{devpts}\0/dev/pts\0".encode()
        slave = term.open(devpts)
        return [SETSID, "--ctty", "--", *argv], slave, extra

    # -- teardown ------------------------------------------------------------------------
    def close(self, defer_as: str | None = None) -> list[str]:
        """Kill what is left, unmount, delete. Returns teardown problems.

        `defer_as` (corral.run()'s one-shot sandbox: its run id): once every process is
        gone (each exec killed, reaped and its cgroup checked empty before its Result was
        made; end_all() here), the removal of what is left empty (the scratch tmpfs, the
        run dir, the cgroups given to the pool) goes to the teardown thread
        (host/deferred.py, which says where its problems go). Every other mount of the
        run dir (a workspace, its review overlay, a bind of the host's, an image's root)
        is unmounted here first, before close() returns; if one will not go, all of it
        is done here."""
        problems: list[str] = []
        if getattr(self, "_inflight", None) is not None:
            self._inflight.end_all()
        for fd in getattr(self, "fds", {}).values():
            os.close(fd)
        self.fds = {}
        if self.review is not None:
            self.review.close()
        held = self._held_ns
        if getattr(self, "dir", None) is not None:
            kept, self._cgroups = self._cgroups, []
            run_dir, self.dir = self.dir, None
            key = self._ready_key()
            if defer_as is not None:
                from .host.deferred import DEFERRED
            if not (defer_as is not None and not self._inflight.running()
                    and run_dir.unmount_all_but(self.scratch)
                    and run_dir.mounts == [self.scratch]
                    and DEFERRED.submit(defer_as, run_dir.id,
                                        lambda: self._release_mount_ns()
                                        + remove_run(run_dir, kept),
                                        ready=(key, lambda: _make_ready(*key)) if key
                                        else None)):
                problems += self._release_mount_ns() + remove_run(run_dir, kept)
        elif held:
            problems += self._release_mount_ns()
        return problems


def _sweep_off_path():
    """Where a due sweep of dead run dirs goes instead of this thread: the teardown thread
    of host/deferred.py, if this process has one running (it was imported by the first
    deferred close()); None: swept here (the first sandbox of a process, the CLI)."""
    deferred = sys.modules.get("corral.backends.host.deferred")
    return deferred.DEFERRED.run_soon if deferred is not None else None


def _make_ready(size: int, inodes: int):
    """A run dir with its scratch tmpfs mounted, for a later sandbox (host/deferred.py):
    (run dir, its uid, the scratch's path)."""
    d = rundir.RunDir()
    try:
        uid = ids.pick()
        return d, uid, setup_scratch(d, size, inodes, uid, uid, enforce=True)
    except BaseException:
        d.remove()
        raise


def _write_all(fd: int, data: bytes) -> None:
    """All of data into a pipe whose reader is alive (bwrap reads it as it comes)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _confine(pid: int, attach: list[int], *, nofile: int, fsize: int,
             cpu_seconds: int, as_ids: tuple[int, int] | None) -> bool:
    """Put bwrap (waiting for its arguments) in the run's cgroup and give it the run's
    rlimits; every process it starts inherits both. False if it is gone already.
    `as_ids`: its uid:gid when corral is root, taken as this thread's real ids for the
    prlimit(2) calls (root may lack CAP_SYS_RESOURCE, as in many containers)."""
    try:
        if attach:
            limits.RunCgroup.attach(attach, pid)
        if as_ids is None:
            limits.apply_rlimits(nofile=nofile, fsize=fsize, cpu_seconds=cpu_seconds,
                                 nproc=None, pid=pid)
        else:
            with real_ids(*as_ids):
                limits.apply_rlimits(nofile=nofile, fsize=fsize, cpu_seconds=cpu_seconds,
                                     nproc=None, pid=pid)
    except SandboxSetupError as e:
        if e.errno == ESRCH:
            return False
        raise
    return True


def _pidfd(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def _reap_init(init_fd: int | None, cg) -> None:
    """Kill and reap bwrap's init (through its pidfd, taken while it lived: a recycled pid
    is never touched), then empty the run's cgroup. bwrap's monitor exits as soon as init
    reports the command's exit, and init, its parent-death signal on the way, is left to us
    as its subreaper. Its exit takes the whole pid namespace with it, so waiting for it
    first usually leaves the cgroup empty and kill_all() only checks (a cgroup still
    holding the dying init would be frozen, signalled and polled: 2 ms sleeps)."""
    if init_fd is not None:
        try:
            try:
                _signal.pidfd_send_signal(init_fd, 9)   # SIGKILL
            except ProcessLookupError:
                pass
            poller = select.poll()
            poller.register(init_fd, select.POLLIN)
            poller.poll(2000)                  # readable once it has exited
            try:
                os.waitid(os.P_PIDFD, init_fd, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                pass  # bwrap's monitor reaped it
        finally:
            os.close(init_fd)
    if cg is not None:
        cg.kill_all()
