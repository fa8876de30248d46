"""limits.py against the real kernel: real cgroups, real children, no mocks.

Children join their run in preexec_fn, as corral does. Workloads that orphan processes
(daemons, fork loops) run under a small reaper that is a child subreaper and lives outside
the run: on a host whose PID 1 does not reap orphans, killed orphans would otherwise stay
zombies for good, holding pids.

The cgroup tests need a usable cgroup setup (root, or a delegated v2 subtree) and skip
otherwise; the parser and rlimit tests run anywhere.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import ROOT

from corral.errors import SandboxSetupError
from corral.linux import limits
from corral.linux.limits import RunCgroup, apply_rlimits, detect

MiB = 1 << 20
PY = [sys.executable, "-I", "-c"]
SRC = os.path.join(ROOT, "src")
INFO = detect()
USABLE = INFO.memory and INFO.pids and INFO.cpu
needs_cgroups = pytest.mark.skipif(not USABLE, reason=f"cgroups not usable: {INFO.reason}")
UNIFIED = "/sys/fs/cgroup/unified"


def _is_cgroup2(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            return any(m.point == path and m.fstype == "cgroup2"
                       for m in limits._parse_mountinfo(f.read()))
    except OSError:
        return False


# A hybrid host's empty cgroup2 mount, to drive the v2 code without controllers.
needs_unified = pytest.mark.skipif(
    not (os.geteuid() == 0 and INFO.version == "v1" and _is_cgroup2(UNIFIED)),
    reason=f"needs root and a hybrid host with cgroup2 at {UNIFIED}")


def new_id() -> str:
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module", autouse=True)
def _remove_empty_parents():
    yield
    parents = [p for _, p in INFO.parents] + [os.path.join(UNIFIED, limits.PARENT)]
    for p in parents:
        try:
            os.rmdir(p)        # only succeeds when no run (of anyone) is left in it
        except OSError:
            pass


@pytest.fixture
def make_cg():
    made: list[RunCgroup] = []

    def make(**kw) -> RunCgroup:
        kw.setdefault("memory", 256 * MiB)
        kw.setdefault("pids", 64)
        kw.setdefault("cpus", 1.0)
        cg = RunCgroup.create(kw.pop("run_id", None) or new_id(), **kw)
        made.append(cg)
        return cg

    yield make
    for cg in made:
        cg.destroy()


def spawn(cg: RunCgroup, code: str, **kw) -> subprocess.Popen:
    """A python child that joins `cg` between fork and exec."""
    fds = cg.attach_fds()
    try:
        return subprocess.Popen(PY + [code],
                                preexec_fn=lambda: RunCgroup.attach_self(fds),  # noqa: PLW1509
                                **kw)
    finally:
        for fd in fds:
            os.close(fd)


# The reaper: not in the run itself; its one child joins the run (the same write(fd, "0")
# as RunCgroup.attach_self, without importing corral), and it reaps every orphan until none
# is left. Exit status: the child's, or 128 + signal.
REAPER = r"""
import ctypes, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:   # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
fds = [int(x) for x in sys.argv[1].split(",")]
def attach():
    for fd in fds:
        os.write(fd, b"0")
child = subprocess.Popen([sys.executable, "-I", "-c", sys.argv[2]], preexec_fn=attach)
for fd in fds:
    os.close(fd)
status = 0
while True:
    try:
        pid, st = os.wait()
    except ChildProcessError:
        break
    if pid == child.pid:
        status = st
child.returncode = 0
sys.exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""


def spawn_reaped(cg: RunCgroup, code: str) -> subprocess.Popen:
    fds = cg.attach_fds()
    try:
        return subprocess.Popen(PY + [REAPER, ",".join(map(str, fds)), code], pass_fds=fds,
                                stdout=subprocess.PIPE, text=True)
    finally:
        for fd in fds:
            os.close(fd)


def cg_file(cg: RunCgroup, hierarchy: str, name: str) -> str:
    d = cg._dir(hierarchy)
    assert d is not None
    with open(os.path.join(d, name)) as f:
        return f.read().strip()


def wait_gone(pidfd: int, timeout: float = 2.0) -> bool:
    """True once the process behind pidfd has exited (zombie or reaped)."""
    return bool(select.select([pidfd], [], [], timeout)[0])


# ---- pure parsers: tables with near misses ----

HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = "8:pids:/\n6:freezer:/\n4:memory:/api/8c56\n2:cpuacct:/\n1:cpu:/\n0::/\n"
SYSTEMD_V1_MOUNTS = """\
25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct
26 24 0:23 / /sys/fs/cgroup/memory rw,nosuid shared:10 - cgroup cgroup rw,memory
27 24 0:24 / /sys/fs/cgroup/pids rw,nosuid shared:11 - cgroup cgroup rw,pids
28 24 0:25 / /sys/fs/cgroup/unified rw,nosuid shared:12 - cgroup2 cgroup2 rw,nsdelegate
"""
SYSTEMD_V1_SELF = ("4:cpu,cpuacct:/system.slice/c.service\n3:memory:/system.slice/c.service\n"
                   "2:pids:/system.slice/c.service\n1:name=systemd:/system.slice/c.service\n"
                   "0::/system.slice/c.service\n")
V2_MOUNTS = ("30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev shared:4 - cgroup2 cgroup2 "
             "rw,nsdelegate,memory_recursiveprot\n")
V2_SELF = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/c.service\n"
CONTAINER_MOUNTS = ("40 30 0:40 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup "
                    "rw,memory\n41 30 0:41 /docker/abc /sys/fs/cgroup/pids rw - cgroup cgroup "
                    "rw,pids\n42 30 0:42 /docker/abc /sys/fs/cgroup/cpu\\040acct rw - cgroup "
                    "cgroup rw,cpu,cpuacct\n")


@pytest.mark.parametrize("mounts, self_cgroup, version, own, problems", [
    (HYBRID_MOUNTS, HYBRID_SELF, "v1",
     {"memory": "/sys/fs/cgroup/memory/api/8c56", "pids": "/sys/fs/cgroup/pids",
      "cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct",
      "freezer": "/sys/fs/cgroup/freezer"}, ()),
    # cpu and cpuacct mounted together share a directory; no freezer is not a problem
    (SYSTEMD_V1_MOUNTS, SYSTEMD_V1_SELF, "v1",
     {"memory": "/sys/fs/cgroup/memory/system.slice/c.service",
      "pids": "/sys/fs/cgroup/pids/system.slice/c.service",
      "cpu": "/sys/fs/cgroup/cpu,cpuacct/system.slice/c.service",
      "cpuacct": "/sys/fs/cgroup/cpu,cpuacct/system.slice/c.service"}, ()),
    (V2_MOUNTS, V2_SELF, "v2",
     {"cgroup2": "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/"
                 "c.service"}, ()),
    # a container that sees only its own part of each hierarchy; \040 is a space
    (CONTAINER_MOUNTS, "3:memory:/docker/abc\n2:pids:/docker/abc/sub\n1:cpu,cpuacct:/docker/abc\n",
     "v1", {"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids/sub",
            "cpu": "/sys/fs/cgroup/cpu acct", "cpuacct": "/sys/fs/cgroup/cpu acct"}, ()),
    # near miss: /docker/abcd is not below /docker/abc
    (CONTAINER_MOUNTS, "3:memory:/docker/abcd\n2:pids:/docker/abc\n1:cpu,cpuacct:/docker/abc\n",
     "v1", {"pids": "/sys/fs/cgroup/pids", "cpu": "/sys/fs/cgroup/cpu acct",
            "cpuacct": "/sys/fs/cgroup/cpu acct"},
     ("this process's memory cgroup /docker/abcd is outside the mounted part of the hierarchy",
      )),
    (SYSTEMD_V1_MOUNTS.replace(" rw,pids", " rw,net_cls"), SYSTEMD_V1_SELF, "v1",
     {"memory": "/sys/fs/cgroup/memory/system.slice/c.service",
      "cpu": "/sys/fs/cgroup/cpu,cpuacct/system.slice/c.service",
      "cpuacct": "/sys/fs/cgroup/cpu,cpuacct/system.slice/c.service"},
     ("no cgroup v1 pids hierarchy is mounted",)),
    ("22 1 0:5 / /proc rw - proc proc rw\n", "0::/\n", None, {},
     ("no cgroup filesystem is mounted; mount cgroup2 at /sys/fs/cgroup",)),
])
def test_locate(mounts, self_cgroup, version, own, problems):
    loc = limits._locate(limits._parse_mountinfo(mounts), self_cgroup)
    assert (loc.version, loc.own, loc.problems) == (version, own, problems)
    assert loc.v2_mount == ("/sys/fs/cgroup" if version == "v2" else None)


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", "-x", ".x", "a b", "x" * 129,
                                 "é"])
def test_bad_run_ids_are_refused(bad):
    with pytest.raises(ValueError, match="run id"):
        RunCgroup.create(bad, memory=None, pids=None, cpus=None)


