"""What is particular to the namespace tier (bubblewrap), tested with real sandboxes: the
view of the host, sysctls, capabilities, set-id bits on an rw workspace, signal state.
The containment every tier shares (limits, network, env, workspace, teardown) is tested
once for all tiers in test_tiers.py."""

import json
import os
import sys
import textwrap

import pytest
from conftest import mountinfo, procs_mentioning, sh

import corral

PY = "/usr/bin/python3"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="these tests exercise the root path")


def run(code_or_argv, policy=None, **kw):
    argv = [PY, "-c", textwrap.dedent(code_or_argv)] if isinstance(code_or_argv, str) \
        else code_or_argv
    return corral.run(argv, policy=policy, **kw)


# -- the filesystem -----------------------------------------------------------------------

def test_host_files_are_invisible(tmp_path):
    canary = tmp_path / "canary"
    canary.write_text("host secret")
    r = run(f"""
        import os, json
        paths = ["/home", "/root", "/run", "/var", "/sys", "/etc/shadow", "/etc/ssh",
                 "/etc/sudoers", "/etc/machine-id", {str(canary)!r}, "/work", "/opt", "/srv"]
        print(json.dumps({{p: os.path.exists(p) for p in paths}}))
        print(sorted(os.listdir("/")))
        print(open("/etc/passwd").read())
    """)
    assert r.verdict == "ok", r
    seen = json.loads(r.stdout.splitlines()[0])
    assert not any(seen.values()), seen
    assert "'scratch'" in r.stdout and "'usr'" in r.stdout
    assert "root:x:0:0:sandbox:/scratch" in r.stdout
    with open("/etc/passwd") as f:
        host_users = [line.split(":")[0] for line in f if not line.startswith(("root:", "nobody:"))]
    assert not any(f"\n{u}:" in r.stdout for u in host_users)


# -- the sandbox's root against the host ---------------------------------------------------

def test_sandbox_root_cannot_write_host_sysctls():
    with open("/proc/sys/kernel/core_pattern") as f:
        current = f.read().rstrip("\n")
    # write back the current value only: harmless even if it got through
    r = sh(f"printf '%s\\n' '{current}' > /proc/sys/kernel/core_pattern && echo WROTE; "
           "echo 0 > /proc/sysrq-trigger && echo WROTE2; cat /proc/self/uid_map")
    assert "WROTE" not in r.stdout
    assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
    assert r.stdout.split()[0] == "0" and r.stdout.split()[1] != "0"  # uid 0 -> unprivileged


def test_no_new_privileges_no_capabilities_own_hostname():
    r = sh("grep -E 'NoNewPrivs|CapEff|CapBnd|Seccomp:' /proc/self/status; hostname")
    assert "NoNewPrivs:\t1" in r.stdout and "CapEff:\t0000000000000000" in r.stdout
    assert "CapBnd:\t0000000000000000" in r.stdout and "Seccomp:\t2" in r.stdout
    assert r.stdout.split()[-1] == "corral"


# -- the workspace ---------------------------------------------------------------------------

def test_rw_workspace_cannot_get_setuid_files_or_device_nodes(tmp_path):
    ws = tmp_path / "root-owned"
    ws.mkdir()
    r = run("""
        import os, shutil, errno
        shutil.copy("/usr/bin/id", "/workspace/id")
        out = []
        for mode in (0o4755, 0o2755, 0o6755):
            try:
                os.chmod("/workspace/id", mode); out.append("chmod-ok")
            except OSError as e:
                out.append(errno.errorcode[e.errno])
        try:
            fd = os.open("/workspace/suid2", os.O_CREAT | os.O_WRONLY, 0o4755); out.append("open-ok")
        except OSError as e:
            out.append(errno.errorcode[e.errno])
        try:
            os.mknod("/workspace/dev", 0o600 | 0o020000, os.makedev(1, 3)); out.append("mknod-ok")
        except OSError as e:
            out.append(errno.errorcode[e.errno])
        os.chmod("/workspace/id", 0o755)
        print(" ".join(out))
    """, {"filesystem": {"workspace": {"path": str(ws), "mode": "rw"}}})
    assert r.stdout.split() == ["EPERM", "EPERM", "EPERM", "EPERM", "EPERM"], r
    for name in os.listdir(ws):
        st = os.lstat(ws / name)
        assert not st.st_mode & 0o6000, name
        assert (st.st_mode & 0o170000) not in (0o020000, 0o060000), name
    assert not [m for m in mountinfo() if str(ws) in m]


