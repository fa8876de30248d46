"""Per-run cgroups (v1 and v2 behind one class) and rlimits.

    info = detect()                        # what this host offers; cached per process
    cg = RunCgroup.create(run_id, memory=512 << 20, pids=256, cpus=1.0)
    fds = cg.attach_fds()                  # opened in the parent
    subprocess.Popen(argv, preexec_fn=lambda: (RunCgroup.attach_self(fds), apply_rlimits(...)))
    for fd in fds: os.close(fd)
    cg.cpu_seconds(); cg.usage(); cg.pids()
    cg.destroy()                           # kill every process of the run, rmdir

Where the run cgroups live (`<...>/corral/<run_id>`):

- cgroup v1 (legacy and hybrid hosts; chosen whenever memory, pids or cpu is bound to a v1
  hierarchy): one directory in each of the memory, pids, cpu, cpuacct and freezer
  hierarchies, below the supervisor's own cgroup of that hierarchy (/proc/self/cgroup).
- cgroup v2: one directory. As root, `<v2 root>/corral`. Otherwise only when the
  supervisor's own cgroup is delegated to it (writable), as `<own>/corral`. Because of v2's
  no-internal-processes rule, `<own>` can hand controllers to `corral` only once it holds no
  processes itself: if enabling them fails with EBUSY, the supervisor moves itself into
  `<own>/corral-supervisor` and retries; a later supervisor started there treats `<own>` as
  its base. Any other process left in `<own>` makes this fail, naming the fix.

Limits: memory with swap included (v1 memory.limit_in_bytes then memory.memsw.limit_in_bytes;
v2 memory.max and memory.swap.max=0), the OOM killer kept on, pids.max, and a CFS quota over
a 100 ms period. On a host with swap but no swap accounting the memory limit is refused
rather than applied to RAM only.

Killing: v2 writes cgroup.kill (5.14+). v1 freezes the run in the freezer hierarchy, SIGKILLs
every member and thaws, so a fork bomb cannot outrun it. Stragglers (no freezer, a freeze
that did not settle) are SIGKILLed through pidfds until the cgroup is empty, so a recycled
pid outside the run is never signalled.

`detect()` is what create() and sweep_stale() use unless given `info=`, which also lets
tests point them at another layout (a cgroup2 mount without controllers, no freezer).

Not here: choosing run ids and deciding which ones are dead (rundir.py), and devices, io or
cpuset control. Sweeping looks only below this supervisor's own cgroups, so leftovers of a
supervisor that lived in another cgroup are not found.
"""

from __future__ import annotations

import _signal  # the C module: `signal` imports enum, which costs start-up time
import errno
import os
import time

from .._record import Record
from ..errors import SandboxSetupError
from ._sys import RLIMIT_CORE, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC, prlimit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Literal, Self

PARENT = "corral"
SUPERVISOR_LEAF = "corral-supervisor"
CFS_PERIOD_US = 100_000
CFS_QUOTA_MIN_US = 1_000        # the kernel rejects smaller quotas
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
FIX_PERMISSION = "run as root or delegate a cgroup v2 subtree (systemd-run -p Delegate=yes)"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class CgroupInfo(Record):
    version: Literal["v1", "v2"] | None
    memory: bool        # a memory limit (swap included) can be set
    pids: bool          # pids.max can be set
    cpu: bool           # a CPU quota can be set and CPU time read (v1: cpu and cpuacct)
    freezer: bool       # the run can be stopped as a whole before the kill (v1 freezer; v2)
    #: (hierarchy, parent dir of the run cgroups); v1: a controller name, v2: "cgroup2"
    parents: tuple[tuple[str, str], ...] = ()
    reason: str | None = None   # what is missing and how to fix it; None when all is usable

    def parent(self, hierarchy: str) -> str | None:
        return next((p for h, p in self.parents if h == hierarchy), None)


class Usage(Record):
    cpu_s: float | None                 # CPU time of every process the run had
    memory_peak_bytes: int | None       # v1 with swap (memsw) when accounted; v2 memory.peak
    oom_kills: int | None               # processes the OOM killer chose in this run


# ---- reading the host: pure parsers, then the checks that touch the filesystem ----