def test_detect_is_cached_and_explains_itself():
    assert detect() is detect()
    info = detect()
    assert (info.reason is None) == (info.memory and info.pids and info.cpu)


# ---- v1 or v2 as detected: the host's real setup ----

@needs_cgroups
def test_child_joins_every_hierarchy_by_writing_zero(make_cg):
    cg = make_cg()
    p = spawn(cg, "import time; time.sleep(30)")
    try:
        for f in cg.procs_files:
            with open(f) as fh:
                assert str(p.pid) in fh.read().split(), f
        assert cg.pids() == [p.pid]
    finally:
        cg.kill_all()
        assert p.wait(5) == -signal.SIGKILL
    assert cg.pids() == []


@needs_cgroups
def test_limits_are_written(make_cg):
    cg = make_cg(memory=64 * MiB, pids=20, cpus=0.25)
    assert cg_file(cg, "pids", "pids.max") == "20"
    if cg.version == "v1":
        assert cg_file(cg, "memory", "memory.limit_in_bytes") == str(64 * MiB)
        assert "oom_kill_disable 0" in cg_file(cg, "memory", "memory.oom_control")
        assert cg_file(cg, "cpu", "cpu.cfs_quota_us") == "25000"
        assert cg_file(cg, "cpu", "cpu.cfs_period_us") == "100000"
    else:
        assert cg_file(cg, "memory", "memory.max") == str(64 * MiB)
        assert cg_file(cg, "cpu", "cpu.max") == "25000 100000"


@needs_cgroups
def test_memory_hog_is_oom_killed(make_cg):
    limit = 64 * MiB
    cg = make_cg(memory=limit)
    p = spawn(cg, "x = b'x' * (256 << 20)")       # bytes * n writes, so every page is touched
    assert p.wait(20) == -signal.SIGKILL
    u = cg.usage()
    assert u.oom_kills is not None and u.oom_kills >= 1
    assert u.memory_peak_bytes is not None and 0.8 * limit <= u.memory_peak_bytes <= limit


@needs_cgroups
def test_a_gvisor_command_s_oom_is_counted_when_its_sandbox_s_cgroup_goes_as_it_reads(
        make_cg):
    """gvisor: an OOM kill of gVisor's own ends the sandbox, and the watchdog's close()
    removes its cgroup while the command's supervision reads its counts. A read between
    the look at sandbox_cg and its removal found the files gone (no counts): the command
    was "killed", not "oom". close() keeps the last counts (final_usage) before it removes
    the cgroup; the command's usage takes them then. Here that interleaving, made."""
    from corral.backends.gvisor_live import CommandGroup, GvisorLive

    cg = make_cg(memory=64 * MiB)
    live = object.__new__(GvisorLive)      # what a command's group reads of its sandbox
    live.sandbox_cg = cg
    live.final_usage = limits.Usage(cpu_s=None, memory_peak_bytes=None, oom_kills=None)
    cmd = CommandGroup(live, ns_pid=2, exec_pid=0)
    assert spawn(cg, "x = b'x' * (256 << 20)").wait(20) == -signal.SIGKILL   # an OOM kill
    u = cg.usage()                         # close(): the last counts, then the removal
    live.final_usage = limits.Usage(cpu_s=cg.cpu_seconds(),
                                    memory_peak_bytes=u.memory_peak_bytes,
                                    oom_kills=u.oom_kills)
    cg.destroy()                           # ... while sandbox_cg still names it
    assert cmd.usage().oom_kills >= 1
    live.sandbox_cg = None                 # and once close() has let it go
    assert cmd.usage().oom_kills >= 1


@needs_cgroups
def test_child_that_fits_is_not_killed(make_cg):
    cg = make_cg(memory=64 * MiB)
    p = spawn(cg, "x = b'x' * (16 << 20)")
    assert p.wait(20) == 0
    u = cg.usage()
    assert u.oom_kills == 0
    assert u.memory_peak_bytes is not None and u.memory_peak_bytes >= 16 * MiB


@needs_cgroups
def test_tmpfs_pages_count_against_the_limit(make_cg):
    cg = make_cg(memory=48 * MiB)
    path = f"/dev/shm/corral-{new_id()}"
    code = f"""
import os
fd = os.open({path!r}, os.O_WRONLY | os.O_CREAT, 0o600)
try:
    for _ in range(128):
        os.write(fd, b"x" * (1 << 20))
except OSError as e:
    print(e.errno)
"""
    try:
        p = spawn(cg, code, stdout=subprocess.PIPE, text=True)
        out, _ = p.communicate(timeout=20)
        # the writer is OOM-killed, or the write fails: either way it never gets 128 MiB
        assert p.returncode == -signal.SIGKILL or out.strip() == str(errno.ENOMEM)
        assert os.path.getsize(path) < 48 * MiB
    finally:
        os.unlink(path)


