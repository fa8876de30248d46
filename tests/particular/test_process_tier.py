"""The process tier (rlimits + Landlock + seccomp, no namespaces), on the real kernel.

This tier shares the host's PID and network namespaces and its filesystem, so a tier that
failed open would let a test's fork loop, `kill -1` or stray write reach the host. Those
tests first run a probe (`contained`) showing that Landlock stops a write to a
world-writable directory outside scratch, that the command has no root and no way to
signal a process of the test; only then do they run."""

import json
import os
import socket
import subprocess
import tempfile
import textwrap

import pytest
from conftest import CORRAL, procs_of_uid

import corral
from corral.backends.process import ProcessBackend
from corral.errors import BackendUnavailable
from corral.linux import landlock

PY = "/usr/bin/python3"
NOBODY = 65534
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="exercises corral running as root")
pytestmark = pytest.mark.skipif(landlock.abi() < 1, reason="the kernel has no Landlock")


def policy(extra=None):
    p = {"isolation": "process"}
    for k, v in (extra or {}).items():
        p[k] = v
    return p


def run(code, extra=None, **kw):
    return corral.run([PY, "-c", textwrap.dedent(code)], policy(extra), **kw)


def sh(cmd, extra=None, **kw):
    return corral.run(["/bin/sh", "-c", cmd], policy(extra), **kw)


@pytest.fixture(scope="module")
def outside_dir():
    """A world-writable directory outside every allowed path: only Landlock stands between
    the sandbox (whatever its uid) and a write here."""
    d = tempfile.mkdtemp(prefix="corral-outside-", dir="/var/tmp")
    os.chmod(d, 0o777)
    with open(os.path.join(d, "readable"), "w") as f:
        f.write("host data")
    os.chmod(os.path.join(d, "readable"), 0o644)
    yield d
    import shutil

    shutil.rmtree(d)


@pytest.fixture(scope="module")
def contained(outside_dir):
    """The probe the dangerous tests depend on. Fails (does not skip) if the tier is open."""
    canary = os.path.join(outside_dir, "canary")
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        r = run(f"""
            import os, errno
            out = {{}}
            try:
                open({canary!r}, "w").write("escaped"); out["write"] = "ok"
            except OSError as e:
                out["write"] = errno.errorcode[e.errno]
            open(os.environ["HOME"] + "/ok", "w").write("x")
            out["scratch"] = "ok"
            try:
                os.kill({sleeper.pid}, 0); out["signal"] = "ok"
            except OSError as e:
                out["signal"] = errno.errorcode[e.errno]
            out["uid"] = os.getuid()
            status = open("/proc/self/status").read()
            out["nnp"] = "NoNewPrivs:\\t1" in status
            out["seccomp"] = "Seccomp:\\t2" in status
            import json; print(json.dumps(out))
        """)
        got = json.loads(r.stdout)
        assert not os.path.exists(canary), "the process tier let a write out"
        assert got == {"write": "EACCES", "scratch": "ok", "signal": "EPERM",
                       "uid": got["uid"], "nnp": True, "seccomp": True}, got
        assert got["uid"] != 0
        assert sleeper.poll() is None
    except AssertionError as e:
        pytest.fail(f"the process tier is not contained here; harmful tests not run: {e}")
    finally:
        sleeper.kill()
        sleeper.wait()
    return got


# -- the filesystem -----------------------------------------------------------------------

