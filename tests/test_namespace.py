"""What is particular to the namespace tier (bubblewrap), tested with real sandboxes: the
view of the host, sysctls, capabilities, set-id bits on an rw workspace, signal state.
The containment every tier shares (limits, network, env, workspace, teardown) is tested
once for all tiers in test_tiers.py."""

import json
import os
import textwrap

import pytest

import corral

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
        assert not (st.st_mode & 0o170000) in (0o020000, 0o060000), name
    assert not [m for m in mountinfo() if str(ws) in m]


def test_signal_dispositions_are_the_defaults():
    r = sh("grep -E 'SigIgn|SigBlk' /proc/self/status; yes | head -1")
    assert "SigIgn:\t0000000000000000" in r.stdout and "SigBlk:\t0000000000000000" in r.stdout
    assert r.stdout.rstrip().endswith("y") and "Broken pipe" not in r.stderr
    r = sh("exec dd if=/dev/zero of=/scratch/big bs=8192 count=1", {"limits": {"file_size": 4096}})
    assert r.signal == 25  # SIGXFSZ, not a quiet EFBIG