@needs_cgroups
def test_pids_limit_stops_a_fork_loop(make_cg):
    cg = make_cg(pids=20, cpus=0.5)
    assert cg_file(cg, "pids", "pids.max") == "20"    # a broken limit must not reach the host
    code = """
import os, time
made, eagain = 0, False
for _ in range(200):
    try:
        pid = os.fork()
    except BlockingIOError:
        eagain = True
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print(made, eagain, flush=True)
time.sleep(30)
"""
    with spawn_reaped(cg, code) as p:
        try:
            made, eagain = p.stdout.readline().split()
            assert eagain == "True" and int(made) <= 19
            assert len(cg.pids()) <= 20
            assert int(cg_file(cg, "pids", "pids.current")) <= 20
        finally:
            cg.kill_all()
        assert p.wait(10) == 128 + signal.SIGKILL
    assert cg.pids() == []


@needs_cgroups
def test_cpu_quota_throttles(make_cg):
    cg = make_cg(cpus=0.2)
    p = spawn(cg, "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.0: pass")
    assert p.wait(20) == 0
    cpu = cg.cpu_seconds()
    assert cpu is not None and 0.05 < cpu < 0.5     # ~0.2 CPU-s for 1 s of wall time


def cpu_reaches(cg, seconds: float, most: float = 60.0) -> bool:
    """Whether the cgroup's CPU counter passes `seconds` within `most` seconds of wall
    time. Bounded by the CPU used, not by the clock: on a busy or slow machine a busy
    child may get a small share of a core."""
    deadline = time.monotonic() + most
    while (cpu := cg.cpu_seconds()) is not None and cpu <= seconds:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return cpu is not None


@needs_cgroups
def test_cpu_seconds_grows_for_a_busy_child(make_cg):
    cg = make_cg(cpus=None)
    p = spawn(cg, "while True: pass")
    try:
        before = cg.cpu_seconds()
        assert before is not None and cpu_reaches(cg, before + 0.2)
        assert cg.usage().cpu_s >= before + 0.2
    finally:
        cg.kill_all()
        p.wait(5)


DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


@needs_cgroups
@pytest.mark.parametrize("freezer", [True, False], ids=["freezer", "kill-loop"])
def test_kill_all_kills_a_double_forked_daemon(make_cg, freezer):
    info = INFO.replace(freezer=freezer and INFO.freezer)
    cg = make_cg(info=info)
    with spawn_reaped(cg, DAEMON) as p:
        daemon = int(p.stdout.readline())
        pidfd = os.pidfd_open(daemon)
        try:
            # the middle process exits right after its fork: on a busy machine it may
            # still be there when the daemon has printed; wait for it to go (bounded)
            deadline = time.monotonic() + 30
            while len(cg.pids()) > 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert daemon in cg.pids() and len(cg.pids()) == 2
            cg.kill_all()
            assert cg.pids() == []
            assert wait_gone(pidfd)
            assert p.wait(10) == 128 + signal.SIGKILL
        finally:
            os.close(pidfd)


RUNNERS = """
import os
os.fork(); os.fork(); os.fork()          # eight lineages
while True:                              # each forks and exits: its pid keeps changing
    try:
        if os.fork():
            os._exit(0)
    except OSError:
        pass
"""


@needs_cgroups
@pytest.mark.parametrize("freezer", [True, False], ids=["freezer", "kill-loop"])
def test_kill_all_wins_against_a_fork_runner(make_cg, freezer):
    info = INFO.replace(freezer=freezer and INFO.freezer)
    cg = make_cg(info=info, pids=20, cpus=0.5)
    assert cg_file(cg, "pids", "pids.max") == "20"
    with spawn_reaped(cg, RUNNERS) as p:
        try:
            time.sleep(0.5)
            assert cg.pids()
        finally:
            cg.kill_all(timeout=10)
        assert cg.pids() == []
        p.wait(10)


@needs_cgroups
def test_destroy_removes_the_directories_and_is_idempotent(make_cg):
    cg = make_cg()
    p = spawn(cg, "import time; time.sleep(30)")
    assert all(os.path.isdir(d) for d in cg.paths)
    cg.destroy()
    assert p.wait(5) == -signal.SIGKILL
    assert not any(os.path.exists(d) for d in cg.paths)
    cg.destroy()
    # the id is free again
    RunCgroup.create(cg.run_id, memory=None, pids=None, cpus=None).destroy()