def test_signal_dispositions_are_the_defaults():
    r = sh("grep -E 'SigIgn|SigBlk' /proc/self/status; yes | head -1")
    assert "SigIgn:\t0000000000000000" in r.stdout and "SigBlk:\t0000000000000000" in r.stdout
    assert r.stdout.rstrip().endswith("y") and "Broken pipe" not in r.stderr
    r = sh("exec dd if=/dev/zero of=/scratch/big bs=8192 count=1", {"limits": {"file_size": 4096}})
    assert r.signal == 25  # SIGXFSZ, not a quiet EFBIG


# -- how a run starts: the gate --------------------------------------------------------------

def _start_by_hand(sb, argv, *, options: int | None, fill_gate: bool):
    """Start bwrap exactly as exec() does, but write only `options` bytes of its --args
    (None: all) and fill the seccomp gate or not. Returns (exit status, stdout, stderr)."""
    from corral.linux.supervise import spawn

    live = sb._live
    args_r, args_w = os.pipe()
    status_r, status_w = os.pipe()
    gate_r, gate_w = os.pipe()
    line, blob = live.bwrap_line(argv, args_r=args_r, gate_r=gate_r, status_w=status_w)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        pid, out_r, err_r = spawn(line[0], line, {"PATH": "/usr/bin:/bin"}, stdin_fd=devnull,
                                  pass_fds=(args_r, status_w, gate_r), uid=live.uid,
                                  gid=live.gid)
    finally:
        for fd in (devnull, args_r, status_w, gate_r):
            os.close(fd)
    os.write(args_w, blob if options is None else blob[:options])
    os.close(args_w)
    if fill_gate:
        assert b"child-pid" in os.read(status_r, 4096)
        os.write(gate_w, live.bpf)
    os.close(gate_w)
    out = b"".join(iter(lambda: os.read(out_r, 65536), b""))
    err = b"".join(iter(lambda: os.read(err_r, 65536), b""))
    _, status = os.waitpid(pid, 0)
    for fd in (status_r, out_r, err_r):
        os.close(fd)
    return status, out.decode(), err.decode()


