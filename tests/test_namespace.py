"""The namespace tier's containment, tested by running real code in real sandboxes.

Each test that could hurt the host if isolation failed first checks that the isolation it
relies on is in place (e.g. the pids cgroup before a fork loop)."""

import json
import os
import signal
import socket
import subprocess
import textwrap
import time

import pytest

import corral
from corral import limits

PY = "/usr/bin/python3"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="these tests exercise the root path")


def mountinfo():
    with open("/proc/self/mountinfo") as f:
        return f.read().splitlines()


def run(code_or_argv, policy=None, **kw):
    argv = [PY, "-c", textwrap.dedent(code_or_argv)] if isinstance(code_or_argv, str) \
        else code_or_argv
    return corral.run(argv, policy=policy, **kw)


def sh(cmd, policy=None, **kw):
    return corral.run(["/bin/sh", "-c", cmd], policy=policy, **kw)


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


def test_root_is_read_only_and_scratch_is_writable():
    r = sh("for p in /usr/x /etc/x /x /bin/x /proc/x; do touch $p 2>&1; done; "
           "echo data > /scratch/f && echo data > /tmp/f && echo data > /dev/shm/f && cat /scratch/f")
    assert r.verdict == "ok"
    assert r.stderr == "" and r.stdout.count("Read-only file system") >= 4
    assert r.stdout.strip().endswith("data")


def test_scratch_size_cap_gives_enospc_and_tmp_counts_against_it():
    r = sh("dd if=/dev/zero of=/tmp/big bs=1M count=10 2>/dev/null; "
           "dd if=/dev/zero of=/scratch/more bs=1M count=10 2>&1; df -k /scratch",
           {"limits": {"scratch": "8M"}})
    assert "No space left on device" in r.stdout
    assert any(e.get("limit") == "scratch" for e in r.events)


def test_scratch_inode_cap_gives_enospc():
    r = run("""
        import os, errno
        n = 0
        try:
            while n < 10000:
                open(f"/dev/shm/f{n}", "w").close(); n += 1
        except OSError as e:
            print(errno.errorcode[e.errno], n)
    """, {"limits": {"scratch_inodes": 100}})
    code, n = r.stdout.split()
    assert code == "ENOSPC" and int(n) < 100
    assert any(e.get("limit") == "scratch_inodes" for e in r.events)


def test_scratch_persists_across_execs_and_processes_end_with_each_exec():
    with corral.Sandbox() as sb:
        run_dir = sb._live.dir.path
        assert sb.exec(["/bin/sh", "-c", "echo kept > /scratch/note"]).ok
        r = sb.exec(["/bin/sh", "-c", "(setsid sleep 300 &) ; echo started"])
        assert r.ok and "started" in r.stdout
        r2 = sb.exec(["/bin/sh", "-c", "cat /scratch/note; ls /proc | grep -c '^[0-9]'"])
        assert r2.stdout.split()[0] == "kept"
        # only this exec's own processes exist: sh, grep, ls (and bwrap's init)
        assert int(r2.stdout.split()[1]) <= 5
    # after close, the scratch tmpfs and the run directory are gone
    assert not [m for m in mountinfo() if run_dir in m]
    assert not os.path.exists(run_dir)


# -- the environment -----------------------------------------------------------------------