@needs_cgroups
def test_destroy_finds_child_cgroups_and_their_own_below_them(make_cg):
    # destroy() looks for child cgroups only where a directory's link count says there are
    # subdirectories (_child_dirs): a child with a process, and a grandchild made by hand
    # in one hierarchy, are killed and removed; a childless run is removed without a listing
    cg = make_cg()
    child = cg.child("c1")
    p = spawn(child, "import time; time.sleep(30)")
    grandchild = os.path.join(child.paths[0], "deeper")
    os.mkdir(grandchild)
    assert os.stat(cg.paths[0]).st_nlink == 3 and os.stat(child.paths[-1]).st_nlink == 2
    assert [e.name for e in limits._child_dirs(child.paths[0])] == ["deeper"]
    assert limits._child_dirs(child.paths[-1]) == []
    assert limits._child_dirs(os.path.join(cg.paths[0], "gone")) is None
    cg.destroy()
    assert p.wait(5) == -signal.SIGKILL
    assert not any(os.path.exists(d) for d in [*cg.paths, *child.paths, grandchild])


@needs_cgroups
def test_create_refuses_a_used_id_and_an_unusable_controller(make_cg):
    cg = make_cg()
    with pytest.raises(SandboxSetupError, match="sweep_stale") as e:
        RunCgroup.create(cg.run_id, memory=None, pids=None, cpus=None)
    assert e.value.errno == errno.EEXIST and e.value.step == "cgroup"
    no_memory = INFO.replace(memory=False, reason="no memory here; fix it")
    with pytest.raises(SandboxSetupError, match="cannot limit memory.*no memory here"):
        RunCgroup.create(new_id(), memory=64 * MiB, pids=None, cpus=None, info=no_memory)
    with pytest.raises(ValueError, match="memory must be positive"):
        RunCgroup.create(new_id(), memory=0, pids=None, cpus=None)


@needs_cgroups
@pytest.mark.skipif(INFO.version != "v1", reason="cgroup v1 only")
def test_v1_hierarchies_mounted_together_share_one_directory():
    # as /sys/fs/cgroup/cpu,cpuacct on systemd's v1 hosts: one directory serves both
    parent = INFO.parent("cpu")
    comounted = INFO.replace(parents=(("cpu", parent), ("cpuacct", parent)))
    with RunCgroup.create(new_id(), memory=None, pids=None, cpus=0.5, info=comounted) as cg:
        assert cg.paths == [os.path.join(parent, cg.run_id)]
        assert cg.procs_files == [os.path.join(parent, cg.run_id, "cgroup.procs")]
    assert not os.path.exists(cg.paths[0])


@needs_cgroups
def test_sweep_stale_removes_dead_runs_only(make_cg):
    live = make_cg()
    stale = RunCgroup.create(new_id(), memory=64 * MiB, pids=8, cpus=0.5)
    p = spawn(stale, "import time; time.sleep(30)")
    del stale                              # as if its supervisor had died
    assert RunCgroup.sweep_stale(lambda run_id: False) == []
    stale_id = [d for d in os.listdir(INFO.parents[0][1]) if d.startswith("test-")
                and d != live.run_id and str(os.getpid()) in d]
    assert len(stale_id) == 1
    removed = RunCgroup.sweep_stale(lambda run_id: run_id == stale_id[0])
    assert removed == stale_id
    assert p.wait(5) == -signal.SIGKILL
    assert not any(os.path.exists(os.path.join(parent, stale_id[0]))
                   for _, parent in INFO.parents)
    assert all(os.path.isdir(d) for d in live.paths)


# ---- the v2 code on this host's controller-less cgroup2 mount ----