def test_the_command_never_runs_before_the_gate_is_filled():
    """bwrap reads its options from a pipe and its seccomp program from another (the gate),
    which the supervisor fills only once the cgroup and rlimits are on: with the gate left
    empty, whatever was written of the options, the command does not run."""
    cmd = ["/bin/sh", "-c", "echo RAN"]
    with corral.Sandbox() as sb:
        status, out, _ = _start_by_hand(sb, cmd, options=None, fill_gate=True)
        assert out == "RAN\n" and os.waitstatus_to_exitcode(status) == 0   # the control
        blob_len = len(sb._live._args_blob)
        for options in (None, blob_len // 2, 0):
            status, out, err = _start_by_hand(sb, cmd, options=options, fill_gate=False)
            assert "RAN" not in out, options
            assert os.waitstatus_to_exitcode(status) != 0, options
            if options is None:
                assert "seccomp" in err.lower(), err


SUPERVISOR = """
import os, sys
import corral
from corral.backends import namespace

ws, token, point = sys.argv[1:]

def die(*args, **kw):
    os.kill(os.getpid(), 9)

if point == "options":        # bwrap started, nothing written to it yet
    namespace._confine = die
elif point == "gate":         # limits on and options written; the gate still empty
    namespace._pidfd = die
corral.run(["/bin/sh", "-c", f"echo {token} > /workspace/ran"],
           {"filesystem": {"workspace": {"path": ws, "mode": "rw"}}})
"""


@pytest.mark.parametrize("point", ["options", "gate"])
def test_a_supervisor_killed_while_starting_leaves_nothing_running(tmp_path, point):
    import subprocess
    import time
    import uuid

    from corral.linux import rundir

    ws = tmp_path / "ws"
    ws.mkdir()
    token = f"corral-gate-{uuid.uuid4().hex}"
    p = subprocess.run([sys.executable, "-c", SUPERVISOR, str(ws), token, point],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == -9, p.stderr

    def running() -> list[int]:
        return procs_mentioning(token)

    # bwrap stops by itself, or (once it was in the run's cgroup) waits, inert, for the
    # sweep of the next corral start, which kills what is left in a dead run's cgroup
    time.sleep(0.5)
    rundir.sweep_stale()
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running() == [], "bwrap outlived its supervisor and the sweep"
    assert not (ws / "ran").exists(), "the command ran without its supervisor"
    # the control: the same run with a live supervisor does write the file
    p = subprocess.run([sys.executable, "-c", SUPERVISOR, str(ws), token, "none"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    assert (ws / "ran").read_text().strip() == token


# -- cgroup reuse ----------------------------------------------------------------------------

def _v1() -> bool:
    from corral.linux import limits

    return limits.detect().version == "v1"


needs_v1 = pytest.mark.skipif(not _v1(), reason="run cgroups are reused on cgroup v1 only")


@needs_v1
def test_a_sandbox_keeps_its_cgroup_and_the_pool_passes_it_on():
    from corral.backends.host.cgroups import POOL
    from corral.backends.host.deferred import DEFERRED

    # the pool hands out its oldest idle cgroup of a kind first: start from an empty one
    # (the earlier tests of this process leave theirs there)
    POOL.drain()
    burn = "x = b'x' * (64 << 20)\nimport time\nt = time.process_time()\n" \
           "while time.process_time() - t < 0.3: pass"
    with corral.Sandbox() as sb:
        first = sb.exec([PY, "-c", burn])
        (kept,) = sb._live._cgroups
        second = sb.exec(["/bin/true"])
        assert sb._live._cgroups == [kept]          # the same cgroup, counters started again
        assert first.usage.memory_peak_bytes >= 64 << 20 and first.usage.cpu_s >= 0.3
        assert second.usage.memory_peak_bytes < 16 << 20, second.usage
        assert second.usage.cpu_s < 0.2, second.usage
        assert not any(cg is kept for cg in POOL._idle)   # never shared while open
    assert any(cg is kept for cg in POOL._idle)
    in_use = []
    r = corral.run(["/bin/echo", "x"],
                   on_stdout=lambda _: in_use.append(any(cg is kept for cg in POOL._idle)))
    assert r.verdict == "ok" and in_use == [False]    # the next run took it
    DEFERRED.flush()       # a one-shot run's teardown thread gives it back (deferred.py)
    assert any(cg is kept for cg in POOL._idle)       # and gave it back


@needs_v1
def test_an_open_sandboxs_scratch_never_counts_against_another():
    """A sandbox's scratch files are memory charged to its cgroup; the pool must not hand
    that cgroup to another sandbox while they exist."""
    policy = {"limits": {"memory": "96M"}}
    with corral.Sandbox(policy) as a:
        r = a.exec(["/bin/sh", "-c", "head -c 64000000 /dev/zero > /scratch/fill"])
        assert r.verdict == "ok", r
        b = run("x = b'x' * (48 << 20)", policy)
        assert b.verdict == "ok", b          # 64 + 48 MB would not fit in one 96 MB cgroup
    c = run("x = b'x' * (72 << 20)", policy)   # a's cgroup, its tmpfs gone, is fine again
    assert c.verdict == "ok", c


POOL_SCRIPT = """
import os, sys
import corral
from corral.backends.host.cgroups import POOL

assert corral.run(["/bin/true"]).verdict == "ok"
from corral.backends.host.deferred import DEFERRED
DEFERRED.flush()   # its teardown thread gives the run's cgroup to the pool
paths = [p for cg in POOL._idle for p in cg.paths] + [POOL._dir.path]
print(" ".join(paths), flush=True)
how = sys.argv[1]
if how == "crash":
    os.kill(os.getpid(), 9)
if how == "fork":
    key = POOL._idle[0].key
    pid = os.fork()
    if pid == 0:
        assert POOL.take(key) is None      # not the parent's to take
        sys.exit(0)                         # a normal exit: runs the inherited atexit hooks
    os.waitpid(pid, 0)
    print("kept" if all(os.path.exists(p) for p in paths) else "lost", flush=True)
"""


@needs_v1
@pytest.mark.parametrize("how", ["exit", "crash", "fork"])
def test_pooled_cgroups_go_at_exit_and_with_the_sweep_after_a_crash(how):
    import subprocess

    from corral.linux import rundir

    p = subprocess.run([sys.executable, "-c", POOL_SCRIPT, how], capture_output=True,
                       text=True, timeout=60, check=False)
    lines = p.stdout.split("\n")
    paths = lines[0].split()
    assert len(paths) >= 2, p.stderr
    if how == "fork":
        assert lines[1] == "kept" and p.returncode == 0, p.stderr
    if how == "crash":
        assert p.returncode == -9
        assert all(os.path.exists(path) for path in paths)   # left by the dead process
        rundir.sweep_stale()                                  # the next corral start
    assert not any(os.path.exists(path) for path in paths)


SHORT_LIVED_SCRIPT = """
import os
import corral
from corral.backends.host.cgroups import POOL

POOL.short_lived()   # as `corral run` says it
with corral.Sandbox() as sb:
    assert sb.exec(["/bin/true"]).verdict == "ok"
    (cg,) = sb._live._cgroups
    run_dir = sb._live.dir.path
    assert os.path.exists(os.path.join(run_dir, "cgroups"))
    assert all(os.path.exists(p) for p in cg.paths)
print(" ".join(cg.paths), run_dir, POOL._dir, len(POOL._idle), flush=True)
"""


@needs_v1
def test_a_short_lived_process_removes_its_cgroups_at_close():
    """`corral run` (POOL.short_lived()): the sandbox's cgroups go with it at close, as its
    run dir does; no pool run dir is made and nothing is left for the exit handler."""
    import subprocess

    p = subprocess.run([sys.executable, "-c", SHORT_LIVED_SCRIPT], capture_output=True,
                       text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    *cgroups, run_dir, pool_dir, idle = p.stdout.split()
    assert (pool_dir, idle) == ("None", "0")
    assert cgroups and not any(os.path.exists(c) for c in cgroups)
    assert not os.path.exists(run_dir)


LEFT_OPEN_SCRIPT = """
import os, sys
import corral

sb = corral.Sandbox().open()
assert sb.exec(["/bin/sh", "-c", "echo kept > /scratch/x"]).verdict == "ok"
live = sb._live
print(live.dir.path, live.scratch, " ".join(cg for c in live._cgroups for cg in c.paths),
      flush=True)
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        del sb, live
        sys.exit(0)     # a normal exit: atexit hooks and the garbage collector both run
    os.waitpid(pid, 0)
    print(sb.exec(["cat", "/scratch/x"]).stdout.strip(), flush=True)
# left open: the exit closes it
"""


@pytest.mark.parametrize("how", ["exit", "fork"])
def test_a_sandbox_left_open_is_closed_at_exit_and_never_by_a_forked_child(how):
    """A program that exits with a Sandbox still open leaves no run dir, scratch mount or
    cgroup behind (and prints no traceback from a half-torn-down interpreter); a forked
    child that exits normally does not touch its parent's sandbox."""
    import subprocess

    p = subprocess.run([sys.executable, "-c", LEFT_OPEN_SCRIPT, how], capture_output=True,
                       text=True, timeout=60, check=False)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = p.stdout.split("\n")
    run_dir, scratch, *cgroups = lines[0].split()
    if how == "fork":
        assert lines[1] == "kept"          # the child's exit left it whole
    with open("/proc/self/mountinfo") as f:
        assert f" {scratch} " not in f.read()
    assert not os.path.exists(run_dir)
    assert not any(os.path.exists(c) for c in cgroups)


@needs_v1
def test_the_pools_record_stays_short_and_lists_what_it_holds():
    import uuid

    from corral.backends.host.cgroups import CgroupPool
    from corral.linux import limits

    pool = CgroupPool()
    made = []
    try:
        for _ in range(5 * CgroupPool.SIZE):
            cg = limits.RunCgroup.create(f"test-{uuid.uuid4().hex[:12]}", memory=64 << 20,
                                         pids=16, cpus=None)
            cg.key = ("test", 64 << 20)
            cg.kill_all()
            made.append(cg)
            pool.note([cg])
            assert pool.give([cg]) == []
        with open(os.path.join(pool._dir.path, "cgroups")) as f:
            record = f.read().split("\n")
        listed = {line.split()[1] for line in record if line}
        assert len(listed) <= 4 * CgroupPool.SIZE + 1          # compacted, not 40
        assert {cg.run_id for cg in pool._idle} <= listed       # what it holds is there
        assert len(pool._idle) == CgroupPool.SIZE
        assert all(not os.path.exists(p) for cg in made[CgroupPool.SIZE:] for p in cg.paths)
    finally:
        pool_dir = pool._dir.path if pool._dir else None
        pool.drain()
        for cg in made:
            cg.destroy()
    assert all(not os.path.exists(p) for cg in made for p in cg.paths)
    assert pool_dir is None or not os.path.exists(pool_dir)