class _Mount(Record):
    fstype: str                 # "cgroup" (v1) or "cgroup2"
    root: str                   # the path of the hierarchy that is mounted here
    point: str
    controllers: frozenset[str]  # v1 only


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _parse_mountinfo(text: str) -> list[_Mount]:
    mounts = []
    for line in text.splitlines():
        if "cgroup" not in line:   # most lines: not a cgroup mount (the test below says so)
            continue
        pre, sep, post = line.partition(" - ")
        f, p = pre.split(), post.split()
        if not sep or len(f) < 5 or len(p) < 3 or p[0] not in ("cgroup", "cgroup2"):
            continue
        ctrls = frozenset(o for o in p[2].split(",") if o in V1_CONTROLLERS)
        mounts.append(_Mount(p[0], _unescape(f[3]), _unescape(f[4]),
                             ctrls if p[0] == "cgroup" else frozenset()))
    return mounts


def _parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """/proc/self/cgroup -> ({v1 controller: path}, v2 path or None)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if hid == "0" and ctrls == "":
            v2 = path
        else:
            for c in ctrls.split(","):
                v1[c] = path
    return v1, v2


def _on_disk(m: _Mount, path: str) -> str | None:
    """The directory of cgroup `path` under mount `m`, or None if the mount does not show it."""
    root = m.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return (m.point.rstrip("/") + path[len(root):]).rstrip("/") or "/"


class _Located(Record):
    version: Literal["v1", "v2"] | None
    own: dict[str, str]          # hierarchy ("cgroup2" on v2) -> the supervisor's cgroup dir
    v2_mount: str | None = None  # where the cgroup2 filesystem is mounted
    problems: tuple[str, ...] = ()


def _locate(mounts: list[_Mount], proc_cgroup: str) -> _Located:
    """Pure: the cgroup version to use and the supervisor's own cgroup dirs.

    v1 wins as soon as memory, pids or cpu is bound to a v1 hierarchy (a hybrid host), since
    a controller bound there is missing from v2.
    """
    v1_paths, v2_path = _parse_proc_cgroup(proc_cgroup)
    v1_mounts = [m for m in mounts if m.fstype == "cgroup"]
    if any(c in m.controllers for m in v1_mounts for c in V2_CONTROLLERS):
        own: dict[str, str] = {}
        problems = []
        for c in V1_CONTROLLERS:
            ms = [m for m in v1_mounts if c in m.controllers]
            path = v1_paths.get(c)
            d = next((d for m in ms if path and (d := _on_disk(m, path))), None)
            if d:
                own[c] = d
            elif c != "freezer":
                problems.append(f"no cgroup v1 {c} hierarchy is mounted" if not ms else
                                f"this process's {c} cgroup {path} is outside the mounted "
                                f"part of the hierarchy")
        return _Located("v1", own, None, tuple(problems))
    for m in mounts:
        if m.fstype == "cgroup2" and v2_path is not None and (d := _on_disk(m, v2_path)):
            return _Located("v2", {"cgroup2": d}, m.point)
    if any(m.fstype == "cgroup2" for m in mounts):
        problem = "this process's cgroup v2 path is outside the mounted cgroup2"
    else:
        problem = "no cgroup filesystem is mounted; mount cgroup2 at /sys/fs/cgroup"
    return _Located(None, {}, None, (problem,))


def _writable(path: str) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def _probe_v1(own: dict[str, str], problems: list[str]) -> CgroupInfo:
    parents, closed = [], []
    for c, d in own.items():
        parent = os.path.join(d, PARENT)
        if _writable(parent if os.path.isdir(parent) else d):
            parents.append((c, parent))
        elif c != "freezer":
            closed.append(parent)
    if closed:
        problems.append(f"cannot create cgroups in {', '.join(closed)}: run as root, or "
                        f"create these and chown them to uid {os.geteuid()}")
    ok = {c for c, _ in parents}
    return CgroupInfo("v1", "memory" in ok, "pids" in ok, {"cpu", "cpuacct"} <= ok,
                      "freezer" in ok, tuple(parents), "; ".join(problems) or None)


def _probe_v2(own: str, *, euid: int, mount: str) -> CgroupInfo:
    """v2 facts for a supervisor living in cgroup dir `own` on the cgroup2 `mount`."""
    if euid == 0:
        base = mount
    else:
        base = os.path.dirname(own) if os.path.basename(own) == SUPERVISOR_LEAF else own
        if not (_writable(base) and os.access(os.path.join(base, "cgroup.procs"), os.W_OK)
                and os.access(os.path.join(base, "cgroup.subtree_control"), os.W_OK)):
            return CgroupInfo("v2", False, False, False, False, (),
                              f"cannot create cgroups in {base} (not delegated to uid "
                              f"{euid}): {FIX_PERMISSION}")
    try:
        with open(os.path.join(base, "cgroup.controllers")) as f:
            avail = set(f.read().split())
    except OSError as e:
        return CgroupInfo("v2", False, False, False, False, (),
                          f"cannot read {base}/cgroup.controllers: {e.strerror}")
    missing = [c for c in V2_CONTROLLERS if c not in avail]
    reason = None
    if missing:
        fix = ("boot with systemd.unified_cgroup_hierarchy=1 so that no controller is bound "
               "to cgroup v1" if euid == 0 else FIX_PERMISSION)
        reason = (f"cgroup v2 controllers {', '.join(missing)} are not available in {base} "
                  f"(bound to a v1 hierarchy, or not delegated): {fix}")
    return CgroupInfo("v2", "memory" in avail, "pids" in avail, "cpu" in avail, True,
                      (("cgroup2", os.path.join(base, PARENT)),), reason)


_detected: CgroupInfo | None = None


def detect() -> CgroupInfo:
    """Which cgroup version this host uses and what the current user can limit with it.
    Looked up once per process."""
    global _detected
    if _detected is None:
        _detected = _detect()
    return _detected


def _detect() -> CgroupInfo:
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = _parse_mountinfo(f.read())
        with open("/proc/self/cgroup") as f:
            proc_cgroup = f.read()
    except OSError as e:
        return CgroupInfo(None, False, False, False, False, (),
                          f"cannot read {e.filename}: {e.strerror}; mount /proc")
    loc = _locate(mounts, proc_cgroup)
    if loc.version == "v1":
        return _probe_v1(loc.own, list(loc.problems))
    if loc.version == "v2":
        assert loc.v2_mount is not None
        return _probe_v2(loc.own["cgroup2"], euid=os.geteuid(), mount=loc.v2_mount)
    return CgroupInfo(None, False, False, False, False, (), "; ".join(loc.problems))


# ---- small file helpers ----

def _error(what: str, path: str, e: OSError, fix: str | None = None) -> SandboxSetupError:
    if fix is None:
        fix = {errno.EACCES: FIX_PERMISSION, errno.EPERM: FIX_PERMISSION,
               errno.EROFS: "the cgroup filesystem is mounted read-only; mount it read-write"
               }.get(e.errno or 0, "")
    tail = f"; {fix}" if fix else ""
    return SandboxSetupError(f"cannot {what} {path}: {e.strerror}{tail}", step="cgroup",
                             errno=e.errno)


def _write(path: str, data: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise _error(f"write {data!r} to", path, e) from None


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _read_or_none(path: str) -> str | None:
    """The file's text, or None when the cgroup is gone: not there (ENOENT), or removed
    between the open and the read (kernfs answers ENODEV then)."""
    try:
        return _read(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ENODEV:
            return None
        raise


def _keyed(text: str | None, key: str) -> int | None:
    """The value of `key` in a "key value" per line file (cpu.stat, memory.events, ...)."""
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return None


def _host_has_swap() -> bool:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("SwapTotal:"):
            return int(line.split()[1]) > 0
    return False


def _check_run_id(run_id: str) -> None:
    if not (0 < len(run_id) <= 128 and set(run_id) <= _ID_CHARS and run_id[0] not in ".-"):
        raise ValueError(f"run id {run_id!r} must be 1-128 of [A-Za-z0-9_.-], "
                         f"not starting with '.' or '-'")


# ---- one run ----

class RunCgroup:
    """The cgroup(s) of one run: limits, accounting, kill, removal."""

    def __init__(self, run_id: str, version: Literal["v1", "v2"],
                 dirs: dict[str, str]) -> None:
        # use create() or sweep_stale(); dirs maps a hierarchy to this run's directory
        self.run_id = run_id
        self.version = version
        self._dirs = dirs
        self._destroyed = False
        #: kill_all() found the run empty, and nothing can have joined since (attach_fds()
        #: was not called after it): destroy() need not look again
        self._emptied = False
        #: OOM kills counted before this run began, and the memory then charged (renew())
        self._oom_base = self._mem_base = 0
        #: the limits it was made with, for whoever reuses it (backends/host/cgroups.py)
        self.key: tuple | None = None

    def __repr__(self) -> str:
        return f"RunCgroup({self.run_id!r}, {self.version}, {self.paths})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @property
    def paths(self) -> list[str]:
        """This run's directories, one per hierarchy (v2: exactly one)."""
        return list(dict.fromkeys(self._dirs.values()))

    def _dir(self, hierarchy: str) -> str | None:
        return self._dirs.get(hierarchy) or self._dirs.get("cgroup2")

    def _need(self, hierarchy: str) -> str:
        d = self._dir(hierarchy)
        if d is None:   # create() checked the CgroupInfo; this is a CgroupInfo that lied
            raise SandboxSetupError(f"run {self.run_id} has no {hierarchy} cgroup",
                                    step="cgroup")
        return d

    # -- creation --

    @classmethod
    def create(cls, run_id: str, *, memory: int | None, pids: int | None, cpus: float | None,
               info: CgroupInfo | None = None) -> RunCgroup:
        """Make the run's cgroup(s) and set the limits. None means "no limit"; a limit whose
        controller is unusable raises SandboxSetupError (never silently dropped)."""
        _check_run_id(run_id)
        for name, v in (("memory", memory), ("pids", pids), ("cpus", cpus)):
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be positive, not {v!r}")
        if info is None:
            info = detect()
        wanted = [n for n, v in (("memory", memory), ("pids", pids), ("cpu", cpus))
                  if v is not None]
        if info.version is None or not all(getattr(info, n) for n in wanted):
            missing = ", ".join(n for n in wanted if not getattr(info, n))
            raise SandboxSetupError(f"cannot limit {missing} with cgroups: {info.reason}",
                                    step="cgroup")
        if info.version == "v2":
            run = cls._create_v2(run_id, info)
        else:
            run = cls._create_v1(run_id, info)
        try:
            run._set_limits(memory, pids, cpus)
        except BaseException:
            run.destroy()
            raise
        return run

    @staticmethod
    def _mkdir_run(parent: str, run_id: str) -> str:
        d = os.path.join(parent, run_id)
        for _ in range(3):   # a concurrent cleanup may remove an empty parent in between
            try:
                try:
                    os.mkdir(d)   # the parent is there after the first run: one syscall
                except FileNotFoundError:
                    os.makedirs(parent, exist_ok=True)
                    os.mkdir(d)
                return d
            except FileNotFoundError:
                continue
            except FileExistsError as e:
                raise _error("create", d, e, "another run uses this id, or a dead supervisor "
                             "left it behind: call RunCgroup.sweep_stale()") from None
            except OSError as e:
                raise _error("create", d, e) from None
        raise SandboxSetupError(f"cannot create {d}: its parent keeps disappearing",
                                step="cgroup", errno=errno.ENOENT)

    @classmethod
    def _create_v1(cls, run_id: str, info: CgroupInfo) -> RunCgroup:
        run = cls(run_id, "v1", {})
        made: dict[str, str] = {}     # hierarchies mounted together (cpu,cpuacct) share one
        try:
            for h, parent in info.parents:
                if h == "freezer" and not info.freezer:
                    continue
                if parent not in made:
                    made[parent] = cls._mkdir_run(parent, run_id)
                run._dirs[h] = made[parent]
        except BaseException:
            run.destroy()
            raise
        return run

    @classmethod
    def _create_v2(cls, run_id: str, info: CgroupInfo) -> RunCgroup:
        parent = info.parent("cgroup2")
        assert parent is not None
        enable = [c for c in V2_CONTROLLERS if getattr(info, c)]
        if enable:
            _v2_enable(os.path.dirname(parent), enable)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise _error("create", parent, e) from None
        if enable:
            _v2_enable(parent, enable)
        return cls(run_id, "v2", {"cgroup2": cls._mkdir_run(parent, run_id)})

    def _set_limits(self, memory: int | None, pids: int | None, cpus: float | None) -> None:
        v1 = self.version == "v1"
        if memory is not None:
            d = self._need("memory")
            swap_file = "memory.memsw.limit_in_bytes" if v1 else "memory.swap.max"
            has_swap_file = os.path.exists(os.path.join(d, swap_file))
            if not has_swap_file and _host_has_swap():
                raise SandboxSetupError(
                    f"cannot cap swap: {d}/{swap_file} is missing (no swap accounting); "
                    f"boot with swapaccount=1 or turn swap off", step="cgroup")
            if v1:
                # memsw must never be below limit_in_bytes, so the order matters
                _write(os.path.join(d, "memory.limit_in_bytes"), str(memory))
                if has_swap_file:
                    _write(os.path.join(d, swap_file), str(memory))
                # oom_kill_disable is inherited from the parent: keep the OOM killer on
                _write(os.path.join(d, "memory.oom_control"), "0")
            else:
                _write(os.path.join(d, "memory.max"), str(memory))
                if has_swap_file:
                    _write(os.path.join(d, swap_file), "0")
        if pids is not None:
            _write(os.path.join(self._need("pids"), "pids.max"), str(pids))
        if cpus is not None:
            quota = max(CFS_QUOTA_MIN_US, int(cpus * CFS_PERIOD_US))
            d = self._need("cpu")
            if v1:
                _write(os.path.join(d, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
                _write(os.path.join(d, "cpu.cfs_quota_us"), str(quota))
            else:
                _write(os.path.join(d, "cpu.max"), f"{quota} {CFS_PERIOD_US}")

    def child(self, name: str) -> RunCgroup:
        """A cgroup below this one in each of its hierarchies, with no limits of its own
        (this one's bind it and its siblings together): one command of a live sandbox,
        with its own CPU counter, OOM counter and kill. Removed with destroy(), or with
        this one's."""
        _check_run_id(name)
        dirs: dict[str, str] = {}
        made: dict[str, str] = {}
        try:
            for h, d in self._dirs.items():
                if d not in made:
                    made[d] = self._mkdir_run(d, name)
                dirs[h] = made[d]
        except BaseException:
            for d in made.values():
                _rmdir(d)
            raise
        return RunCgroup(f"{self.run_id}.{name}", self.version, dirs)

    # -- attaching --

    @property
    def procs_files(self) -> list[str]:
        """The cgroup.procs files a child joins by writing "0" (itself) to each."""
        files = self.__dict__.get("_procs_files")
        if files is None:     # read on every command of a live sandbox: made once
            files = self._procs_files = [os.path.join(d, "cgroup.procs") for d in self.paths]
        return list(files)

    def attach_fds(self) -> list[int]:
        """procs_files opened O_WRONLY|O_CLOEXEC, for attach_self() in the child. The caller
        closes them once the child is started."""
        self._emptied = False
        fds: list[int] = []
        for p in self.procs_files:
            try:
                fds.append(os.open(p, os.O_WRONLY | os.O_CLOEXEC))
            except OSError as e:
                for fd in fds:
                    os.close(fd)
                raise _error("open", p, e) from None
        return fds

    @staticmethod
    def attach(fds: list[int], pid: int) -> None:
        """Move process `pid` (all its threads) into the run, through attach_fds()."""
        data = str(pid).encode()
        for fd in fds:
            try:
                os.write(fd, data)
            except OSError as e:
                raise SandboxSetupError(f"cannot move process {pid} into its cgroup: "
                                        f"{e.strerror}", step="cgroup", errno=e.errno) from None

    @staticmethod
    def attach_self(fds: list[int]) -> None:
        """Move the calling process into the run. Safe between fork and exec (preexec_fn):
        it only calls write(2). "0" means the writer itself, in v1 and v2 alike. A failure
        raises, which makes subprocess abort the child before exec."""
        for fd in fds:
            os.write(fd, b"0")

    # -- reuse --

    def renew(self, *, max_residue: int | None) -> bool:
        """Make this emptied cgroup ready for another run with the same limits: the CPU
        counter starts again from 0, usage() reports the memory peak above what is charged
        now (and the memory limit still covers that charge), and OOM kills count from now.
        False when it cannot be reused: a cgroup v2 (memory.peak cannot be reset before
        Linux 6.12), not emptied by kill_all(), or holding more than `max_residue` bytes
        of charged memory (pages another run left, e.g. files of its scratch tmpfs).
        Creating and removing a v1 run costs the kernel ~1 ms over five hierarchies;
        this is a few small writes."""
        if self.version != "v1" or self._destroyed or not self._emptied:
            return False
        d = self._dir("memory")
        if d is not None:
            memsw = os.path.exists(os.path.join(d, "memory.memsw.usage_in_bytes"))
            prefix = "memory.memsw." if memsw else "memory."
            used = _read_or_none(os.path.join(d, prefix + "usage_in_bytes"))
            if used is None or max_residue is not None and int(used) > max_residue:
                return False
            _write(os.path.join(d, "memory.max_usage_in_bytes"), "0")  # = usage now
            if memsw:
                _write(os.path.join(d, "memory.memsw.max_usage_in_bytes"), "0")
            self._mem_base = int(used)
            self._oom_base = _keyed(_read_or_none(os.path.join(d, "memory.oom_control")),
                                    "oom_kill") or 0
        cpu = self._dir("cpuacct")
        if cpu is not None:
            _write(os.path.join(cpu, "cpuacct.usage"), "0")
        return True

    # -- accounting --

    def unthrottle(self) -> None:
        """Lift this cgroup's CPU quota, once everything in it has been sent SIGKILL: a
        killed process still needs the CPU to exit (a VM's QEMU frees its guest's memory),
        and at a small quota (or a quota the run used up) its exit would wait for period
        after period. Never while anything in it may still run code of its own."""
        d = self._dir("cpu")
        if d is None:
            return
        try:
            if self.version == "v1":
                _write(os.path.join(d, "cpu.cfs_quota_us"), "-1")
            else:
                _write(os.path.join(d, "cpu.max"), f"max {CFS_PERIOD_US}")
        except SandboxSetupError:
            pass       # gone already, or no quota to lift

    def cpu_seconds(self) -> float | None:
        """CPU time used by the run so far; one small read, cheap enough to poll."""
        d = self._dir("cpuacct")
        if d is None:
            return None
        try:
            if self.version == "v1":
                return int(_read(os.path.join(d, "cpuacct.usage"))) / 1e9
            usec = _keyed(_read(os.path.join(d, "cpu.stat")), "usage_usec")
            return None if usec is None else usec / 1e6
        except FileNotFoundError:
            return None

    def usage(self) -> Usage:
        d = self._dir("memory")
        peak = oom = None
        if d is not None:
            if self.version == "v1":
                text = (_read_or_none(os.path.join(d, "memory.memsw.max_usage_in_bytes"))
                        or _read_or_none(os.path.join(d, "memory.max_usage_in_bytes")))
                events = _read_or_none(os.path.join(d, "memory.oom_control"))
            else:
                text = (_read_or_none(os.path.join(d, "memory.peak"))
                        or _read_or_none(os.path.join(d, "memory.current")))
                events = _read_or_none(os.path.join(d, "memory.events"))
            # what this run added at its peak (a reused cgroup starts with some charge)
            peak = max(int(text) - self._mem_base, 0) if text else None
            oom = _keyed(events, "oom_kill")
            if oom is not None:
                oom -= self._oom_base
        return Usage(self.cpu_seconds(), peak, oom)

    def pids(self) -> list[int]:
        """Every process in the run (the union over its hierarchies), sorted."""
        found: set[int] = set()
        for p in self.procs_files:
            found.update(int(x) for x in (_read_or_none(p) or "").split())
        return sorted(found)

    def emptied_now(self) -> bool:
        """Whether no process is in the run now: then it counts as emptied, as after
        kill_all() (renew() may reuse it), from one pass over its hierarchies."""
        if self.pids():
            return False
        self._emptied = True
        return True

    # -- killing and removal --

    def _kill_listed(self) -> None:
        """SIGKILL the members through pidfds: a pid still listed after its pidfd was opened
        is that process, so a recycled pid outside the run is never signalled."""
        fds: dict[int, int] = {}
        try:
            for pid in self.pids():
                try:
                    fds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    pass
            still = set(self.pids())
            for pid, fd in fds.items():
                if pid in still:
                    try:
                        _signal.pidfd_send_signal(fd, 9)  # SIGKILL
                    except ProcessLookupError:
                        pass
        finally:
            for fd in fds.values():
                os.close(fd)

    def _freeze(self, on: bool) -> bool:
        """Freeze (or thaw) the run; False when it has no freezer. Freezing waits up to 1 s
        for the state to settle; a task stuck in the kernel may keep it from settling, and
        the kill loop that follows copes with that."""
        if self.version == "v1":
            d = self._dirs.get("freezer")
            ctl, value = "freezer.state", "FROZEN" if on else "THAWED"
            state, frozen = "freezer.state", "FROZEN"
        else:
            d = self._dirs["cgroup2"]
            ctl, value = "cgroup.freeze", "1" if on else "0"
            state, frozen = "cgroup.events", "frozen 1"
        if d is None or not os.path.exists(os.path.join(d, ctl)):
            return False
        _write(os.path.join(d, ctl), value)
        deadline = time.monotonic() + 1.0
        while on and time.monotonic() < deadline:
            if frozen in (_read_or_none(os.path.join(d, state)) or "").splitlines():
                break
            time.sleep(0.002)
        return True

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL every process of the run, daemons and fork bombs included; returns once the
        run is empty. Raises SandboxSetupError if it is not empty after `timeout` seconds.

        A killed process leaves the cgroup as it exits, so zombies never keep the run alive.
        Orphans are reaped by the nearest child subreaper or PID 1, though: under a PID 1
        that does not reap, their zombies keep their pids; run children in a pid namespace
        or make the supervisor a subreaper."""
        kill_file = os.path.join(self._dirs.get("cgroup2", ""), "cgroup.kill")
        use_kill_file = self.version == "v2" and os.path.exists(kill_file)
        if use_kill_file:
            _write(kill_file, "1")
            left = self.pids()
        elif left := self.pids():
            # frozen tasks cannot fork; SIGKILL takes effect as they thaw, before user code
            frozen = self._freeze(True)
            try:
                self._kill_listed()
            finally:
                if frozen:
                    self._freeze(False)
            left = self.pids()
        deadline = time.monotonic() + timeout
        delay = 0.001
        while left:
            if time.monotonic() > deadline:
                raise SandboxSetupError(
                    f"{len(left)} processes of run {self.run_id} (pids {left[:5]}) survived "
                    f"SIGKILL for {timeout:g} s; they may be stuck in the kernel (state D)",
                    step="cgroup")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            if use_kill_file:
                _write(kill_file, "1")
            else:
                self._kill_listed()
            left = self.pids()
        self._emptied = True

    def destroy(self) -> None:
        """Kill everything in the run, then remove its directories. Idempotent."""
        if self._destroyed:
            return
        for child in self._children():   # a live sandbox's commands (child())
            child.destroy()
        if not self._emptied:
            self.kill_all()
        for d in self.paths:
            _rmdir_tree(d)
        self._destroyed = True

    def _children(self) -> list[RunCgroup]:
        """The cgroups below this one, by name, each with its directory per hierarchy."""
        found: dict[str, dict[str, str]] = {}
        for h, d in self._dirs.items():
            entries = _child_dirs(d)
            if entries is None:
                continue
            for e in entries:
                found.setdefault(e.name, {})[h] = e.path
        return [RunCgroup(f"{self.run_id}.{n}", self.version, dirs)
                for n, dirs in sorted(found.items())]

    @classmethod
    def sweep_stale(cls, is_dead: Callable[[str], bool], *,
                    info: CgroupInfo | None = None) -> list[str]:
        """Destroy the run cgroups (processes first) whose run id `is_dead` says is dead.
        Returns the ids removed. Looks only in this supervisor's corral parents."""
        info = info or detect()
        ids: dict[str, dict[str, str]] = {}
        for h, parent in info.parents:
            try:
                entries = list(os.scandir(parent))
            except FileNotFoundError:
                continue
            except OSError as e:
                raise _error("list", parent, e) from None
            for ent in entries:
                if ent.is_dir(follow_symlinks=False):
                    ids.setdefault(ent.name, {})[h] = ent.path
        removed = []
        for run_id, dirs in sorted(ids.items()):
            if is_dead(run_id):
                cls(run_id, info.version or "v1", dirs).destroy()
                removed.append(run_id)
        return removed


def _rmdir_tree(d: str) -> None:
    """Remove a cgroup directory and the child cgroups below it (deepest first; the process
    tier puts its command in a child of a v2 run cgroup). cgroup.kill has emptied them."""
    children = _child_dirs(d)
    if children is None:
        return
    for child in children:
        _rmdir_tree(child.path)
    _rmdir(d)


def _child_dirs(d: str) -> list | None:
    """The directories in `d` (os.DirEntry), None when `d` is gone. A directory's link
    count is 2 plus its subdirectories on cgroupfs (kernfs keeps it so) as on most
    filesystems: at 2 there is none and the listing is skipped (a run cgroup has ~10 to
    35 files: listing its 5 v1 hierarchies twice was ~0.2 ms of every `corral run`'s
    close). Any other count (1: a filesystem that does not count them) lists it."""
    try:
        if os.stat(d).st_nlink == 2:
            return []
        return [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _error("list", d, e) from None


def _rmdir(d: str) -> None:
    deadline = time.monotonic() + 2.0
    while True:
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            # EBUSY: the last members are still being torn down by the kernel
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise _error("remove", d, e) from None
            time.sleep(0.01)


def _v2_enable(d: str, controllers: list[str]) -> None:
    """Enable `controllers` for the children of v2 cgroup `d` (cgroup.subtree_control)."""
    path = os.path.join(d, "cgroup.subtree_control")
    try:
        have = set(_read(path).split())
    except OSError as e:
        raise _error("read", path, e) from None
    missing = [c for c in controllers if c not in have]
    if not missing:
        return
    line = " ".join("+" + c for c in missing)
    try:
        _write(path, line)
        return
    except SandboxSetupError as e:
        if e.errno != errno.EBUSY:
            raise
    # no internal processes: `d` holds processes, so it cannot hand controllers down.
    # If one of them is this supervisor, move it into a leaf of its own and retry once.
    procs = os.path.join(d, "cgroup.procs")
    if str(os.getpid()) in (_read_or_none(procs) or "").split():
        leaf = os.path.join(d, SUPERVISOR_LEAF)
        try:
            os.makedirs(leaf, exist_ok=True)
        except OSError as e:
            raise _error("create", leaf, e) from None
        _write(os.path.join(leaf, "cgroup.procs"), "0")
        try:
            _write(path, line)
            return
        except SandboxSetupError as e:
            if e.errno != errno.EBUSY:
                raise
    raise SandboxSetupError(
        f"cannot write {line!r} to {path}: other processes live in {d} (cgroup v2 allows "
        f"no processes beside child cgroups); start corral in a cgroup of its own, e.g. "
        f"systemd-run --user --scope -p Delegate=yes corral ...", step="cgroup",
        errno=errno.EBUSY)


# ---- rlimits ----

#: what the resource module's setrlimit says for these errnos (a ValueError, no errno)
_SETRLIMIT_ERRORS = {errno.EINVAL: "current limit exceeds maximum limit",
                     errno.EPERM: "not allowed to raise maximum limit"}


def apply_rlimits(*, nofile: int, fsize: int, cpu_seconds: int | None,
                  nproc: int | None, pid: int | None = None) -> None:
    """Set the rlimits (soft = hard), and no core dumps, of the calling process or of `pid`
    (prlimit(2); its later children inherit them). The calling process's own: only
    setrlimit(2), safe in preexec_fn. RLIMIT_CPU gets hard = soft + 1, so SIGXCPU comes
    before SIGKILL. Note that RLIMIT_NPROC counts the user's processes and does not bind
    root."""
    limits = [(RLIMIT_CORE, 0, 0), (RLIMIT_NOFILE, nofile, nofile), (RLIMIT_FSIZE, fsize, fsize)]
    if cpu_seconds is not None:
        limits.append((RLIMIT_CPU, cpu_seconds, cpu_seconds + 1))
    if nproc is not None:
        limits.append((RLIMIT_NPROC, nproc, nproc))
    for which, soft, hard in limits:
        try:
            try:
                prlimit(pid or 0, which, soft, hard)
            except OSError as e:   # setrlimit's words, as the resource module gives them
                if pid is None and e.errno in _SETRLIMIT_ERRORS:
                    raise ValueError(_SETRLIMIT_ERRORS[e.errno]) from None
                raise
        except (OSError, ValueError, OverflowError) as e:
            raise SandboxSetupError(f"setrlimit({which}, {soft}) failed: {e}; raising a hard "
                                    f"limit needs root", step="rlimit",
                                    errno=getattr(e, "errno", None)) from None