def test_env_is_scrubbed_and_pass_and_set_work(monkeypatch):
    monkeypatch.setenv("CORRAL_TEST_SECRET", "s3cr3t")
    monkeypatch.setenv("CORRAL_TEST_PASSED", "visible")
    r = run("import os, json; print(json.dumps(dict(os.environ)))",
            {"env": {"pass": ["CORRAL_TEST_PASSED"], "set": {"EXTRA": "1"}}})
    env = json.loads(r.stdout)
    assert "s3cr3t" not in r.stdout
    assert env["CORRAL_TEST_PASSED"] == "visible" and env["EXTRA"] == "1"
    assert env["HOME"] == "/scratch" and env["TERM"] == "dumb" and env["LANG"] == "C.UTF-8"
    assert set(env) <= {"PATH", "HOME", "LANG", "TERM", "CORRAL_TEST_PASSED", "EXTRA", "PWD",
                        "LC_CTYPE"}
    r = sh("cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert "s3cr3t" not in r.stdout


# -- the network ---------------------------------------------------------------------------

def test_no_network():
    with socket.socket() as listener:
        _no_network(listener)


def _no_network(listener):
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0)
    port = listener.getsockname()[1]
    r = run(f"""
        import socket, os
        out = []
        for target in [("127.0.0.1", {port})]:
            try:
                socket.create_connection(target, timeout=2); out.append("connected")
            except OSError as e:
                out.append(type(e).__name__)
        try:
            socket.getaddrinfo("example.com", 80); out.append("resolved")
        except OSError as e:
            out.append("noresolve")
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"x", ("192.0.2.1", 53)); out.append("sent")
        except OSError as e:
            out.append(e.strerror)
        print(out, sorted(os.listdir("/sys/class/net")) if os.path.exists("/sys/class/net") else "nosys")
        print(open("/proc/net/dev").read())
    """)
    assert "ConnectionRefusedError" in r.stdout and "noresolve" in r.stdout
    assert "Network is unreachable" in r.stdout and "sent" not in r.stdout.split("]")[0]
    ifaces = [line.split(":")[0].strip() for line in r.stdout.splitlines() if ":" in line
              and "|" not in line and not line.startswith("[")]
    assert ifaces == ["lo"], r.stdout
    with pytest.raises(BlockingIOError):
        listener.accept()


# -- limits ----------------------------------------------------------------------------------

def test_memory_limit_gives_oom_from_the_cgroup_counter():
    r = run("b = bytearray(200 << 20); print('allocated')", {"limits": {"memory": "64M"}})
    assert r.verdict == "oom" and r.signal == signal.SIGKILL
    assert "allocated" not in r.stdout
    assert any(e.get("limit") == "memory" for e in r.events)
    assert r.usage.memory_peak_bytes <= 64 << 20


def test_kill_9_is_killed_not_oom():
    r = sh("kill -9 $$")
    assert r.verdict == "killed" and r.signal == 9 and r.exit_code is None


def test_pids_limit_contains_a_bounded_fork_loop():
    assert limits.detect().pids, "the pids cgroup must be usable before a fork loop runs"
    r = run("""
        import os, time
        n = 0
        try:
            for _ in range(500):
                if os.fork() == 0:
                    time.sleep(20); os._exit(0)
                n += 1
        except OSError as e:
            print("stopped", n, e.errno)
    """, {"limits": {"pids": 32, "timeout": "20s"}})
    words = r.stdout.split()
    assert words[0] == "stopped" and int(words[1]) < 32 and words[2] == "11"  # EAGAIN
    assert r.usage.wall_s < 15  # the sleeping children did not keep the run alive