def test_writes_outside_scratch_fail_with_eacces_while_scratch_works(contained, outside_dir):
    r = run(f"""
        import os, errno
        out = []
        for p in [{outside_dir + "/new"!r}, "/tmp/corral-x", "/var/tmp/corral-x", "/dev/shm/x",
                  "/usr/corral-x", "/etc/corral-x", "/x"]:
            try:
                open(p, "w").close(); out.append("wrote " + p)
            except OSError as e:
                out.append(errno.errorcode[e.errno])
        try:
            os.truncate({outside_dir + "/readable"!r}, 0); out.append("truncated")
        except OSError as e:
            out.append(errno.errorcode[e.errno])
        home, tmp = os.environ["HOME"], os.environ["TMPDIR"]
        open(home + "/f", "w").write("data")
        os.mkdir(home + "/d"); os.rename(home + "/f", home + "/d/f")
        os.symlink("d/f", home + "/link")
        open(tmp + "/t", "w").write("t")
        import tempfile; tempfile.NamedTemporaryFile().close()
        print(" ".join(out)); print(open(home + "/link").read(), os.getcwd() == home)
    """)
    words = r.stdout.split()
    assert words[:7] == ["EACCES"] * 5 + ["EACCES", "EACCES"], r
    assert words[7] in ("EACCES", "EPERM"), r
    assert words[8:] == ["data", "True"], r
    assert os.listdir(outside_dir) == ["readable"]
    with open(os.path.join(outside_dir, "readable")) as f:
        assert f.read() == "host data"


def test_home_directories_and_host_files_are_unreadable(contained, outside_dir):
    r = run(f"""
        import os, errno, json
        out = {{}}
        for p in ["/root", "/home", "/etc", "/var", "/run", "/tmp", "/sys", {outside_dir!r}]:
            try:
                os.listdir(p); out[p] = "listed"
            except OSError as e:
                out[p] = errno.errorcode[e.errno]
        for p in ["/etc/shadow", "/etc/passwd", "/etc/hostname", {outside_dir + "/readable"!r}]:
            try:
                open(p).read(); out[p] = "read"
            except OSError as e:
                out[p] = errno.errorcode[e.errno]
        out["ssl"] = os.path.isdir("/etc/ssl/certs") and bool(os.listdir("/etc/ssl/certs"))
        print(json.dumps(out))
    """)
    got = json.loads(r.stdout)
    assert got.pop("ssl") is True
    assert set(got.values()) == {"EACCES"}, got


def test_the_run_cannot_read_other_processes_environment(contained, monkeypatch):
    monkeypatch.setenv("CORRAL_TEST_SECRET", "s3cr3t")
    r = sh(f"cat /proc/{os.getpid()}/environ /proc/1/environ 2>&1; "
           f"ls /proc/{os.getpid()}/fd 2>&1 | head -1; cat /proc/{os.getpid()}/cmdline")
    assert "s3cr3t" not in r.stdout and "Permission denied" in r.stdout
    assert "pytest" in r.stdout or "python" in r.stdout  # cmdlines are visible: shared PIDs


# -- the environment ------------------------------------------------------------------------

def test_env_is_scrubbed_home_and_tmpdir_are_real_scratch_paths(monkeypatch):
    monkeypatch.setenv("CORRAL_TEST_SECRET", "s3cr3t")
    monkeypatch.setenv("CORRAL_TEST_PASSED", "visible")
    r = run("import os, json; print(json.dumps(dict(os.environ)))",
            {"env": {"pass": ["CORRAL_TEST_PASSED"],
                     "set": {"EXTRA": "1", "CACHE": "/scratch/.cache",
                             "PYTHONPATH": "/scratch/lib:/usr/lib"}}})
    env = json.loads(r.stdout)
    assert "s3cr3t" not in r.stdout
    assert env["CORRAL_TEST_PASSED"] == "visible" and env["EXTRA"] == "1"
    home = env["HOME"]
    assert home.endswith("/scratch/home") and home.startswith(("/run/corral/", "/tmp/"))
    assert env["TMPDIR"] == home[:-len("home")] + "tmp"
    assert env["CACHE"] == home + "/.cache" and env["PYTHONPATH"] == f"{home}/lib:/usr/lib"
    assert set(env) <= {"PATH", "HOME", "LANG", "TERM", "TMPDIR", "CORRAL_TEST_PASSED",
                        "EXTRA", "CACHE", "PYTHONPATH", "LC_CTYPE"}
    assert not os.path.exists(home)  # gone with the sandbox