@needs_unified
def test_v2_paths_on_the_unified_mount():
    info = limits._probe_v2(UNIFIED, euid=0, mount=UNIFIED)
    assert info.version == "v2" and info.parents == (("cgroup2", f"{UNIFIED}/corral"),)
    assert not info.memory and "memory" in info.reason     # no controllers on this mount
    with pytest.raises(SandboxSetupError, match="cannot limit memory, pids"):
        RunCgroup.create(new_id(), memory=64 * MiB, pids=20, cpus=None, info=info)

    cg = RunCgroup.create(new_id(), memory=None, pids=None, cpus=None, info=info)
    try:
        assert cg.paths == [f"{UNIFIED}/corral/{cg.run_id}"]
        p = spawn_reaped(cg, DAEMON)
        daemon = int(p.stdout.readline())
        p.stdout.close()
        with open(f"/proc/{daemon}/cgroup") as f:
            assert f"0::/corral/{cg.run_id}\n" in f.read()
        assert daemon in cg.pids()
        busy = spawn(cg, "while True: pass")
        assert cpu_reaches(cg, 0.1)                   # cpu.stat needs no controller
        assert cg.usage().memory_peak_bytes is None   # memory.* absent without the controller
        pidfd = os.pidfd_open(daemon)
        try:
            cg.kill_all()                             # cgroup.kill
            assert cg.pids() == [] and wait_gone(pidfd)
        finally:
            os.close(pidfd)
        assert busy.wait(5) == -signal.SIGKILL and p.wait(10) == 128 + signal.SIGKILL
        # sweeping finds the run in the v2 parent
        left = spawn(cg, "import time; time.sleep(30)")
        assert RunCgroup.sweep_stale(lambda r: r == cg.run_id, info=info) == [cg.run_id]
        assert left.wait(5) == -signal.SIGKILL
        assert not os.path.exists(cg.paths[0])
    finally:
        cg.destroy()


NOBODY = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from corral.linux import limits
with open("/proc/self/cgroup") as f:
    own = sys.argv[2] + [l for l in f.read().splitlines() if l.startswith("0::")][0][3:]
print("v1:", limits.detect().reason)
print("undelegated:", limits._probe_v2(sys.argv[2], euid=os.geteuid(), mount=sys.argv[2]).reason)
info = limits._probe_v2(own, euid=os.geteuid(), mount=sys.argv[2])
assert info.parents == (("cgroup2", own + "/corral"),), info
cg = limits.RunCgroup.create("nobody-run", memory=None, pids=None, cpus=None, info=info)
fds = cg.attach_fds()
p = subprocess.Popen([sys.executable, "-I", "-c", "import time; time.sleep(30)"],
                     preexec_fn=lambda: limits.RunCgroup.attach_self(fds))
for fd in fds:
    os.close(fd)
assert cg.pids() == [p.pid], cg.pids()
cg.destroy()
assert p.wait(5) == -9 and not os.path.exists(own + "/corral/nobody-run")
print("ok")
"""


@needs_unified
def test_v2_unprivileged_in_a_delegated_cgroup(tmp_path):
    """A non-root supervisor in a v2 cgroup delegated to it (chowned, as systemd's
    Delegate=yes does) makes its runs below its own cgroup; without delegation, a reason."""
    nobody = 65534
    deleg = os.path.join(UNIFIED, f"corral-test-deleg-{uuid.uuid4().hex[:8]}")
    os.mkdir(deleg)
    try:
        for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
            os.chown(os.path.join(deleg, name), nobody, nobody)
        fd = os.open(os.path.join(deleg, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

        def enter():
            RunCgroup.attach_self([fd])
            os.setgroups([])
            os.setresgid(nobody, nobody, nobody)
            os.setresuid(nobody, nobody, nobody)

        try:
            p = subprocess.run(PY + [NOBODY, SRC, UNIFIED], preexec_fn=enter, cwd="/",
                               capture_output=True, text=True, timeout=30, check=False)
        finally:
            os.close(fd)
        assert p.returncode == 0, p.stderr
        out = p.stdout.splitlines()
        assert out[-1] == "ok"
        assert out[0].startswith("v1: cannot create cgroups in") and "run as root" in out[0]
        assert "not delegated to uid 65534" in out[1] and "Delegate=yes" in out[1]
    finally:
        for d in (os.path.join(deleg, "corral"), deleg):
            if os.path.isdir(d):
                with open(os.path.join(d, "cgroup.kill"), "w") as f:
                    f.write("1")
                time.sleep(0.1)
                os.rmdir(d)


ENABLE = """
import sys
sys.path.insert(0, sys.argv[1])
from corral.linux import limits
from corral.errors import SandboxSetupError
try:
    limits._v2_enable(sys.argv[2], ["hugetlb"])
except SandboxSetupError as e:
    print("error:", e.errno, e)
with open("/proc/self/cgroup") as f:
    print([l for l in f.read().splitlines() if l.startswith("0::")][0])