@pytest.mark.parametrize("cmd", [
    ["sleep", "30"],
    [PY, "-c", "while True: pass"],
    [PY, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"],
])
def test_timeout_fires(cmd):
    t = time.monotonic()
    r = corral.run(cmd, {"limits": {"timeout": "1s", "cpu_time": "20s"}})
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
    """, {"limits": {"cpu_time": "1s", "timeout": "20s", "cpus": 2}})
    assert r.verdict == "timeout"
    assert [e for e in r.events if e.get("limit") == "cpu_time"]
    assert 1.0 <= r.usage.cpu_s < 3


def test_exit_codes_and_signals_propagate():
    assert sh("exit 3").exit_code == 3 and sh("exit 3").verdict == "error"
    r = sh("kill -TERM $$")
    assert (r.verdict, r.signal, r.exit_code) == ("killed", 15, None)
    r = sh("exit 0")
    assert (r.verdict, r.exit_code, r.signal) == ("ok", 0, None)


def test_output_cap_truncates_without_stopping_the_child():
    r = run("""
        import sys
        sys.stdout.write("x" * 300000); sys.stdout.flush()
        sys.stderr.write("e" * 10); sys.stderr.flush()
        open("/scratch/done", "w").write("1")
        raise SystemExit(7)
    """, {"limits": {"output": "100K"}})
    assert r.exit_code == 7 and r.verdict == "error"
    assert len(r.stdout) == 100 * 1024 and r.stdout_truncated and not r.stderr_truncated
    assert r.stderr == "e" * 10
    assert any(e.get("limit") == "output" and e.get("stream") == "stdout" for e in r.events)


def _procs_of_uid(uid):
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


def test_no_process_survives_the_run_double_forked_daemons_included():
    r = sh("cat /proc/self/uid_map; (setsid sh -c 'sleep 300 & sleep 300' &); "
           "(nohup sleep 300 >/dev/null 2>&1 &); echo spawned")
    host_uid = int(r.stdout.split()[1])
    assert host_uid >= 1_000_000 and "spawned" in r.stdout
    time.sleep(0.2)
    assert _procs_of_uid(host_uid) == []


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


def test_stdin_is_dev_null_unless_given():
    assert sh("cat; readlink /proc/self/fd/0").stdout.strip() == "/dev/null"
    assert sh("cat", stdin=b"from caller").stdout == "from caller"


# -- the workspace ---------------------------------------------------------------------------

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
    r = sh("pwd; cat main.py; touch new 2>&1", {"filesystem": {"workspace": {
        "path": str(foreign_workspace), "mode": "ro"}}})
    assert r.stdout.splitlines()[0] == "/workspace"
    assert "print('hi from workspace')" in r.stdout and "Read-only file system" in r.stdout


def test_rw_workspace_writes_land_as_the_owner(foreign_workspace):
    r = sh("echo out > /workspace/result.txt && mkdir /workspace/d && echo ok",
           {"filesystem": {"workspace": {"path": str(foreign_workspace), "mode": "rw"}}})
    assert r.stdout.strip() == "ok", r
    st = os.stat(foreign_workspace / "result.txt")
    assert (st.st_uid, st.st_gid) == (4242, 4242)
    assert (foreign_workspace / "result.txt").read_text() == "out\n"


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
        assert not (st.st_mode & 0o170000) in (0o020000, 0o060000), name
    assert not [m for m in mountinfo() if str(ws) in m]


@pytest.fixture
def var_tmp():
    import pathlib
    import shutil
    import tempfile

    d = tempfile.mkdtemp(dir="/var/tmp")  # /tmp is the sandbox's own: binds may not cover it
    yield pathlib.Path(d)
    shutil.rmtree(d)


def test_ro_binds_are_read_only(var_tmp):
    tmp_path = var_tmp
    d = tmp_path / "shared"
    d.mkdir()
    (d / "f").write_text("shared data")
    os.chmod(tmp_path, 0o755)
    os.chmod(d, 0o755)
    os.chmod(d / "f", 0o644)
    r = sh(f"cat {d}/f; touch {d}/g 2>&1", {"filesystem": {"ro_binds": [str(d)]}})
    assert "shared data" in r.stdout and "Read-only file system" in r.stdout


# -- teardown when the supervisor dies --------------------------------------------------------

def _lock_is_free(path):
    import fcntl

    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return False  # another (live) user's run that has just ended
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def test_supervisor_death_leaves_nothing_running_and_next_start_cleans_up(corral_bin):
    before = set(os.listdir("/run/corral"))
    p = subprocess.Popen([corral_bin, "run", "--", "/bin/sh", "-c",
                          "cat /proc/self/uid_map; (setsid sleep 300 &); sleep 300"],
                         stdout=subprocess.PIPE, text=True)
    host_uid = int(p.stdout.readline().split()[1])
    new = set(os.listdir("/run/corral")) - before
    assert _procs_of_uid(host_uid), "the sandbox should be running"
    p.kill()
    p.wait()
    p.stdout.close()
    deadline = time.monotonic() + 5
    while _procs_of_uid(host_uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_of_uid(host_uid) == []
    assert new, "the run made a directory in /run/corral"
    # (another corral start running concurrently may sweep it first; either way it goes)
    run_dirs = {d for d in new if _lock_is_free(f"/run/corral/{d}/lock")} or new
    corral.run(["true"])  # the next start sweeps what the dead supervisor left
    assert not set(run_dirs) & set(os.listdir("/run/corral"))
    mounts = "\n".join(mountinfo())
    assert not any(d in mounts for d in run_dirs)
    cg = limits.detect()
    for _, parent in cg.parents:
        if os.path.isdir(parent):
            assert not [n for n in os.listdir(parent) if n.split("-")[0] in run_dirs]


def test_signal_dispositions_are_the_defaults():
    r = sh("grep -E 'SigIgn|SigBlk' /proc/self/status; yes | head -1")
    assert "SigIgn:\t0000000000000000" in r.stdout and "SigBlk:\t0000000000000000" in r.stdout
    assert r.stdout.rstrip().endswith("y") and "Broken pipe" not in r.stderr
    r = sh("exec dd if=/dev/zero of=/scratch/big bs=8192 count=1", {"limits": {"file_size": 4096}})
    assert r.signal == 25  # SIGXFSZ, not a quiet EFBIG
