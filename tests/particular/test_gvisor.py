"""What is particular to the gvisor tier, tested under real runsc: gVisor's own kernel,
/proc and /sys, runsc's processes and state, the sandbox's root against the host, what
check() refuses, what auto skips, teardown when the supervisor dies. The containment every
tier shares (limits, network none and allow, env, workspace, ro_binds) is tested for all
tiers in tests/tiers (test_tiers.py, test_network.py); what only gvisor's network does, in
test_gvisor_network.py. gVisor's ptrace platform is slow to start (~0.2 s a run), so the
tests share runs where they can."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import mountinfo, procs_mentioning, procs_of_uid

import corral
from corral.backends.gvisor import GvisorBackend, find_runsc
from corral.errors import BackendUnavailable
from corral.linux import limits, rundir

PY = "/usr/bin/python3"
GV = {"isolation": "gvisor"}
pytestmark = [
    pytest.mark.skipif(find_runsc() is None, reason="runsc (gVisor) is not installed: "
                       "apt-get install runsc"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the gvisor tier needs root"),
]


def policy(**sections):
    return {**GV, **sections}


def run(code_or_argv, pol=None, **kw):
    argv = [PY, "-c", textwrap.dedent(code_or_argv)] if isinstance(code_or_argv, str) \
        else code_or_argv
    r = corral.run(argv, policy=pol or GV, **kw)
    assert r.isolation == "gvisor"
    return r


def sh(cmd, pol=None, **kw):
    return run(["/bin/sh", "-c", cmd], pol, **kw)


# procs_mentioning (conftest): runsc, its gofer, its Sentry and the Sentry's ptrace stubs
# all carry --root=<run dir>/runsc on their command lines



# -- the kernel and the filesystem ---------------------------------------------------------

def test_the_kernel_inside_is_gvisors():
    r = sh("uname -r; cat /proc/version; dmesg 2>&1 | head -5; "
           "grep -E 'CapEff|CapBnd' /proc/self/status; hostname; "
           "python3 -c 'import ctypes; print(\"nnp\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'")
    assert r.verdict == "ok", r
    with open("/proc/version") as f:
        host_version = f.read().strip()
    lines = r.stdout.splitlines()
    assert lines[0] != os.uname().release
    assert lines[1] != host_version and lines[1].startswith("Linux version")
    # dmesg is gVisor's ("Starting gVisor...") or refused (no CAP_SYSLOG): never the host's
    assert host_version not in r.stdout and os.uname().release not in r.stdout
    assert "gVisor" in r.stdout or "not permitted" in r.stdout
    assert "CapEff:\t0000000000000000" in r.stdout and "CapBnd:\t0000000000000000" in r.stdout
    assert lines[-2:] == ["corral", "nnp 1"]  # hostname; PR_GET_NO_NEW_PRIVS


def test_host_files_are_invisible(tmp_path):
    canary = tmp_path / "canary"
    canary.write_text("host secret")
    r = run(f"""
        import os, json
        paths = ["/home", "/root", "/run", "/var", "/etc/shadow", "/etc/ssh", "/etc/sudoers",
                 "/etc/machine-id", {str(canary)!r}, "/work", "/opt", "/srv", "/dev/kvm",
                 "/dev/sda", "/dev/vda", "/sys/kernel/debug", "/sys/fs/cgroup/memory",
                 "/proc/sys/kernel/core_pattern", "/sys/class/net/eth0"]
        print(json.dumps({{p: os.path.exists(p) for p in paths}}))
        print(sorted(os.listdir("/")))
        # /proc and /sys are gVisor's own, synthetic ones
        print(sorted(os.listdir("/sys/class/net")), len(os.listdir("/sys/fs/cgroup")))
        print(open("/etc/passwd").read())
    """)
    assert r.verdict == "ok", r
    seen = json.loads(r.stdout.splitlines()[0])
    assert not any(seen.values()), seen
    assert "'scratch'" in r.stdout and "'usr'" in r.stdout
    assert r.stdout.splitlines()[2] == "['lo'] 0"
    assert "root:x:0:0:sandbox:/scratch" in r.stdout
    with open("/etc/passwd") as f:
        host_users = [line.split(":")[0] for line in f if not line.startswith(("root:", "nobody:"))]
    assert not any(f"\n{u}:" in r.stdout for u in host_users)


def test_scratch_persists_across_execs_and_processes_end_with_each_exec():
    seen = {}
    with corral.Sandbox(GV) as sb:
        run_dir = sb._live.dir.path
        assert sb.exec(["/bin/sh", "-c", "echo kept > /scratch/note"]).ok

        def during(data):  # called while the sandbox runs: its processes exist now
            seen.setdefault("during", procs_mentioning(run_dir))

        daemons = "(setsid sleep 300 &); (nohup sleep 300 >/dev/null 2>&1 &)"
        r = sb.exec(["/bin/sh", "-c", f"{daemons}; echo started; sleep 1"], on_stdout=during)
        assert r.ok and "started" in r.stdout
        assert len(seen["during"]) >= 3  # runsc, the gofer, the Sentry (and its stubs)
        assert procs_mentioning(run_dir) == []
        assert procs_of_uid(sb._live.uid) == []  # the gofer ran as the run's uid
        assert os.listdir(os.path.join(run_dir, "runsc")) == []  # runsc's state is gone
        r2 = run_in(sb, "import os; print(open('/scratch/note').read().strip(), "
                        "len([p for p in os.listdir('/proc') if p.isdigit()]))")
        # the daemons of the previous exec are gone: only this python is left
        assert r2.stdout.split() == ["kept", "1"], r2
    assert not [m for m in mountinfo() if run_dir in m]
    assert not os.path.exists(run_dir)


def run_in(sb, code):
    return sb.exec([PY, "-c", code])


# -- the sandbox's root against the host -------------------------------------------------------

def test_sandbox_root_cannot_set_id_bits_make_devices_or_new_namespaces():
    r = run("""
        import ctypes, errno, os
        libc = ctypes.CDLL(None, use_errno=True)
        out = []
        open("/scratch/f", "w").close()
        for mode in (0o4755, 0o2755):
            try:
                os.chmod("/scratch/f", mode); out.append("chmod-ok")
            except OSError as e:
                out.append(errno.errorcode[e.errno])

        def unshare_user():
            if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
                raise OSError(ctypes.get_errno(), "unshare")

        for call in (lambda: os.open("/scratch/g", os.O_CREAT | os.O_WRONLY, 0o4755),
                     lambda: os.mknod("/scratch/dev", 0o600 | 0o020000, os.makedev(1, 3)),
                     unshare_user):
            try:
                call(); out.append("ok")
            except OSError as e:
                out.append(errno.errorcode[e.errno])
        for name, nr in (("clone3", 435), ("openat2", 437), ("fchmodat2", 452)):
            libc.syscall(nr, 0, 0, 0, 0)
            out.append(errno.errorcode[ctypes.get_errno()])
        try:
            os.setxattr("/scratch/f", "security.capability", b"x"); out.append("xattr-ok")
        except OSError as e:
            out.append("xattr-refused")
        print(" ".join(out))
    """)
    assert r.stdout.split() == ["EPERM"] * 5 + ["ENOSYS"] * 3 + ["xattr-refused"], r


@pytest.fixture
def foreign_workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_text("print('hi from workspace')\n")
    os.chown(ws / "main.py", 4242, 4242)
    os.chmod(ws / "main.py", 0o600)
    os.chown(ws, 4242, 4242)
    os.chmod(ws, 0o700)
    os.chmod(tmp_path, 0o755)
    return ws


def test_rw_workspace_writes_land_as_the_owner_and_never_setuid(tmp_path, foreign_workspace):
    r = sh("echo out > /workspace/result.txt && mkdir /workspace/d && "
           "chmod 4755 /workspace/result.txt 2>/dev/null; echo ok",
           policy(filesystem={"workspace": {"path": str(foreign_workspace), "mode": "rw"}}))
    assert r.stdout.strip() == "ok", r
    st = os.stat(foreign_workspace / "result.txt")
    assert (st.st_uid, st.st_gid) == (4242, 4242) and not st.st_mode & 0o6000
    assert (foreign_workspace / "result.txt").read_text() == "out\n"
    root_ws = tmp_path / "root-owned"  # a root-owned workspace: a setuid file would be root's
    root_ws.mkdir()
    r = run("""
        import os, shutil
        shutil.copy("/usr/bin/id", "/workspace/id")
        for mode in (0o4755, 0o6755):
            try:
                os.chmod("/workspace/id", mode)
            except OSError as e:
                print(e.strerror)
    """, policy(filesystem={"workspace": {"path": str(root_ws), "mode": "rw"}}))
    assert r.stdout.splitlines() == ["Operation not permitted"] * 2, r
    st = os.stat(root_ws / "id")
    assert st.st_uid == 0 and not st.st_mode & 0o6000
    assert not [m for m in mountinfo() if str(root_ws) in m]


@pytest.fixture
def var_tmp():
    import pathlib
    import shutil
    import tempfile

    d = tempfile.mkdtemp(dir="/var/tmp")  # /tmp is the sandbox's own: binds may not cover it
    yield pathlib.Path(d)
    shutil.rmtree(d)


def test_sandbox_root_is_not_host_root(var_tmp):
    """gVisor's uid 0 reaches host files only as the run's unprivileged uid (the gofer's
    mapping): a root-only host file under a bind is unreadable, and files it writes land
    owned by that uid."""
    shared = var_tmp / "shared"
    shared.mkdir()
    (shared / "secret").write_text("root only")
    os.chmod(shared / "secret", 0o600)
    (shared / "public").write_text("anyone")
    os.chmod(shared / "public", 0o644)
    os.chmod(shared, 0o755)
    os.chmod(var_tmp, 0o755)
    with corral.Sandbox(policy(filesystem={"ro_binds": [str(shared)]})) as sb:
        cmd = f"id -u; cat {shared}/public; echo; cat {shared}/secret 2>&1; echo x > /scratch/mine"
        r = sb.exec(["/bin/sh", "-c", cmd])
        lines = r.stdout.splitlines()
        assert lines[:2] == ["0", "anyone"] and "Permission denied" in lines[2], r
        st = os.stat(os.path.join(sb._live.scratch, "home", "mine"))
        assert st.st_uid == sb._live.uid >= 1_000_000


# -- what check() refuses ---------------------------------------------------------------------

def test_the_tier_needs_runsc_and_root(monkeypatch):
    plan = corral.runtime.tiers.build_plan(corral.runtime.tiers.coerce_policy(GV), {})
    b = GvisorBackend()
    assert b.check(plan).gaps == ()  # everything of the default policy is enforced here
    b.runsc = None
    with pytest.raises(BackendUnavailable, match="apt-get install runsc"):
        b.check(plan)
    b = GvisorBackend()
    b.root = False
    with pytest.raises(BackendUnavailable, match="needs root"):
        b.check(plan)
    with pytest.raises(BackendUnavailable, match="no platform"):
        GvisorBackend(platform="nosuch").check(plan)


def test_auto_passes_over_a_runsc_that_breaks_statx_with_network_allow_or_without():
    """Debian 12's runsc refuses the statx flag coreutils use (auto_skip): asked for by name
    the tier runs, but `isolation = "auto"` picks another, with or without a proxy."""
    from corral.runtime.tiers import coerce_policy, prepare

    skip = GvisorBackend().auto_skip()
    for network in ({}, {"network": {"mode": "allow", "allow": ["allowed.test"],
                                     "nameservers": ["127.0.0.1:53"]}}):
        pol = coerce_policy({**GV, **network})
        backend, _, check = prepare(pol)
        assert backend.name == check.tier == "gvisor" and not check.refused
        backend, _, check = prepare(pol.replace(isolation="auto"))
        assert backend.name == check.tier
        assert (backend.name != "gvisor") if skip else (backend.name == "gvisor"), skip


# -- teardown when the supervisor dies --------------------------------------------------------

VICTIM = """
import corral, sys
sb = corral.Sandbox({"isolation": "gvisor"})
sb.open()
print(sb._live.dir.path, sb._live.uid, flush=True)
sb.exec(["/bin/sh", "-c", "(setsid sleep 300 &); sleep 300"])
"""


def test_supervisor_death_leaves_nothing_running_and_next_start_cleans_up():
    p = subprocess.Popen([sys.executable, "-c", VICTIM], stdout=subprocess.PIPE, text=True)
    run_dir, uid = p.stdout.readline().split()
    deadline = time.monotonic() + 10
    while len(procs_mentioning(run_dir)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(procs_mentioning(run_dir)) >= 3, "runsc, its gofer and Sentry should run"
    assert os.listdir(os.path.join(run_dir, "runsc")), "runsc keeps state while it runs"
    p.kill()
    p.wait()
    p.stdout.close()
    deadline = time.monotonic() + 5
    while (procs_mentioning(run_dir) or procs_of_uid(int(uid))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs_mentioning(run_dir) == [] and procs_of_uid(int(uid)) == []
    run_id = os.path.basename(run_dir)
    swept = rundir.sweep_stale()  # what the next start does first
    corral.run(["true"], policy=GV)
    assert not os.path.exists(run_dir)
    assert not [m for m in mountinfo() if run_dir in m]
    if run_id not in swept:
        # a concurrent corral start (another test run) swept it first; one that lives in
        # another cgroup cannot see this run's cgroups below ours, so sweep those here
        limits.RunCgroup.sweep_stale(lambda r: r.split("-")[0] == run_id)
    for _, parent in limits.detect().parents:
        if os.path.isdir(parent):
            assert not [n for n in os.listdir(parent) if n.split("-")[0] == run_id]


def test_the_platform_is_systrap_where_runsc_has_it_else_ptrace(monkeypatch):
    from corral.backends.gvisor import PLATFORM_ENV, runsc_platforms

    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    offered = runsc_platforms(find_runsc())
    assert "ptrace" in offered
    want = "systrap" if "systrap" in offered else "ptrace"
    assert GvisorBackend().platform == want
    monkeypatch.setenv(PLATFORM_ENV, "ptrace")
    assert GvisorBackend().platform == "ptrace"
    r = corral.run(["/bin/true"], policy=GV)   # runs on the platform chosen by default
    assert r.ok and r.isolation == "gvisor"


def _zombie_children():
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids = f.read().split()
        except FileNotFoundError:
            continue  # a thread that just ended
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as g:
                    if g.read().rsplit(")", 1)[1].split()[0] == "Z":
                        out.append(int(pid))
            except FileNotFoundError:
                pass
    return out


def test_no_zombie_is_left_with_the_supervisor():
    """runsc's gofer, Sentry and stubs that outlive runsc come to the supervisor (a
    subreaper while runsc runs); each run reaps them, clean exit or kill."""
    before = set(_zombie_children())
    for _ in range(3):
        assert corral.run(["/bin/true"], policy=GV).ok
    r = corral.run(["sleep", "10"], policy={**GV, "limits": {"timeout": "1s"}})
    assert r.verdict == "timeout"
    assert set(_zombie_children()) - before == set()


def _sentries(run_dir):
    """(pid, real/effective/saved/fs uids) of runsc's Sentry processes of a run dir."""
    found = []
    for pid in procs_mentioning(run_dir):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0] != b"runsc-sandbox":
                    continue
            with open(f"/proc/{pid}/status") as f:
                uids = [ln.split()[1:] for ln in f if ln.startswith("Uid:")][0]
        except OSError:
            continue
        found.append((pid, [int(u) for u in uids]))
    return found


