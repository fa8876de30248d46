"""The gvisor tier: runsc, gVisor's user-space kernel, + cgroups.

The command's system calls are served by gVisor's Sentry, a kernel written in Go that runs
as an unprivileged host process under a strict seccomp filter of its own; files reach it
through the gofer, a second runsc process that sees only the mounts of the OCI bundle. The
host kernel's syscall surface the workload can reach is the Sentry's, not its own.

Steps of one sandbox, in order (each names what enforces it):
 1. a run directory on the host, locked for the supervisor's life (rundir.py)
 2. /scratch: a tmpfs mounted by corral on the host with size= and nr_inodes=, owned by the
    run's own unprivileged uid; /tmp and /dev/shm are directories of the same tmpfs
 3. the workspace, if any: an idmapped mount (owner -> the run's uid), nosuid, nodev
 4. a root directory of mount points and the /bin, /lib, ... symlinks (read-only in the
    bundle), the state directory of runsc (--root) and the bundle, all in the run dir
 5. per exec: config.json (the read-only system root and the minimal /etc of the namespace
    tier, scratch, workspace, ro_binds, env, cwd, rlimits, no capabilities, no new
    privileges, a user namespace mapping the container's root to the run's uid, and the
    namespace tier's syscall deny list as an OCI seccomp profile applied inside gVisor),
    a cgroup (memory+swap, pids, cpu quota, cpu accounting) that runsc joins before exec,
    so its gofer, Sentry and ptrace stubs are all in it
 6. network allow only, per exec: two network namespaces joined by a veth, the sandbox's
    bound at <run dir>/netns-N, the other holding only the proxy's listener, and the proxy
    process serving it (gvisor_net.py; in the cgroup, as the run's uid)
 7. `runsc --network=none|sandbox --platform=P --ignore-cgroups --oci-seccomp run` (P: systrap
    where this runsc has it, else ptrace; CORRAL_GVISOR_PLATFORM overrides),
    with a parent-death signal; runsc starts the gofer and the Sentry attached to itself
    (they die with it)
 8. the supervisor watches output, wall clock, the cgroup's CPU counter and the proxy's
    events; at the end it stops the proxy (collecting its last events), kills everything
    left in the cgroup (freezer, SIGKILL) and removes the cgroup, unmounts the netns, and
    drops what runsc kept of the container in its state dir (a clean exit leaves nothing;
    after a kill the files are removed directly, since the emptied cgroup proves nothing
    of the container is left: `runsc delete --force` would SIGKILL recorded pids that may
    have been recycled, and waits a second for them; it is used only without a cgroup)
 9. if the supervisor dies instead: runsc and the proxy get SIGKILL (parent-death signal),
    the gofer and Sentry die with runsc (it starts them attached), and the next corral
    start finds the run dir unlocked and removes it (mounts, the netns binding included,
    runsc's state files) and its cgroups

Who is who: inside, the command runs as uid 0 of gVisor's kernel, with no capabilities
(no CAP_CHOWN, CAP_SYS_ADMIN, CAP_NET_RAW, ... in gVisor's own user namespace). That root
is not host root: the Sentry runs in a user namespace of its own as a second unprivileged
host uid of the run's (runsc always makes it uid 65534 of runsc's own user namespace, so
runsc runs in one of the sandbox's where 65534 is that uid: enter_userns; no two live
sandboxes share it, so one Sentry cannot signal or ptrace another's), and the gofer, which
does the file I/O, runs in a user namespace where container uid 0 is the run's
unprivileged host uid and nothing else is mapped. So gVisor's root can read and write
only what that host uid may (other-readable files under the bundle's mounts, the scratch
tmpfs, the idmapped workspace) and nothing outside the bundle's mounts; host /proc, /sys,
devices, sockets and other processes are not there at all (gVisor's /proc and /sys are its
own). Files it writes land on the host owned by the run's uid (the workspace owner on the
idmapped workspace).

Limits and their enforcer: memory, CPU quota and CPU time by the run's host cgroup, which
holds every runsc process, so gVisor's own memory (~20 MiB) counts against limits.memory;
pids by RLIMIT_NPROC inside gVisor (its kernel counts the sandbox's tasks; root without
CAP_SYS_RESOURCE is bound by it), with a looser pids cgroup as a second layer for the host
threads gVisor needs; open files, file size and core dumps by rlimits inside gVisor; the
wall clock and output caps by the supervisor.

Network: `none` is runsc --network=none, a netstack with loopback only. `allow` is
runsc --network=sandbox in a network namespace of corral's own (gvisor_net.py): gVisor's
netstack gets its loopback and one veth, whose /30 is its only route; the far end of the
veth is a second namespace holding nothing but the egress proxy's listener on
10.255.255.253:3128 (HTTP_PROXY and friends point there instead of 127.0.0.1:3128, which
inside is netstack's own loopback). No default route, no resolver, no IPv6 off loopback;
raw and packet sockets need CAP_NET_RAW, which the container does not have, and netlink
changes need CAP_NET_ADMIN. Secret grants: the run's CA bundle is bound at
/etc/corral-ca.pem as on the namespace tier. runsc itself runs in a mount namespace of its
own where /proc/sys/net is hidden (gvisor_net.runsc_mount_view: this runsc mistakes any
namespace for the host's on Linux 6.x otherwise). hostinet (--network=host) was the first
idea and does not work with this runsc: see gvisor_net.py.

Known gaps of Debian's runsc 20221219 (fixed in later gVisor): statx(2) with
AT_NO_AUTOMOUNT, as used by coreutils 9 `ls FILE` and `stat`, fails with EINVAL; OCI
seccomp errnoRet is ignored (every rule answers EPERM), so only the EPERM rules of the deny
list are applied (the ENOSYS ones cover calls this Sentry does not implement).
"""

