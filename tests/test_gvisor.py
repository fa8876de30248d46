"""The gvisor tier's containment, tested by running real code under real runsc.

Each test that could hurt the host if isolation failed first checks that the isolation it
relies on is in place (e.g. RLIMIT_NPROC inside gVisor before a fork loop). gVisor's ptrace
platform is slow to start (~0.2 s a run), so the tests share runs where they can."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import corral
from corral import limits, rundir
from corral.backends.gvisor import GvisorBackend, find_runsc
from corral.errors import BackendUnavailable

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


def mountinfo():
    with open("/proc/self/mountinfo") as f:
        return f.read().splitlines()


def procs_mentioning(text):
    """Host processes whose command line contains `text` (runsc, its gofer, its Sentry and
    the Sentry's ptrace stubs all carry --root=<run dir>/runsc)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def procs_of_uid(uid):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("Uid:") and int(line.split()[1]) == uid:
                            found.append(int(pid))
            except OSError:
                pass
    return found


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


def test_root_is_read_only_and_scratch_is_writable():
    r = sh("for p in /usr/x /etc/x /x /bin/x /lib/x /proc/x; do touch $p 2>&1; done; "
           "echo data > /scratch/f && echo data > /tmp/f && echo data > /dev/shm/f && cat /scratch/f")
    assert r.verdict == "ok", r
    refusals = [line for line in r.stdout.splitlines() if line.startswith("touch:")]
    assert len(refusals) == 6, r.stdout
    assert all("Read-only file system" in x or "Permission denied" in x for x in refusals)
    assert r.stdout.strip().endswith("data")


def test_scratch_size_cap_gives_enospc_and_tmp_counts_against_it():
    r = sh("dd if=/dev/zero of=/tmp/big bs=1M count=10 2>/dev/null; "
           "dd if=/dev/zero of=/scratch/more bs=1M count=10 2>&1",
           policy(limits={"scratch": "8M"}))
    assert "No space left on device" in r.stdout
    assert any(e.get("limit") == "scratch" for e in r.events)


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


# -- the environment -----------------------------------------------------------------------

def test_env_is_scrubbed_and_pass_and_set_work(monkeypatch):
    monkeypatch.setenv("CORRAL_TEST_SECRET", "s3cr3t")
    monkeypatch.setenv("CORRAL_TEST_PASSED", "visible")
    r = run("import os, json; print(json.dumps(dict(os.environ))); "
            "print(open('/proc/1/environ').read())",
            policy(env={"pass": ["CORRAL_TEST_PASSED"], "set": {"EXTRA": "1"}}))
    env = json.loads(r.stdout.splitlines()[0])
    assert "s3cr3t" not in r.stdout
    assert env["CORRAL_TEST_PASSED"] == "visible" and env["EXTRA"] == "1"
    assert env["HOME"] == "/scratch" and env["TERM"] == "dumb" and env["LANG"] == "C.UTF-8"
    assert set(env) <= {"PATH", "HOME", "LANG", "TERM", "CORRAL_TEST_PASSED", "EXTRA", "PWD",
                        "LC_CTYPE"}


# -- the network ---------------------------------------------------------------------------

def test_no_network():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(5)
        listener.settimeout(0)
        port = listener.getsockname()[1]
        r = run(f"""
            import socket, os
            out = []
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2); out.append("connected")
            except OSError as e:
                out.append(type(e).__name__)
            try:
                socket.getaddrinfo("example.com", 80); out.append("resolved")
            except OSError:
                out.append("noresolve")
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                s.sendto(b"x", ("192.0.2.1", 53)); out.append("sent")
            except OSError as e:
                out.append("unsent")
            print(out)
            print(open("/proc/net/dev").read())
        """)
        assert r.stdout.splitlines()[0] == "['ConnectionRefusedError', 'noresolve', 'unsent']", r
        ifaces = [line.split(":")[0].strip() for line in r.stdout.splitlines()[1:]
                  if ":" in line and "|" not in line]
        assert ifaces == ["lo"], r.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()


# -- limits ----------------------------------------------------------------------------------

def test_memory_limit_gives_oom_from_the_cgroup_counter():
    assert limits.detect().memory, "the memory cgroup must be usable"
    r = run("b = bytearray(200 << 20); print('allocated')", policy(limits={"memory": "64M"}))
    assert r.verdict == "oom" and r.signal == signal.SIGKILL, r
    assert "allocated" not in r.stdout
    assert any(e.get("limit") == "memory" for e in r.events)
    assert r.usage.memory_peak_bytes <= 64 << 20


def test_pids_limit_contains_a_bounded_fork_loop():
    with corral.Sandbox(policy(limits={"pids": 32, "timeout": "20s"})) as sb:
        r = run_in(sb, "import resource; print(*resource.getrlimit(resource.RLIMIT_NPROC))")
        assert r.stdout.split() == ["32", "32"], "RLIMIT_NPROC must be in place first"
        r = run_in(sb, textwrap.dedent("""
            import os, time
            n = 0
            try:
                for _ in range(200):
                    if os.fork() == 0:
                        time.sleep(20); os._exit(0)
                    n += 1
            except OSError as e:
                print("stopped", n, e.errno)
        """))
    words = r.stdout.split()
    assert words[0] == "stopped" and int(words[1]) < 32 and words[2] == "11", r  # EAGAIN
    assert r.usage.wall_s < 15  # the sleeping children did not keep the run alive


@pytest.mark.parametrize("cmd", [
    ["sleep", "30"],
    [PY, "-c", "while True: pass"],
])
def test_timeout_fires(cmd):
    t = time.monotonic()
    r = run(cmd, policy(limits={"timeout": "1s", "cpu_time": "20s"}))
    assert r.verdict == "timeout"
    assert time.monotonic() - t < 6
    assert any(e.get("limit") == "timeout" for e in r.events)


def test_cpu_time_limit_counts_every_process():
    r = run("""
        import os
        for _ in range(2):
            if os.fork() == 0:
                while True: pass
        while True: pass
    """, policy(limits={"cpu_time": "1s", "timeout": "20s", "cpus": 2}))
    assert r.verdict == "timeout"
    assert [e for e in r.events if e.get("limit") == "cpu_time"]
    assert 1.0 <= r.usage.cpu_s < 3


def test_exit_codes_and_signals_propagate():
    r = sh("exit 3")
    assert (r.verdict, r.exit_code, r.signal) == ("error", 3, None)
    r = sh("kill -TERM $$")
    assert (r.verdict, r.signal, r.exit_code) == ("killed", 15, None)
    r = sh("kill -9 $$")
    assert (r.verdict, r.signal, r.exit_code) == ("killed", 9, None)
    r = sh("exit 0")
    assert (r.verdict, r.exit_code, r.signal) == ("ok", 0, None)


def test_output_cap_truncates_without_stopping_the_child():
    r = run("""
        import sys
        sys.stdout.write("x" * 300000); sys.stdout.flush()
        sys.stderr.write("e" * 10); sys.stderr.flush()
        open("/scratch/done", "w").write("1")
        raise SystemExit(7)
    """, policy(limits={"output": "100K"}))
    assert r.exit_code == 7 and r.verdict == "error"
    assert len(r.stdout) == 100 * 1024 and r.stdout_truncated and not r.stderr_truncated
    assert r.stderr == "e" * 10
    assert any(e.get("limit") == "output" and e.get("stream") == "stdout" for e in r.events)


def test_rlimits_and_stdin():
    r = sh("ulimit -n; ulimit -c; dd if=/dev/zero of=/scratch/big bs=1M count=3 2>/dev/null; "
           "echo dd=$?; cat", policy(limits={"file_size": "1M", "open_files": 64}),
           stdin=b"from caller")
    lines = r.stdout.splitlines()
    assert lines[:2] == ["64", "0"]
    assert lines[2] == f"dd={128 + signal.SIGXFSZ}"  # killed by SIGXFSZ at 1 MiB
    assert lines[3] == "from caller"


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


def test_ro_workspace_is_readable_whatever_its_owner_and_not_writable(foreign_workspace):
    r = sh("pwd; cat main.py; touch new 2>&1",
           policy(filesystem={"workspace": {"path": str(foreign_workspace), "mode": "ro"}}))
    assert r.stdout.splitlines()[0] == "/workspace"
    assert "print('hi from workspace')" in r.stdout and "Read-only file system" in r.stdout


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


def test_ro_binds_are_read_only(var_tmp):
    d = var_tmp / "shared"
    d.mkdir()
    (d / "f").write_text("shared data")
    os.chmod(var_tmp, 0o755)
    os.chmod(d, 0o755)
    os.chmod(d / "f", 0o644)
    r = sh(f"cat {d}/f; touch {d}/g 2>&1", policy(filesystem={"ro_binds": [str(d)]}))
    assert "shared data" in r.stdout
    assert "Read-only file system" in r.stdout or "Permission denied" in r.stdout
    assert not (d / "g").exists()


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
    plan = corral.sandbox.build_plan(corral.sandbox.coerce_policy(GV), {})
    b = GvisorBackend()
    assert b.check(plan) == []  # everything of the default policy is enforced here
    b.runsc = None
    with pytest.raises(BackendUnavailable, match="apt-get install runsc"):
        b.check(plan)
    b = GvisorBackend()
    b.root = False
    with pytest.raises(BackendUnavailable, match="needs root"):
        b.check(plan)
    with pytest.raises(BackendUnavailable, match="no platform"):
        GvisorBackend(platform="nosuch").check(plan)


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