"""


def popen_in(cgroup_dir: str, argv: list[str], **kw) -> subprocess.Popen:
    """Start argv inside the v2 cgroup `cgroup_dir`."""
    fd = os.open(f"{cgroup_dir}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    attach = lambda: RunCgroup.attach_self([fd])
    try:
        return subprocess.Popen(argv, preexec_fn=attach, **kw)  # noqa: PLW1509
    finally:
        os.close(fd)


def run_in(cgroup_dir: str, argv: list[str]) -> str:
    with popen_in(cgroup_dir, argv, stdout=subprocess.PIPE, text=True) as p:
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    return out


def _unified_hugetlb_free() -> bool:
    try:
        with open(f"{UNIFIED}/cgroup.controllers") as a, \
                open(f"{UNIFIED}/cgroup.subtree_control") as b:
            return "hugetlb" in a.read().split() and b.read().strip() == ""
    except OSError:
        return False


@needs_unified
@pytest.mark.skipif(not _unified_hugetlb_free(),
                    reason="needs hugetlb free to enable on the cgroup2 mount")
def test_v2_enable_moves_the_supervisor_out_of_its_own_cgroup():
    """No internal processes: a cgroup holding the supervisor cannot enable a domain
    controller for its children. The supervisor moves itself into a leaf and retries; with
    another process beside it, it fails naming the fix. Exercised with hugetlb, the one
    controller this host's cgroup2 mount has."""
    tag = uuid.uuid4().hex[:8]
    alone, crowded = f"{UNIFIED}/corral-test-alone-{tag}", f"{UNIFIED}/corral-test-crowd-{tag}"
    _write = limits._write
    _write(f"{UNIFIED}/cgroup.subtree_control", "+hugetlb")
    sleeper = None
    try:
        for d in (alone, crowded):
            os.mkdir(d)
        sleeper = popen_in(crowded, PY + ["import time; time.sleep(30)"])
        outs = [run_in(d, PY + [ENABLE, SRC, d]) for d in (alone, crowded)]
        name = os.path.basename(alone)
        assert outs[0] == f"0::/{name}/{limits.SUPERVISOR_LEAF}\n"
        with open(f"{alone}/cgroup.subtree_control") as f:
            assert f.read().split() == ["hugetlb"]
        first, second = outs[1].splitlines()
        assert first.startswith(f"error: {errno.EBUSY} setup step cgroup: cannot write "
                                f"'+hugetlb' to {crowded}/cgroup.subtree_control: other "
                                f"processes live in {crowded}")
        assert "Delegate=yes" in first
        assert second == f"0::/{os.path.basename(crowded)}/{limits.SUPERVISOR_LEAF}"
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        for d in (alone, crowded):
            leaf = os.path.join(d, limits.SUPERVISOR_LEAF)
            for x in (leaf, d):
                if os.path.isdir(x):
                    time.sleep(0.05)
                    os.rmdir(x)
        _write(f"{UNIFIED}/cgroup.subtree_control", "-hugetlb")


# ---- rlimits: any user, no cgroups ----

def test_rlimits_nofile_fsize_and_core(tmp_path):
    path = tmp_path / "big"
    code = f"""
import os, resource
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("nofile", e.errno, max(fds))
for fd in fds:
    os.close(fd)
try:
    with open({str(path)!r}, "wb") as f:
        f.write(b"x" * (2 << 20))
except OSError as e:
    print("fsize", e.errno)
print("core", *resource.getrlimit(resource.RLIMIT_CORE))
"""
    p = subprocess.run(PY + [code], capture_output=True, text=True, timeout=20, check=False,
                       preexec_fn=lambda: apply_rlimits(nofile=32, fsize=1 * MiB,
                                                        cpu_seconds=None, nproc=None))
    nofile, fsize, core = p.stdout.splitlines()
    _, err, highest = nofile.split()
    assert int(err) == errno.EMFILE and int(highest) < 32
    assert fsize == f"fsize {errno.EFBIG}" and path.stat().st_size == 1 * MiB
    assert core == "core 0 0"


def test_rlimit_cpu_kills_a_busy_child():
    p = subprocess.run(PY + ["while True: pass"], timeout=20, check=False,
                       preexec_fn=lambda: apply_rlimits(nofile=64, fsize=MiB,
                                                        cpu_seconds=1, nproc=None))
    assert p.returncode in (-signal.SIGXCPU, -signal.SIGKILL)


def test_setup_failures_in_preexec_stop_the_child():
    # the child must never exec without its limits
    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        subprocess.run(PY + ["pass"], check=False, preexec_fn=lambda: apply_rlimits(
            nofile=1 << 40, fsize=MiB, cpu_seconds=None, nproc=None))
    fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)     # write(2) fails: EBADF
    try:
        with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
            subprocess.run(PY + ["pass"], check=False,
                           preexec_fn=lambda: RunCgroup.attach_self([fd]))
    finally:
        os.close(fd)