from __future__ import annotations

import json
import math
import os
import time

from ..errors import BackendUnavailable, SandboxSetupError
from ..events import TeardownEvent
from ..linux import limits, rundir, seccomp
from ..linux._sys import mount, set_pdeathsig, subreaper_acquire, subreaper_release
from ..linux.supervise import (
    ENOENT,
    HeldLine,
    decode_status,
    kill_pid,
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
from .gvisor_runsc import (
    RUNSC_FAILED,
    RUNSC_FAILED_PREFIX,
    _exec_failure,
    _is_of,
    _reap,
    delete_container,
    enter_userns,
    reap_strays,
    remove_state,
    runsc_error,
    runsc_userns,
)
from .host.cgroups import destroy_cgroup, run_cgroup, usage_of
from .host.etc import HOSTNAME, ensure_etc
from .host.finish import Inflight, finish, interpreter_inside
from .host.ids import free_uids
from .host.proxy import egress_files, start_proxy, with_relay_tasks
from .host.scratch import mount_binds, mount_workspace, open_source, scratch_events, setup_scratch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar




SIGKILL, SIGXCPU = 9, 24


#: the platform when this runsc has no systrap; "kvm" needs a /dev/kvm that works
DEFAULT_PLATFORM = "ptrace"


PLATFORM_ENV = "CORRAL_GVISOR_PLATFORM"


#: a directory: runsc writes its debug logs (one file per runsc process) there
DEBUG_ENV = "CORRAL_GVISOR_DEBUG_LOG"








#: host tasks (threads) gVisor needs beside the sandbox's own: Go runtime threads of the
#: Sentry and the gofer, and ptrace stub processes and threads
PIDS_OVERHEAD = 256


PIDS_PER_TASK = 3


#: explain's network note for `allow` on this tier
EGRESS_NOTE = ("only through the egress proxy at {url} (HTTP_PROXY and friends), which "
               "enforces the allow list; the sandbox's netstack has no default route and no "
               "resolver, and its one link, a veth, ends at the proxy's listener and nothing "
               "else")


#: the mount points every root has, besides those of SYSTEM_PATHS, ro_binds and workspace
BASE_DIRS = ("etc", "proc", "dev", "tmp", SCRATCH[1:], WORKSPACE[1:])


def find_runsc() -> str | None:
    for d in ("/usr/bin", "/usr/local/bin", "/usr/sbin", "/bin"):
        p = os.path.join(d, "runsc")
        if os.access(p, os.X_OK):
            return p
    import shutil

    return shutil.which("runsc")


_platforms: dict[str, tuple[str, ...]] = {}


def runsc_platforms(runsc: str) -> tuple[str, ...]:
    """The platforms this runsc names in `runsc flags` ("ptrace (default), kvm" in the 2022
    releases; "systrap" in later ones)."""
    if runsc not in _platforms:
        import re
        import subprocess

        try:
            text = subprocess.run([runsc, "flags"], capture_output=True, text=True,
                                  timeout=10, check=False).stderr
        except (OSError, subprocess.SubprocessError):
            text = ""
        m = re.search(r"-platform string\s*\n\s*(.*)", text)
        names = re.findall(r"\b(ptrace|kvm|systrap)\b", m.group(1)) if m else []
        _platforms[runsc] = tuple(dict.fromkeys(names)) or (DEFAULT_PLATFORM,)
    return _platforms[runsc]


def oci_seccomp() -> dict:
    """seccomp.py's deny list as an OCI profile (default allow), evaluated by the Sentry for
    every system call of the sandbox (runsc --oci-seccomp). Only the rules answering EPERM:
    this runsc ignores errnoRet, and the ENOSYS/EOPNOTSUPP rules would otherwise answer
    EPERM, which makes glibc give up instead of falling back (clone3 -> clone)."""
    calls = []
    for rule in seccomp.rules():
        if rule.errno != seccomp.EPERM or not isinstance(rule.syscall, str):
            continue  # numbered ones are newer than this Sentry, which answers ENOSYS
        args = []
        for c in rule.when:
            if c.op == "masked_eq":
                args.append({"index": c.arg, "value": c.mask, "valueTwo": c.value,
                             "op": "SCMP_CMP_MASKED_EQ"})
            elif c.op == "gt":
                args.append({"index": c.arg, "value": c.value, "op": "SCMP_CMP_GT"})
            else:  # pragma: no cover - seccomp.py grew an operator
                raise AssertionError(f"unknown seccomp operator {c.op!r}")
        entry: dict = {"names": [rule.syscall], "action": "SCMP_ACT_ERRNO"}
        if args:
            entry["args"] = args
        calls.append(entry)
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": calls}


class GvisorBackend(Backend):
    name = "gvisor"
    mechanism = "runsc (gVisor's user-space kernel) + cgroups"
    own_kernel = "user-space"
    #: fixed properties of the tier that `explain` reports and the probe suite cites
    properties: ClassVar[dict[str, bool]] = {"own_kernel": True, "user_space_kernel": True,
                                             "pid_isolation": True,
                                             "host_fs_hidden": True, "no_host_root": True,
                                             "kernel_surface_filtered": True,
                                             "network_namespace": True, "read_only_root": True}

    def auto_skip(self) -> str | None:
        """Why `isolation = "auto"` should pass this tier over here, or None. Debian 12's
        runsc (release 20221219) rejects the statx flag AT_NO_AUTOMOUNT that Debian's
        coreutils use, so `ls` and `stat` fail inside: asked for by name it still runs,
        but auto does not pick a tier that breaks common commands."""
        import subprocess

        try:
            out = subprocess.run([self.runsc or "runsc", "--version"], capture_output=True,
                                 text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return "runsc --version failed"
        if "20221219" in out:
            return "this runsc (20221219) breaks statx, so ls and stat fail inside"
        return None

    @property
    def egress_note(self) -> str:
        from .gvisor_net import PROXY_URL

        return EGRESS_NOTE.format(url=PROXY_URL)

    def describe(self, op: Op) -> tuple[str, str]:
        """How this tier enforces an op: (enforced_by, note)."""
        match op:
            case MemoryLimit():
                return "kernel", ("host memory cgroup around every runsc process (gVisor's "
                                  "own ~20 MiB included), swap included; oom verdict from "
                                  "its counter")
            case PidsLimit():
                return "kernel", ("RLIMIT_NPROC in gVisor's kernel (the sandbox's tasks); "
                                  "a looser host pids cgroup for gVisor's own threads")
            case CpuQuota():
                return "kernel", "host cpu cgroup (CFS quota) around every runsc process"
            case CpuTime():
                return "supervisor", ("the run's cgroup CPU counter (gVisor's own CPU "
                                      "included), polled; RLIMIT_CPU in gVisor as a second "
                                      "layer")
            case WallClock():
                return "supervisor", "wall clock; then every process of the run is killed"
            case OutputCap():
                return "supervisor", "bytes past the cap are read and dropped"
            case Rlimit():
                return "kernel", f"RLIMIT_{op.name.upper()} in gVisor's kernel"
            case Scratch():
                return "kernel", ("host tmpfs with size= and nr_inodes=, through the gofer; "
                                  "/tmp and /dev/shm on it")
            case WorkspaceMount():
                if op.review:
                    return "kernel", ("host overlay (upper layer in scratch, lower a "
                                      "read-only idmapped clone) bound through the gofer; "
                                      "writes reach the host only when applied")
                return "kernel", ("idmapped bind mount through the gofer, nosuid, nodev"
                                  + ("" if op.writable else ", read-only"))
            case ReadOnlyBind():
                return "kernel", "read-only bind mount through the gofer"
            case Environment():
                return "supervisor", "only corral's base, env.pass and env.set"
            case NoNetwork():
                return "kernel", ("gVisor's netstack: loopback only (runsc --network=none); "
                                  "with network allow, plus one veth whose only peer is the "
                                  "proxy's listener, in network namespaces of corral's own")
            case EgressProxy():
                from .gvisor_net import PROXY_URL

                return "proxy", (f"egress proxy at {PROXY_URL} (HTTP_PROXY), the only "
                                 "address the sandbox's netstack can reach: a veth into a "
                                 "namespace holding nothing but the proxy's listener")
            case Seccomp():
                return "kernel", ("gVisor's Sentry serves every syscall (runsc's own host "
                                  "seccomp filter confines the Sentry); seccomp.py's EPERM "
                                  "rules applied inside gVisor (OCI seccomp) to each run's "
                                  "process tree; a live sandbox's commands (runsc exec) go "
                                  "without them, with an unenforced event")
            case Namespaces():
                return "kernel", ("gVisor's own kernel; uid 0 there with no capabilities, "
                                  "no_new_privs; gofer and Sentry in user namespaces as "
                                  "unprivileged host uids")
            case SystemRoot():
                return "kernel", "read-only binds of /usr, /lib*, a minimal /etc"
            case ImageRoot():
                from .namespace import _image_note

                return "kernel", _image_note(op).replace("bind of", "OCI root on")
            case _:
                assert_never(op)

    def __init__(self, platform: str | None = None) -> None:
        self.runsc = find_runsc()
        self._platform = platform or os.environ.get(PLATFORM_ENV)
        self.root = os.geteuid() == 0

    @property
    def platform(self) -> str:
        """The one asked for, else systrap where this runsc has it (gVisor's default since
        2023: no ptrace stops, no device), else ptrace. kvm only when asked for: a nested
        or paravirtual /dev/kvm may exist and not run gVisor (it hangs on this host)."""
        if self._platform is None:
            offered = runsc_platforms(self.runsc) if self.runsc else ()
            self._platform = "systrap" if "systrap" in offered else DEFAULT_PLATFORM
        return self._platform

    def check(self, plan: Plan) -> TierCheck:
        if self.runsc is None:
            raise BackendUnavailable("runsc (gVisor) is not installed; apt-get install runsc, "
                                     "or use isolation = \"namespace\"", field="isolation")
        if not self.root:
            raise BackendUnavailable("the gvisor tier needs root here (runsc builds the "
                                     "sandbox's namespaces, chroot and user mapping); run "
                                     "corral as root or use isolation = \"namespace\"",
                                     field="isolation")
        if self.platform != DEFAULT_PLATFORM:
            offered = runsc_platforms(self.runsc)
            if self.platform not in offered:
                raise BackendUnavailable(f"this runsc has no platform {self.platform!r} (it "
                                         f"offers {', '.join(offered)}); unset {PLATFORM_ENV}",
                                         field="isolation")
            if self.platform == "kvm" and not os.access("/dev/kvm", os.R_OK | os.W_OK):
                raise BackendUnavailable(f"the kvm platform needs a usable /dev/kvm; unset "
                                         f"{PLATFORM_ENV} to use ptrace", field="isolation")
        cg = limits.detect()
        missing: list[tuple[Op, str]] = []
        for op in plan.ops:
            match op:
                case MemoryLimit():
                    if not cg.memory:
                        missing.append((op, f"no usable memory cgroup: {cg.reason}"))
                case CpuQuota():
                    if not cg.cpu:
                        missing.append((op, f"no usable cpu cgroup: {cg.reason}"))
                case CpuTime():
                    if not cg.cpu:
                        why = "only per-process RLIMIT_CPU inside gVisor, not the run's total"
                        missing.append((op, f"{why}: {cg.reason}"))
                case WorkspaceMount():
                    from ..linux import idmap

                    ok = idmap.supported(op.path)
                    if ok is not True:
                        missing.append((op, f"the workspace cannot be idmapped: {ok}"))
                case EgressProxy():
                    from .gvisor_net import veth_available

                    ok = veth_available()
                    if ok is not True:
                        missing.append((op, ok))
                case ImageRoot():
                    binds = [b.path for b in plan.find(ReadOnlyBind)]
                    if binds:
                        from ..images.resolve import missing_mount_points

                        for path in missing_mount_points(op, binds):
                            missing.append((op, f"{path} (filesystem.ro_binds) has no "
                                                f"mount point in image {op.ref}"))
                case (Namespaces() | SystemRoot() | Seccomp() | Scratch() | PidsLimit()
                      | WallClock() | OutputCap() | Rlimit() | Environment() | NoNetwork()
                      | ReadOnlyBind()):
                    pass
                case _:
                    assert_never(op)
        return TierCheck.of(self.name, plan, missing)

    def open(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None
             ) -> GvisorSandbox:
        return GvisorSandbox(self, plan, check.admit(self.name), list(granted), upstream_ca)

    def open_live(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None):
        """One runsc sandbox for the sandbox's life, commands started with runsc exec."""
        from .gvisor_live import GvisorLive

        return GvisorLive(self, plan, check.admit(self.name), list(granted), upstream_ca)


class GvisorSandbox(LiveSandbox):
    def __init__(self, backend: GvisorBackend, plan: Plan, check: TierCheck,
                 granted: list | None = None, upstream_ca: str | None = None) -> None:
        self.granted = granted or []
        self.upstream_ca = upstream_ca
        self.ca: tuple[str, str] | None = None
        self.ca_file: str | None = None
        self.backend = backend
        self.plan = plan
        self.check = check   # what it leaves unenforced here (backends/base.py)
        self.events = check.events()   # standing events, copied per exec
        self.execs = 0
        #: the execs running now, which close() ends (one in another thread, say)
        self._inflight = Inflight()
        rundir.sweep_if_due()
        self.dir = rundir.RunDir()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------------------
    def _setup(self) -> None:
        plan = self.plan
        # the run's uid (the gofer's, and the owner of scratch) and the Sentry's, its own
        self.uid, self.sentry_uid = free_uids(2)
        self.gid = self.uid
        self.userns = runsc_userns(self.uid, self.sentry_uid)
        self.etc, _ = ensure_etc(self.dir.base, prebind=False)   # binds ETC_BINDS itself
        scratch = plan.find(Scratch)[0]
        self.scratch = setup_scratch(self.dir, scratch.size, scratch.inodes, self.uid,
                                     self.gid, enforce=not self._unenforced(scratch))
        # the workspace and ro_binds, each opened without following a symbolic link
        # (host/scratch.open_source) and mounted from that fd at a path of the run dir, which
        # the bundle names: runsc's gofer never looks up the user's path itself
        self.workspace_src = None
        for ws in plan.find(WorkspaceMount):
            fd = open_source(ws.path, ws.rule, directory=True)
            if ws.review:   # the overlay (backends/host/review.py) is the gofer's workspace
                from .host.review import mount_review

                self.review = mount_review(self.dir, fd, self.scratch, self.uid, self.gid,
                                           ws.path)   # keeps fd
                self.workspace_src = self.review.merged
                continue
            try:
                self.workspace_src = mount_workspace(self.dir, fd, ws.writable, self.uid,
                                                     self.gid)
            finally:
                os.close(fd)
        self.bind_src = mount_binds(self.dir, plan.find(ReadOnlyBind))
        if plan.find(EgressProxy):
            self._setup_egress()
        self.rootfs = self._make_rootfs()
        self.state = self.dir.sub("runsc", 0o700)   # runsc --root: its container state
        self.bundle = self.dir.sub("bundle", 0o700)
        #: runsc's log (--log): its own errors, apart from the command's stderr
        self.log = os.path.join(self.bundle, "runsc.log")
        self.spec = self._spec()

    def _unenforced(self, op: Op) -> bool:
        return not self.check.enforces(op)

    def _setup_egress(self) -> None:
        """The run's CA (its key stays here and in the proxy) when secrets are granted, a
        copy of upstream_ca the proxy can read as the run's uid, and the mount point of the
        fresh proc runsc's own mount view needs (gvisor_net.runsc_mount_view)."""
        self.ca, self.ca_file, self.upstream_ca = egress_files(self.dir, self.granted,
                                                               self.upstream_ca)
        self.host_proc = self.dir.sub("proc", 0o700)

    def _make_rootfs(self) -> str:
        """The bundle's root: empty mount points and the host's /bin -> usr/bin style
        symlinks, nothing else. Read-only in the spec; gVisor mounts the rest on it."""
        root = self.dir.sub("rootfs", 0o755)
        for op in self.plan.find(ImageRoot):
            if op.layers:   # the layers over the tree: the shared read-only overlay
                from .host.imageroot import image_root

                return self._image_rootfs(root, image_root(self.dir, op))
            return self._image_rootfs(root, op.tree)
        # a mount of its own without nosuid/nodev: the gofer remounts the root read-only
        # from inside its user namespace, which may not drop flags locked on the mount
        # that holds it (/run/corral is a nosuid,nodev tmpfs)
        try:
            mount("tmpfs", root, "tmpfs", 0, "mode=0755,size=1m,nr_inodes=4096")
        except OSError as e:
            raise SandboxSetupError(f"mounting the root directory on {root}: {e.strerror}",
                                    step="rootfs", errno=e.errno) from None
        self.dir.mounts.append(root)
        for p in SYSTEM_PATHS:
            if os.path.islink(p):
                os.symlink(os.readlink(p), os.path.join(root, p[1:]))
            elif os.path.isdir(p):
                os.mkdir(os.path.join(root, p[1:]), 0o755)
        for d in BASE_DIRS:
            os.makedirs(os.path.join(root, d), 0o755, exist_ok=True)
        os.mkdir(os.path.join(root, "dev", "shm"), 0o755)
        # mount points of the binds and of a workspace at its host path (runsc makes those
        # below /tmp and /scratch itself, in the sandbox's tmpfs mounted there)
        for dest, src in [*((op.path, self.bind_src[op.path])
                            for op in self.plan.find(ReadOnlyBind)),
                          *((op.dest, self.workspace_src)
                            for op in self.plan.find(WorkspaceMount) if op.dest != WORKSPACE)]:
            dst = os.path.join(root, dest.lstrip("/"))
            if os.path.lexists(dst):
                continue
            os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
            if os.path.isdir(src):
                os.mkdir(dst, 0o755)
            else:
                open(dst, "w").close()
        return root

    def _image_rootfs(self, root: str, tree: str) -> str:
        """An image's tree as the bundle's root: a read-only bind of the store's tree of its
        own (the gofer remounts it read-only from its user namespace; see _make_rootfs)."""
        try:
            mount(tree, root, "", 0x1000, "")   # MS_BIND
        except OSError as e:
            raise SandboxSetupError(f"binding the image tree on {root}: {e.strerror}",
                                    step="rootfs", errno=e.errno) from None
        self.dir.mounts.append(root)
        return root

    def _spec(self) -> dict:
        """config.json without the process's args (filled in per exec)."""
        plan = self.plan
        mounts: list[dict] = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        ]

        def bind(src: str, dst: str, writable: bool = False) -> None:
            mounts.append({"destination": dst, "type": "bind", "source": src,
                           "options": ["rbind", "rw" if writable else "ro"]})

        rlimits = []
        env: list[str] = []
        namespaces = []
        for op in plan.ops:
            match op:
                case Namespaces():
                    namespaces = [{"type": t} for t in
                                  ("pid", "network", "ipc", "uts", "mount", "user")]
                case SystemRoot():
                    for p in SYSTEM_PATHS:
                        if os.path.isdir(p) and not os.path.islink(p):
                            bind(p, p)
                    bind(self.etc, "/etc")
                    for p in ETC_BINDS:
                        if os.path.exists(p):
                            bind(os.path.realpath(p), p)
                case ImageRoot():
                    pass   # the store's tree is the bundle's root (_make_rootfs)
                case Scratch():
                    bind(os.path.join(self.scratch, "home"), SCRATCH, True)
                    bind(os.path.join(self.scratch, "tmp"), "/tmp", True)
                    bind(os.path.join(self.scratch, "shm"), "/dev/shm", True)
                case WorkspaceMount():
                    bind(self.workspace_src, op.dest, op.writable or op.review)
                case ReadOnlyBind():
                    bind(self.bind_src[op.path], op.path)
                case Environment():
                    # the proxy is at the veth's far end here, not on the loopback
                    from ..plan import PROXY_URL
                    from .gvisor_net import PROXY_URL as VETH_PROXY_URL

                    env = [f"{k}={VETH_PROXY_URL if v == PROXY_URL else v}"
                           for k, v in op.env]
                case Rlimit():
                    name = f"RLIMIT_{op.name.upper()}"
                    rlimits.append({"type": name, "hard": op.value, "soft": op.value})
                case PidsLimit():
                    # gVisor's kernel counts the sandbox's tasks against RLIMIT_NPROC
                    rlimits.append({"type": "RLIMIT_NPROC", "hard": op.count,
                                    "soft": op.count})
                case CpuTime():
                    soft = math.ceil(op.seconds) + 1   # a second layer under the cgroup's
                    rlimits.append({"type": "RLIMIT_CPU", "hard": soft + 1, "soft": soft})
                case EgressProxy():
                    # per exec: the network namespaces, the proxy; the run's CA bundle here
                    if self.ca_file:
                        from ..grants import CA_BUNDLE

                        bind(self.ca_file, CA_BUNDLE)
                case (Seccomp() | NoNetwork() | MemoryLimit() | CpuQuota() | WallClock()
                      | OutputCap()):
                    pass  # below, runsc flags, the cgroup or the supervisor
                case _:
                    assert_never(op)
        no_caps: dict = {k: [] for k in ("bounding", "effective", "inheritable",
                                         "permitted", "ambient")}
        linux: dict = {
            "namespaces": namespaces,
            "uidMappings": [{"containerID": 0, "hostID": self.uid, "size": 1}],
            "gidMappings": [{"containerID": 0, "hostID": self.gid, "size": 1}],
        }
        if plan.find(Seccomp):
            linux["seccomp"] = oci_seccomp()
        return {
            "ociVersion": "1.0.2",
            "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": [],
                        "env": env, "cwd": plan.cwd, "capabilities": no_caps,
                        "rlimits": rlimits, "noNewPrivileges": True},
            "root": {"path": self.rootfs, "readonly": True},
            "hostname": HOSTNAME,
            "mounts": mounts,
            "linux": linux,
        }

    def runsc_child_setup(self, attach: list[int], net: bool):
        """What runsc's child does between fork and exec (one-shot and live): join the
        run's cgroup (`attach`), no core dumps, the network's mount view (`net`), the
        sandbox's user namespace (runsc's nobody is the Sentry's uid there), SIGKILL at
        its parent's death, and exit if that parent is already gone."""
        parent = os.getpid()
        host_proc = getattr(self, "host_proc", None)
        userns = self.userns

        def child_setup() -> None:
            if attach:
                limits.RunCgroup.attach_self(attach)
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if net:
                from .gvisor_net import runsc_mount_view

                runsc_mount_view(host_proc)
            enter_userns(userns)
            set_pdeathsig(SIGKILL)
            if os.getppid() != parent:
                os._exit(125)

        return child_setup

    def runsc_argv(self, container_id: str) -> list[str]:
        b = self.backend
        a = [b.runsc or "runsc", f"--root={self.state}", f"--platform={b.platform}",
             "--ignore-cgroups", f"--log={self.log}", "--log-format=json"]
        if self.plan.find(EgressProxy):
            a.append("--network=sandbox")  # netstack on the veth of gvisor_net
        elif self.plan.find(NoNetwork):
            a.append("--network=none")
        if self.plan.find(Seccomp):
            a.append("--oci-seccomp")
        debug = os.environ.get(DEBUG_ENV)
        if debug:
            a += ["--debug", f"--debug-log={debug.rstrip('/')}/", "--strace"]
        return a + ["run", f"--bundle={self.bundle}", container_id]

    # -- exec ----------------------------------------------------------------------------
    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None, tty=None) -> Result:
        if not argv:
            raise SandboxSetupError("no command given", step="exec")
        plan = self.plan
        self.execs += 1
        cid = f"{self.dir.id}-{self.execs}"
        events = [dict(e) for e in self.events]
        lim = ExecLimits.from_plan(plan, timeout)
        egress = plan.find(EgressProxy)
        net = None
        if egress:  # this exec's network namespaces: the sandbox's bound in the run dir
            from .gvisor_net import ProxyNet

            net_path = os.path.join(self.dir.path, f"netns-{self.execs}")
            self.dir.mounts.append(net_path)  # close() and the stale sweep unmount it too
            net = ProxyNet.create(net_path, owner=self.userns)
        try:
            with self._inflight.run() as slot:
                return self._exec(argv, cid, events, lim, egress, net, stdin=stdin,
                                  on_stdout=on_stdout, on_stderr=on_stderr, tty=tty,
                                  slot=slot)
        finally:
            if net is not None:
                problems = net.close()
                if not problems:
                    self.dir.mounts.remove(net.path)
                # a Result is returned already; problems here only delay the run dir's
                # removal (close() and the sweep unmount what is left)

    def _exec(self, argv, cid, events, lim: ExecLimits, egress, net, *, stdin, on_stdout,
              on_stderr, tty=None, slot=None) -> Result:
        plan = self.plan
        wall, cpu, cap = lim.wall, lim.cpu, lim.cap
        spec = dict(self.spec)
        # terminal: runsc makes a host pty, the controlling terminal of its sandbox process
        # (so ^C signals the Sentry, which passes it to the foreground group inside), hands
        # the slave to the Sentry as the command's terminal and the master to us
        # (--console-socket, corral.linux.tty)
        spec["process"] = dict(spec["process"], args=list(argv), terminal=tty is not None)
        if net is not None:
            spec["linux"] = dict(spec["linux"], namespaces=[
                dict(ns, path=net.path) if ns["type"] == "network" else ns
                for ns in spec["linux"]["namespaces"]])
        tmp = os.path.join(self.bundle, "config.json.tmp")
        with open(tmp, "w") as f:
            json.dump(spec, f)
        os.replace(tmp, os.path.join(self.bundle, "config.json"))
        # without a pids cgroup, RLIMIT_NPROC inside gVisor still holds
        cg = run_cgroup(self.dir, cid, plan, self.check,
                        pids=with_relay_tasks(plan, lambda n: n * PIDS_PER_TASK
                                              + PIDS_OVERHEAD))
        attach: list[int] = []
        proxy = None
        reaping = False
        try:
            attach = cg.attach_fds() if cg else []
            child_setup = self.runsc_child_setup(attach, net is not None)

            if net is not None:  # the proxy serves the listener before runsc starts
                from ..grants import proxy_config

                config = proxy_config(egress[0].config_json, self.granted, self.ca,
                                      self.upstream_ca)
                proxy = start_proxy(config, net.take_listener(), attach, self.uid, self.gid)
            stdin_fd = stdin if stdin is not None else os.open(os.devnull, os.O_RDONLY)
            argv_runsc = self.runsc_argv(cid)
            if tty is not None:  # runsc makes the pty and sends us its master
                console = tty.console_socket(os.path.join(self.dir.path, "console"))
                argv_runsc[-1:-1] = [f"--console-socket={console}"]
            try:
                os.unlink(self.log)   # one exec's errors only
            except FileNotFoundError:
                pass
            # runsc's own failure is written to the stderr the command would have had
            gate = HeldLine(on_stderr, RUNSC_FAILED_PREFIX)
            started = time.monotonic()
            # runsc's gofer and Sentry are orphaned when a kill ends runsc first; as a
            # subreaper we get them and reap their zombies (a PID 1 may never do it)
            subreaper_acquire()
            reaping = True
            try:
                pid, out_r, err_r = spawn(argv_runsc[0], argv_runsc,
                                          {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                                          stdin_fd=stdin_fd, pass_fds=(),
                                          child_setup=child_setup)
            finally:
                if stdin is None:
                    os.close(stdin_fd)
            # every process of the run seen while it ran: those runsc leaves behind when it
            # exits first come to us (the subreaper) and are reaped below. The watch samples
            # the cgroup each time it reads the CPU counter (every 50 ms); a process that
            # ends while its parent lives is reaped by that parent.
            members: set[int] = set()

            def cpu_seconds() -> float:
                members.update(cg.pids())
                return cg.cpu_seconds()

            def kill() -> None:
                if cg is not None:
                    members.update(cg.pids())
                kill_pid(pid)
                if cg is not None:
                    cg.kill_all()

            if slot is not None:
                slot.kill = kill
            try:
                if tty is not None:
                    tty.start()
                outcome = supervise(pid, out_r, err_r, timeout=wall, cpu_time=cpu,
                                    cpu_seconds=cpu_seconds if cg else None,
                                    output_cap=cap, on_stdout=on_stdout, on_stderr=gate.feed,
                                    kill=kill, started=started,
                                    extra={proxy.events_r: proxy.lines} if proxy else None)
            finally:
                if proxy is not None:  # its last events first, then everything else
                    events += proxy.stop()
                    proxy = None
                for fd in attach:
                    os.close(fd)
                attach = []
                if cg is not None:
                    members.update(cg.pids())
                    cg.kill_all()  # nothing of the run outlives it
                    _reap(members - {pid})
                reap_strays({self.uid, self.sentry_uid})   # this exec's late, earlier ones'
                events += self._forget(cid, emptied=cg is not None)
            usage, oom_kills = usage_of(outcome, cg)
        finally:
            if reaping:
                subreaper_release()
            if proxy is not None:  # runsc never started
                proxy.stop()
            for fd in attach:
                os.close(fd)
            if cg is not None:
                events += [TeardownEvent(p).to_dict() for p in destroy_cgroup(cg)]
        exit_code, sig = decode_status(outcome.status or 0, signal_exit_codes=True)
        failed = None
        if exit_code == RUNSC_FAILED and not outcome.timed_out and not oom_kills:
            error = runsc_error(self.log)   # runsc's own word that it failed, or None
            if error is not None:
                failed = _exec_failure(error, argv[0])
                if failed is None:
                    gate.replace_with_nothing()   # the error below says it, once
                    raise SandboxSetupError(f"runsc failed: {error}", step="runsc")
                if failed[1].errno == ENOENT and "failed to load " in error:
                    failed[1].interpreter = interpreter_inside(self, argv[0])
        events += scratch_events(self.scratch)
        result = finish(outcome, exit_code=exit_code, sig=sig, events=events, usage=usage,
                        oom_kills=oom_kills, wall=wall, cpu=cpu,
                        memory=lim.memory, cap=cap, isolation="gvisor",
                        failed=failed)
        if failed is not None:
            gate.replace(result.stderr[:-1])
        else:
            gate.release()
        return result

    def _forget(self, cid: str, *, emptied: bool) -> list[dict]:
        """Remove what runsc keeps of container `cid` in its state dir; a clean exit leaves
        nothing. With `emptied` (the run's cgroup was killed and is empty, so no process of
        the container is left) the files are simply removed: `runsc delete --force` would
        only SIGKILL the recorded pids of processes already gone (a recycled pid could be
        someone else's) and wait a second for them. Without a cgroup, runsc delete does it
        (the processes were killed by their parent-death signal)."""
        try:
            left = [n for n in os.listdir(self.state) if _is_of(n, cid)]
        except FileNotFoundError:
            return []
        if not left:
            return []
        events = [] if emptied else delete_container(self.backend.runsc or "runsc",
                                                     self.state, cid)
        return events + remove_state(self.state, cid)

    # -- teardown ------------------------------------------------------------------------
    def close(self) -> list[str]:
        problems: list[str] = []
        if getattr(self, "_inflight", None) is not None:
            self._inflight.end_all()   # execs still running (another thread's) end first
        if getattr(self, "sentry_uid", None) is not None:
            reap_strays({self.uid, self.sentry_uid})
        if self.review is not None:
            self.review.close()
        if getattr(self, "userns", None) is not None:
            os.close(self.userns)
            self.userns = None
        if getattr(self, "dir", None) is not None:
            # each exec ended its processes and runsc's state of them; the run dir's removal
            # unmounts scratch, workspace and root and deletes the (empty) state dir
            problems += self.dir.remove()
            self.dir = None
        return problems