def test_each_sandbox_has_a_sentry_uid_of_its_own():
    """Issue 13 item 7: two sandboxes alive at once have Sentries of different host uids,
    neither root nor the host's nobody, nor the gofer's (the run's) uid; nothing of that
    uid is left once the sandbox is closed."""
    import threading

    boxes, seen, results, uids = [], {}, {}, []
    pipes = [os.pipe() for _ in range(2)]
    try:
        boxes = [corral.Sandbox(GV), corral.Sandbox(GV)]
        ready = [threading.Event(), threading.Event()]

        def go(i):
            results[i] = boxes[i].exec(["/bin/sh", "-c", "echo up; read x"],
                                       stdin=pipes[i][0],
                                       on_stdout=lambda data, i=i: ready[i].set())

        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for i, ev in enumerate(ready):
            assert ev.wait(120), f"sandbox {i} did not start"
            seen[i] = _sentries(boxes[i]._live.dir.path)
        for _, w in pipes:
            os.write(w, b"x\n")
        for t in threads:
            t.join(120)
        assert all(results[i].ok for i in range(2)), results
        uids = []
        for i in range(2):
            assert seen[i], f"no Sentry of sandbox {i} found"
            (uid,) = {u for _, us in seen[i] for u in us}   # one uid, all four fields
            assert uid not in (0, 65534, boxes[i]._live.uid)
            assert uid == boxes[i]._live.sentry_uid
            uids.append(uid)
        assert uids[0] != uids[1]
    finally:
        for b in boxes:
            b.close()
        for r, w in pipes:
            os.close(r)
            os.close(w)
    for uid in uids:
        assert procs_of_uid(uid) == []
        for d in ("/tmp", "/dev/shm", "/var/tmp"):
            assert [n for n in os.listdir(d)
                    if os.lstat(os.path.join(d, n)).st_uid == uid] == [], d