def test_destroy_skips_the_second_look_only_while_nothing_can_have_joined(make_cg):
    """kill_all() on an empty run lets destroy() skip its own kill_all(); a process that
    joins afterwards (through attach_fds) is still found and killed by destroy()."""
    cg = make_cg()
    cg.kill_all()
    assert cg._emptied
    p = spawn(cg, "import time; time.sleep(60)")
    try:
        deadline = time.monotonic() + 5
        while p.pid not in cg.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cg.pids() == [p.pid] and not cg._emptied
        cg.destroy()
        assert p.wait(5) == -9
        assert not any(os.path.exists(d) for d in cg.paths)
    finally:
        p.kill()
        p.wait()


# ---- reuse (renew): cgroup v1 ----

needs_v1 = pytest.mark.skipif(not USABLE or INFO.version != "v1",
                              reason="cgroup reuse is for v1 hierarchies")


@needs_v1
def test_renew_starts_the_counters_again(make_cg):
    cg = make_cg(memory=64 * MiB)
    p = spawn(cg, "import time\nx = b'x' * (24 << 20)\nt = time.process_time()\n"
                  "while time.process_time() - t < 0.3: pass")
    assert p.wait(20) == 0
    first = cg.usage()
    assert first.memory_peak_bytes >= 24 * MiB and first.cpu_s >= 0.3
    assert not cg.renew(max_residue=None)          # not emptied: not reusable yet
    cg.kill_all()
    assert cg.renew(max_residue=None)
    p = spawn(cg, "pass")
    assert p.wait(20) == 0
    second = cg.usage()
    assert second.memory_peak_bytes < 16 * MiB, second   # this run's own, not the first's
    assert second.cpu_s < 0.2 and second.oom_kills == 0
    # an OOM kill is counted for its run only
    p = spawn(cg, "x = b'x' * (256 << 20)")
    assert p.wait(20) == -signal.SIGKILL
    assert cg.usage().oom_kills >= 1
    cg.kill_all()
    assert cg.renew(max_residue=None)
    assert cg.usage().oom_kills == 0
    assert cg_file(cg, "memory", "memory.limit_in_bytes") == str(64 * MiB)   # limits stay


@needs_v1
def test_renew_refuses_a_cgroup_that_still_holds_memory(make_cg, tmp_path):
    """Page cache a run read stays charged to its cgroup after the run: past the bound,
    the cgroup is not handed to another sandbox."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.write(os.urandom(16 * MiB))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache
    cg = make_cg(memory=128 * MiB)
    p = spawn(cg, f"open({str(big)!r}, 'rb').read()")       # charged to cg as it is read
    assert p.wait(20) == 0
    cg.kill_all()
    assert not cg.renew(max_residue=4 * MiB)
    assert cg.renew(max_residue=None)     # the sandbox that made the charge may reuse it
    gone = RunCgroup("x", "v2", {"cgroup2": "/nonexistent"})
    gone._emptied = True
    assert not gone.renew(max_residue=None)   # v2: memory.peak cannot be reset before 6.12


def test_the_rlimit_numbers_are_the_kernels_and_prlimit_sets_them():
    """linux/_sys sets rlimits through libc's prlimit (no `resource` module on corral run's
    path): its resource numbers are the resource module's, and what it sets on another
    process is what that process then has."""
    import resource

    from corral.linux import _sys

    for name in ("CPU", "FSIZE", "CORE", "NPROC", "NOFILE"):
        assert getattr(_sys, f"RLIMIT_{name}") == getattr(resource, f"RLIMIT_{name}"), name
    p = subprocess.Popen(PY + ["import time; time.sleep(30)"])
    try:
        apply_rlimits(nofile=40, fsize=3 * MiB, cpu_seconds=7, nproc=None, pid=p.pid)
        assert resource.prlimit(p.pid, resource.RLIMIT_NOFILE) == (40, 40)
        assert resource.prlimit(p.pid, resource.RLIMIT_FSIZE) == (3 * MiB, 3 * MiB)
        assert resource.prlimit(p.pid, resource.RLIMIT_CPU) == (7, 8)
        assert resource.prlimit(p.pid, resource.RLIMIT_CORE) == (0, 0)
    finally:
        p.kill()
        p.wait()
    with pytest.raises(SandboxSetupError) as e:   # gone: ESRCH, as namespace.py reads it
        apply_rlimits(nofile=40, fsize=MiB, cpu_seconds=None, nproc=None, pid=p.pid)
    assert e.value.errno == errno.ESRCH