# -- the network ------------------------------------------------------------------------------

def test_network_none_refuses_inet_sockets_and_host_unix_sockets(contained, tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0)
    port = listener.getsockname()[1]
    sock_dir = tempfile.mkdtemp(dir="/var/tmp")
    os.chmod(sock_dir, 0o755)
    upath = os.path.join(sock_dir, "host.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(upath)
    os.chmod(upath, 0o777)
    unix.listen(5)
    unix.settimeout(0)
    try:
        r = run(f"""
            import socket, errno
            out = []
            def attempt(f):
                try:
                    f(); out.append("ok")
                except OSError as e:
                    out.append(errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__)
            attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
            attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 53)))
            attempt(lambda: socket.socket(socket.AF_INET6))
            attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
            attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
            attempt(lambda: socket.socket(socket.AF_UNIX).connect({upath!r}))
            attempt(lambda: socket.socket(socket.AF_UNIX).bind("\\0corral-squat"))
            attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
            try:
                socket.getaddrinfo("example.com", 80); out.append("resolved")
            except socket.gaierror:
                out.append("noresolve")
            a, b = socket.socketpair(); a.send(b"pair"); out.append(b.recv(4).decode())
            print(" ".join(out))
        """)
        assert r.stdout.split() == ["EPERM"] * 8 + ["noresolve", "pair"], r
        with pytest.raises(BlockingIOError):
            listener.accept()
        with pytest.raises(BlockingIOError):
            unix.accept()
    finally:
        listener.close()
        unix.close()
        os.unlink(upath)
        os.rmdir(sock_dir)


# -- signals, processes, limits ----------------------------------------------------------------

def test_the_command_runs_as_a_dedicated_uid_with_no_capabilities(contained):
    r = sh("id -u; id -G; grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; "
           "grep 'Max processes' /proc/self/limits", {"limits": {"pids": 40}})
    lines = r.stdout.splitlines()
    uid = int(lines[0])
    assert uid >= 1_000_000_000 and lines[1] == str(uid)  # its own gid, no other groups
    assert all(line.endswith("0000000000000000") for line in lines[2:6]), lines
    assert lines[6].split()[2:4] == ["40", "40"]
    assert sh("id -u").stdout.strip() != str(uid)  # one uid per sandbox


def test_exit_codes_signals_and_missing_commands():
    assert (sh("exit 3").exit_code, sh("exit 3").verdict) == (3, "error")
    r = sh("kill -TERM $$")
    assert (r.verdict, r.signal, r.exit_code) == ("killed", 15, None)
    r = sh("kill -SEGV $$")
    assert (r.verdict, r.signal) == ("killed", 11)
    assert sh("exit 0").ok
    r = corral.run(["no-such-command-corral"], policy())
    assert (r.exit_code, r.verdict) == (127, "error") and "no-such-command-corral" in r.stderr
    r = corral.run(["/etc/hostname"], policy())  # exists, but Landlock refuses
    assert r.exit_code == 126 and "Permission denied" in r.stderr



@needs_root
def test_no_process_survives_double_forked_daemons_included(contained):
    with corral.Sandbox(policy()) as sb:
        r = sb.exec(["/bin/sh", "-c", ("id -u; (setsid sh -c 'sleep 300 & sleep 300' &); "
                     "(nohup sleep 301 >/dev/null 2>&1 &); (sleep 302 &) ; echo spawned")])
        uid = int(r.stdout.split()[0])
        assert "spawned" in r.stdout and r.ok
        assert procs_of_uid(uid) == []
        assert sb.exec(["/bin/sh", "-c", "echo again"]).stdout == "again\n"
    assert procs_of_uid(uid) == []


# -- check() --------------------------------------------------------------------------------------

def _plan(extra=None):
    from corral.plan import build_plan
    from corral.runtime.tiers import coerce_policy

    return build_plan(coerce_policy(policy(extra)), {})


def test_check_names_what_the_tier_cannot_do():
    b = ProcessBackend()
    check = b.check(_plan())
    assert check.tier == "process" and not check.refused   # the defaults only: none refused
    missing = {type(g.op).__name__: g.reason for g in check.gaps}
    assert "PID" in missing.pop("Namespaces")
    if ROOT:
        assert missing == {}  # cgroups and a tmpfs are usable as root here
    b.abi = 0
    with pytest.raises(BackendUnavailable) as e:
        b.check(_plan())
    assert "Landlock" in e.value.message and e.value.field == "isolation"


def test_explain_describes_the_process_tier():
    r = subprocess.run([CORRAL, "explain", "--json", "--isolation", "process"],
                       capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    d = json.loads(r.stdout)
    assert d["tier"] == "process" and d["own_kernel"] is False
    assert d["properties"]["pid_isolation"] is False
    assert d["properties"]["network_namespace"] is False
    assert d["properties"]["host_fs_hidden"] is True
    rules = {x["rule"]: x for x in d["rules"]}
    assert rules["isolation"]["enforced_by"] == "none"
    assert "Landlock" in rules["filesystem (root)"]["note"]


# -- without root ---------------------------------------------------------------------------------

NOBODY_SCRIPT = r"""
import errno, json, os, sys
import corral
victim, outside = int(sys.argv[1]), sys.argv[2]
r = corral.run(["/bin/sh", "-c", f'''
    id -u
    kill -0 {victim} 2>/dev/null && echo SIGNAL-REACHED || echo signal-refused
    cat /proc/{victim}/environ >/dev/null 2>&1 && echo ENVIRON-READ || echo environ-refused
    touch {outside}/nobody-wrote 2>/dev/null && echo WROTE || echo write-refused
    ls /root /home >/dev/null 2>&1 && echo LISTED || echo list-refused
    echo data > "$HOME/f" && cat "$HOME/f"
    env | grep -c SECRET || true
    '''], {"isolation": "process"})
d = r.to_dict()
if "signal-refused" in r.stdout and "write-refused" in r.stdout:
    # contained (Landlock scopes signals to the sandbox): now the dangerous part
    k = corral.run(["/bin/sh", "-c", "sleep 30 & kill -9 -1; wait $!; echo bg=$?"],
                   {"isolation": "process"})
    d["kill_all"] = k.stdout
try:
    corral.run(["true"], {"isolation": "process", "limits": {"memory": "1G"}})
    d["explicit_memory"] = "ran"
except corral.errors.UnsupportedRule as e:
    d["explicit_memory"] = e.field
print(json.dumps(d))
"""


@needs_root
def test_without_root_it_works_and_reports_unenforced_defaults(outside_dir):
    if landlock.abi() < 6:
        pytest.skip("same-uid signal scoping needs Landlock ABI 6")
    venv_python = os.path.join(os.path.dirname(CORRAL), "python3")
    victim = subprocess.Popen(["sleep", "60"], user=NOBODY, group=NOBODY, extra_groups=[],
                              env={"SECRET_TOKEN": "hunter2"})
    try:
        p = subprocess.run([venv_python, "-I", "-c", NOBODY_SCRIPT, str(victim.pid),
                            outside_dir], capture_output=True, text=True, check=False, timeout=60,
                           user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                           env={"PATH": "/usr/bin:/bin", "SECRET_TOKEN": "hunter2"})
        assert p.returncode == 0, p.stderr[-3000:]
        d = json.loads(p.stdout)
        assert victim.poll() is None, "a process of the same uid outside the sandbox died"
    finally:
        victim.kill()
        victim.wait()
    assert d["verdict"] == "ok" and d["isolation"] == "process", d
    assert d["stdout"].split() == [str(NOBODY), "signal-refused", "environ-refused",
                                   "write-refused", "list-refused", "data", "0"], d
    assert d["kill_all"] == "bg=137\n"
    assert not os.path.exists(os.path.join(outside_dir, "nobody-wrote"))
    unenforced = {e["rule"] for e in d["events"] if e["kind"] == "unenforced"}
    assert {"Namespaces", "limits.scratch", "limits.memory", "limits.pids",
            "limits.cpus"} <= unenforced
    assert all(e["tier"] == "process" and e["reason"] for e in d["events"]
               if e["kind"] == "unenforced")
    assert d["explicit_memory"] == "limits.memory"


@needs_root
def test_without_root_explicit_limits_are_refused_with_exit_3():
    r = subprocess.run([CORRAL, "run", "--json", "--isolation", "process", "--memory", "1G",
                        "--", "/bin/sh", "-c", "echo ran"], capture_output=True, text=True, check=False,
                       timeout=60, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 3 and "ran" not in r.stdout
    err = json.loads(r.stdout)["error"]
    assert err["field"] == "limits.memory" and err["kind"] == "unsupported"


def test_the_namespace_tiers_syscall_errnos_hold_here_too():
    """tests/fixtures/syscall_probe.py in the process tier: each call the seccomp profile
    refuses gets its errno (the ioctl cases need a terminal, which Landlock leaves out of
    reach)."""
    from linux.test_seccomp import ALLOWED, DENIED, PROBE  # tests/linux/test_seccomp.py

    # the probe's source on stdin: a bind of tests/ would be refused for a checkout under
    # /tmp (a path corral builds itself)
    r = corral.run(["/bin/sh", "-c", f'mkdir "$HOME/w" && exec {PY} - "$HOME/w"'],
                   policy({}), stdin=PROBE.read_bytes())
    assert r.exit_code == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    no_tty = {c for c in [*DENIED, *ALLOWED] if c.startswith("ioctl_") and c not in got}
    assert len(got) > 50 and len(no_tty) <= 4
    assert {c: (got.get(c), want) for c, want in DENIED.items()
            if got.get(c) != want and c not in no_tty} == {}
    assert [c for c in ALLOWED if got.get(c) != 0 and c not in no_tty] == []


CAPLESS_SCRIPT = r"""
import json, corral
out = {}
try:
    r = corral.run(["/bin/sh", "-c", "id -u; touch /var/tmp/corral-capless 2>&1; true"],
                   {"isolation": "process"})
    out["run"] = [r.verdict, r.stdout.split()[0], "Permission denied" in r.stdout,
                  sorted(e["rule"] for e in r.events if e["kind"] == "unenforced")]
except corral.errors.CorralError as e:
    out["run"] = [type(e).__name__, e.field]
try:
    corral.run(["true"], {"isolation": "process", "limits": {"scratch": "10M"}})
except corral.errors.CorralError as e:
    out["scratch"] = [type(e).__name__, e.field]
print(json.dumps(out))
"""


@needs_root
@pytest.mark.parametrize("drop,want", [
    ("sys_admin", {"run": ["ok", None, True, ["Namespaces", "limits.scratch"]],
                   "scratch": ["UnsupportedRule", "limits.scratch"]}),
    ("setuid", {"run": ["BackendUnavailable", "isolation"],
                "scratch": ["BackendUnavailable", "isolation"]}),
])
def test_root_in_a_container_without_some_capabilities(contained, drop, want):
    """Root without CAP_SYS_ADMIN (a container's usual root) runs with an uncapped
    scratch; root without CAP_SETUID would run the command as root, so it is refused."""
    python = os.path.join(os.path.dirname(CORRAL), "python3")
    p = subprocess.run(["setpriv", "--bounding-set", f"-{drop}", "--inh-caps", f"-{drop}",
                        python, "-I", "-c", CAPLESS_SCRIPT], capture_output=True, text=True, check=False,
                       timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)
    if drop == "sys_admin":
        assert int(got["run"][1]) >= 1_000_000_000  # still its own unprivileged uid
        got["run"][1] = None
    assert got == want
    assert not os.path.exists("/var/tmp/corral-capless")
