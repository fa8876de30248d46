"""The workspace and ro_binds as host paths (issue 13, items 2, 8 and 14).

- a symbolic link at any component of the path is refused, at policy load and again when
  the sandbox is built (the path is opened without following links and that fd mounted),
  so a link an earlier read-write run planted (`sub -> /etc`) never becomes a workspace;
- system trees (/, /etc, /usr, ...) are refused whole;
- a host path below /tmp is bindable (mounted on the sandbox's own /tmp tmpfs); binds
  that would replace /tmp, /proc, /dev, /scratch, /etc themselves are refused;
- workspace.mount_at = "same" mounts the workspace at its host path (a host venv runs),
  and a missing #! interpreter is reported as exactly that.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import ALL_TIERS, CORRAL, PY, ROOT, tier_unavailable

import corral
from corral.errors import PolicyError, SandboxSetupError
from corral.policy import load_policy, policy_from_dict

SECRET = "root-only 5e1f0c"
#: the trees issue 13 names: never a workspace or a bind whole
SYSTEM_TREES = ("/", "/etc", "/usr", "/var", "/boot", "/root", "/proc", "/sys", "/dev", "/run")


@pytest.fixture(params=ALL_TIERS)
def tier(request):
    why = tier_unavailable(request.param)
    if why:
        pytest.skip(f"the {request.param} tier is not available here: {why}")
    return request.param


@pytest.fixture
def base():
    d = tempfile.mkdtemp(prefix="corral-wsp-", dir="/var/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


@pytest.fixture
def private(base):
    """A root-only (0700) directory with a secret in it."""
    d = os.path.join(base, "private")
    os.mkdir(d, 0o700)
    with open(os.path.join(d, "secret"), "w") as f:
        f.write(SECRET)
    os.chmod(os.path.join(d, "secret"), 0o600)
    return d


def _dir(path, files=None, mode=0o755):
    os.mkdir(path)
    os.chmod(path, mode)
    for name, text in (files or {}).items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(path, name), 0o644)
    return path


def _run_cli(*args):
    return subprocess.run([CORRAL, "run", *args], capture_output=True, text=True, timeout=120)


def _can_rw(tier):
    return tier_unavailable(tier, {"isolation": tier, "filesystem": {
        "workspace": {"path": "/var/tmp", "mode": "rw"}}}) is None


# -- item 2: links and system trees ---------------------------------------------------------

def test_a_link_a_rw_run_planted_is_refused_as_the_next_workspace(tier, base, private):
    """A rw run plants `sub -> /etc` and `priv -> a root-only dir` in its workspace; the
    next run with --workspace DIR/sub (or DIR/priv) is refused with one clear line and
    reads nothing (the old code mounted /etc with its owner as the sandbox's root)."""
    ws = _dir(os.path.join(base, "ws"), mode=0o777)
    planter = tier if _can_rw(tier) else "namespace"   # root's process tier refuses rw
    if tier_unavailable(planter):
        pytest.skip("no tier here runs a rw workspace to plant the links")
    r = _run_cli("--isolation", planter, "--workspace", f"{ws}:rw", "--", "/bin/sh", "-c",
                 f"ln -s /etc sub && ln -s {private} priv && echo planted")
    assert r.returncode == 0 and r.stdout == "planted\n", r
    assert os.readlink(os.path.join(ws, "sub")) == "/etc"
    for link, cmd in (("sub", "cat shadow; cat /workspace/shadow"), ("priv", "cat secret")):
        for mode in ("ro", "rw", "ro:same"):
            r = _run_cli("--isolation", tier, "--workspace", f"{ws}/{link}:{mode}", "--",
                         "/bin/sh", "-c", cmd)
            assert r.returncode == 2, r
            assert "root:" not in r.stdout and SECRET not in r.stdout, r
            lines = [ln for ln in r.stderr.splitlines() if "unenforced" not in ln]
            assert lines == [f"corral: filesystem.workspace.path: '{ws}/{link}' has a symbolic "
                             f"link in it ({ws}/{link} -> {os.readlink(os.path.join(ws, link))}"
                             "), and corral follows none; name the real path"], r.stderr
    with pytest.raises(PolicyError) as e:
        corral.run(["cat", "/workspace/shadow"],
                   {"isolation": tier, "filesystem": {"workspace": {"path": f"{ws}/sub"}}})
    assert e.value.field == "filesystem.workspace.path"


def test_a_link_at_any_component_is_refused(base):
    real = _dir(os.path.join(base, "real"))
    _dir(os.path.join(real, "proj"))
    os.symlink(real, os.path.join(base, "lnk"))
    os.symlink("real/proj", os.path.join(base, "rel"))
    for path, link in ((f"{base}/lnk/proj", f"{base}/lnk"), (f"{base}/lnk", f"{base}/lnk"),
                       (f"{base}/rel", f"{base}/rel"), (f"{base}/lnk/proj/", f"{base}/lnk")):
        for data, field in (({"workspace": {"path": path}}, "filesystem.workspace.path"),
                            ({"workspace": {"path": path, "mount_at": "same"}},
                             "filesystem.workspace.path"),
                            ({"ro_binds": [path]}, "filesystem.ro_binds[0]")):
            with pytest.raises(PolicyError) as e:
                policy_from_dict({"filesystem": data})
            assert e.value.field == field
            assert f"has a symbolic link in it ({link} -> " in e.value.message, e.value
    # the same paths without the link are fine
    policy_from_dict({"filesystem": {"workspace": {"path": f"{real}/proj"},
                                     "ro_binds": [real]}})


def test_a_path_swapped_for_a_link_after_the_check_is_refused(tier, base, private):
    """The policy is checked with a real directory; before the sandbox is built it becomes
    a link to a root-only directory. Building the sandbox opens the path without following
    links, so it refuses (the old code mounted the link's target)."""
    for key in ("workspace", "ro_binds"):
        path = _dir(os.path.join(base, key), {"marker": "original"})
        fs = {"workspace": {"path": path}} if key == "workspace" else {"ro_binds": [path]}
        sb = corral.Sandbox({"isolation": tier, "filesystem": fs})   # planned and checked
        os.rename(path, path + ".old")
        os.symlink(private, path)
        with pytest.raises(SandboxSetupError) as e:
            with sb:
                r = sb.exec(["/bin/sh", "-c", f"cat {path}/secret secret"])
                pytest.fail(f"the sandbox was built through the link: {r}")
        rule = "filesystem.workspace" if key == "workspace" else "filesystem.ro_binds"
        assert e.value.field == rule and e.value.step == "open-host-path"
        assert f"{path} has a symbolic link in it now" in e.value.message, e.value


def test_a_path_swapped_while_the_sandbox_is_open_changes_nothing_inside(tier, base, private):
    """Swapped after the sandbox was built: the next exec still has what was opened (the
    process tier, which has no mounts, reaches nothing through the new link)."""
    ws = _dir(os.path.join(base, "ws"), {"marker": "original ws"})
    rb = _dir(os.path.join(base, "rb"), {"marker": "original rb"})
    other = _dir(os.path.join(base, "other"), {"marker": "other", "secret": SECRET})
    with corral.Sandbox({"isolation": tier, "filesystem": {
            "workspace": {"path": ws}, "ro_binds": [rb]}}) as sb:
        first = sb.exec(["/bin/sh", "-c", f"cat marker; echo; cat {rb}/marker"])
        assert first.stdout == "original ws\noriginal rb", first
        for p in (ws, rb):
            os.rename(p, p + ".old")
            os.symlink(other, p)
        r = sb.exec(["/bin/sh", "-c", f"cat marker; echo; cat {rb}/marker {rb}/secret"])
    assert r.stdout.startswith("original ws\n"), r      # the cwd is the workspace opened
    assert "other" not in r.stdout and SECRET not in r.stdout, r
    if tier != "process":
        assert r.stdout == "original ws\noriginal rb", r


@pytest.mark.parametrize("tree", [t for t in SYSTEM_TREES if os.path.isdir(t)])
def test_system_trees_are_never_a_workspace_or_a_bind(tree):
    with pytest.raises(PolicyError) as e:
        policy_from_dict({"filesystem": {"workspace": {"path": tree}}})
    assert e.value.field == "filesystem.workspace.path"
    assert "system tree" in e.value.message, e.value
    with pytest.raises(PolicyError) as e:
        policy_from_dict({"filesystem": {"ro_binds": ["/usr/share", tree]}})
    assert e.value.field == "filesystem.ro_binds[1]"
    assert "system tree" in e.value.message or "would replace the sandbox's own" in \
        e.value.message, e.value


def test_directories_inside_system_trees_still_work():
    p = policy_from_dict({"filesystem": {"workspace": {"path": "/usr/share"},
                                         "ro_binds": ["/usr/share/doc", "/var/tmp"]}})
    assert p.filesystem.workspace.path == "/usr/share"
    r = corral.run(["/bin/sh", "-c", "test -d /usr/share/doc && pwd"],
                   {"filesystem": {"workspace": {"path": "/usr/share"}, "ro_binds": ["/var/tmp"]}})
    assert r.stdout == "/workspace\n", r


# -- item 8: binds below /tmp -------------------------------------------------------------

def test_a_ro_bind_below_tmp_works_and_tmp_stays_the_sandboxs_own(tier):
    d = tempfile.mkdtemp()          # under /tmp, like a CI checkout or a mktemp dir
    try:
        os.chmod(d, 0o755)
        _dir(os.path.join(d, "sub"), {"f": "from the host's tmp"})
        inner = os.path.join(d, "sub")
        pol = {"isolation": tier, "filesystem": {"ro_binds": [inner]}}
        with corral.Sandbox(pol) as sb:
            r = sb.exec(["/bin/sh", "-c", f"cat {inner}/f; echo; echo x > {inner}/new; "
                                          f"echo rc=$?"])
            assert r.stdout.startswith("from the host's tmp\n") and "rc=0" not in r.stdout, r
            assert os.listdir(inner) == ["f"]
            if tier != "process":   # the process tier has no /tmp of its own to write
                w = sb.exec(["/bin/sh", "-c", f"echo kept > /tmp/other && {PY} -c 'import os; "
                                              "print(*sorted(os.listdir(\"/tmp\")), "
                                              "oct(os.stat(\"/tmp\").st_mode & 0o7777))'"])
                assert w.exit_code == 0, w
                assert w.stdout.split() == sorted([os.path.basename(d), "other"]) + ["0o1777"], w
                again = sb.exec(["/bin/sh", "-c", f"cat /tmp/other {inner}/f"])
                assert again.stdout == "kept\nfrom the host's tmp", again
                assert not os.path.exists(os.path.join(d, "other"))
    finally:
        shutil.rmtree(d)


def test_a_workspace_below_tmp_works(tier):
    d = tempfile.mkdtemp()
    try:
        os.chmod(d, 0o755)
        with open(os.path.join(d, "main.py"), "w") as f:
            f.write("print('hi from /tmp')\n")
        os.chmod(os.path.join(d, "main.py"), 0o644)
        for at in ("/workspace", "same"):
            r = corral.run(["/bin/sh", "-c", f"pwd; {PY} main.py"], {
                "isolation": tier, "filesystem": {"workspace": {"path": d, "mount_at": at}}})
            want = d if at == "same" or tier == "process" else "/workspace"
            assert r.stdout == f"{want}\nhi from /tmp\n", r
    finally:
        shutil.rmtree(d)


@pytest.mark.parametrize("path", ["/tmp", "/proc", "/dev", "/scratch", "/etc", "/sys",
                                  "/workspace", "/tmp/", "/etc/ssl", "/proc/self", "/dev/shm"])
def test_binds_that_replace_what_corral_builds_are_refused(path):
    with pytest.raises(PolicyError) as e:
        policy_from_dict({"filesystem": {"ro_binds": [path]}})
    assert e.value.field == "filesystem.ro_binds[0]"
    norm = os.path.normpath(path)
    if norm.count("/") == 1:
        assert f"would replace the sandbox's own {norm}" in e.value.message, e.value
    else:
        assert "lies inside" in e.value.message, e.value
    if os.path.isdir(norm) and norm not in SYSTEM_TREES:   # /tmp as a workspace at itself
        with pytest.raises(PolicyError) as e:
            policy_from_dict({"filesystem": {"workspace": {"path": norm, "mount_at": "same"}}})
        assert e.value.field == "filesystem.workspace.path"


def test_the_demo_runs_from_a_fresh_clone_under_tmp(tmp_path):
    """The README's first command from a clone under /tmp: examples/ is ro-bound there.
    The clone's demo uses this checkout's corral (it has no .venv of its own)."""
    assert str(tmp_path).startswith("/tmp/")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", ROOT, str(clone)], check=True, timeout=120)
    r = subprocess.run([sys.executable, str(clone / "examples" / "demo.py"), "--corral", CORRAL],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "every attempt contained." in r.stdout and "Traceback" not in r.stderr
    # a run corral refuses (here: the clone reached through a symbolic link, so the ro-bind
    # of examples/ is refused) ends the demo with corral's own error, not a traceback
    os.symlink(clone, tmp_path / "link")
    r = subprocess.run([sys.executable, str(tmp_path / "link" / "examples" / "demo.py"),
                        "--corral", CORRAL], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r
    assert r.stdout.splitlines()[-1] == (
        f"demo: a corral run failed: corral: filesystem.ro_binds[0]: "
        f"'{tmp_path}/link/examples' has a symbolic link in it ({tmp_path}/link -> {clone}), "
        f"and corral follows none; name the real path"), r.stdout


# -- item 14: mount_at = "same", and a missing #! interpreter --------------------------------

@pytest.fixture
def venv_project(base):
    """A project with a venv made on the host: bin/hello's #! names the venv's python by
    its host path."""
    proj = os.path.join(base, "proj")
    os.mkdir(proj)
    os.chmod(proj, 0o777)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", f"{proj}/.venv"],
                   check=True, timeout=120)
    hello = f"{proj}/.venv/bin/hello"
    with open(hello, "w") as f:
        f.write(f"#!{proj}/.venv/bin/python\nimport os, sys\nprint(sys.prefix, os.getcwd())\n")
    os.chmod(hello, 0o755)
    for dirpath, dirnames, filenames in os.walk(proj):
        for n in dirnames:
            os.chmod(os.path.join(dirpath, n), 0o755)
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)
    os.chmod(proj, 0o777)
    return proj


def test_a_host_venv_runs_with_mount_at_same(tier, venv_project):
    proj = venv_project
    r = _run_cli("--isolation", tier, "--workspace", f"{proj}:same", "--", ".venv/bin/hello")
    assert r.returncode == 0 and r.stdout == f"{proj}/.venv {proj}\n", r
    r = corral.run([f"{proj}/.venv/bin/hello"], {"isolation": tier, "filesystem": {
        "workspace": {"path": proj, "mount_at": "same"}}})
    assert r.verdict == "ok" and r.stdout == f"{proj}/.venv {proj}\n", r
    if _can_rw(tier):   # a rw workspace at its host path: writes land in the project
        r = corral.run(["/bin/sh", "-c", "echo made > out.txt && pwd"], {
            "isolation": tier, "filesystem": {"workspace": {
                "path": proj, "mode": "rw", "mount_at": "same"}}})
        assert r.stdout == f"{proj}\n", r
        with open(os.path.join(proj, "out.txt")) as f:
            assert f.read() == "made\n"


def test_a_ro_bind_inside_a_same_workspace_stays_read_only(tier, venv_project):
    """Mounts go outer first: a ro_bind inside a rw workspace at its host path is not
    covered by the workspace (and a workspace inside a ro_bind stays visible)."""
    if not _can_rw(tier):
        pytest.skip(f"{tier} refuses a rw workspace here")
    proj = venv_project
    sub = _dir(os.path.join(proj, "frozen"), {"f": "frozen"}, mode=0o777)
    r = corral.run(["/bin/sh", "-c", "echo x > frozen/new; echo x > new; cat frozen/f"], {
        "isolation": tier, "filesystem": {"ro_binds": [sub], "workspace": {
            "path": proj, "mode": "rw", "mount_at": "same"}}})
    assert r.stdout == "frozen", r
    assert sorted(os.listdir(sub)) == ["f"] and os.path.exists(os.path.join(proj, "new"))
    r = corral.run(["/bin/sh", "-c", "pwd; cat f"], {
        "isolation": tier, "filesystem": {"ro_binds": [os.path.dirname(proj)], "workspace": {
            "path": sub, "mount_at": "same"}}})
    assert r.stdout == f"{sub}\nfrozen", r


def test_a_missing_shebang_interpreter_is_named(tier, venv_project):
    """Without mount_at = "same" the venv's python is not where its #! says: the error
    says exactly that (was: bwrap's `execvp ...: No such file or directory`)."""
    proj = venv_project
    with open(os.path.join(proj, "crlf.py"), "w") as f:
        f.write("#!/usr/bin/python3\r\nprint('x')\r\n")    # saved with CRLF endings
    os.chmod(os.path.join(proj, "crlf.py"), 0o755)
    if tier == "process":   # a workspace is always at its host path there: use a dead link
        os.unlink(f"{proj}/.venv/bin/python")
        os.symlink("/nonexistent/python3", f"{proj}/.venv/bin/python")
    cases = [(".venv/bin/hello", f"{proj}/.venv/bin/python"), ("./crlf.py", "/usr/bin/python3\\r")]
    for cmd, interp in cases:
        r = _run_cli("--isolation", tier, "--workspace", proj, "--", cmd)
        want = f"corral: {cmd}: its interpreter {interp} is missing inside the sandbox"
        assert r.returncode == 127 and want in r.stderr.splitlines(), r
        res = corral.run([cmd], {"isolation": tier, "filesystem": {"workspace": {"path": proj}}})
        assert res.verdict == "error" and res.exit_code == 127, res
        assert res.stderr.splitlines()[-1] == want, res
    # a command that does not exist at all is not blamed on an interpreter
    r = _run_cli("--isolation", tier, "--workspace", proj, "--", "./nonexistent")
    assert r.returncode != 0 and "interpreter" not in r.stderr, r


def test_mount_at_on_the_command_line_and_in_policy_show(base):
    d = _dir(os.path.join(base, "p"))
    r = subprocess.run([CORRAL, "policy", "show", "--workspace", f"{d}:rw:same"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    assert f'workspace = {{ path = "{d}", mode = "rw", mount_at = "same" }}' in r.stdout
    r2 = subprocess.run([CORRAL, "policy", "show", "--workspace", f"{d}:same"],
                        capture_output=True, text=True, timeout=60)
    assert f'workspace = {{ path = "{d}", mode = "ro", mount_at = "same" }}' in r2.stdout
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:   # it reads back
        f.write(r.stdout)
        f.flush()
        p = load_policy(f.name)
    assert p.filesystem.workspace.mount_at == "same" and p.filesystem.workspace.mode == "rw"
    with pytest.raises(PolicyError) as e:
        policy_from_dict({"filesystem": {"workspace": {"path": d, "mount_at": "/elsewhere"}}})
    assert e.value.field == "filesystem.workspace.mount_at"
    with pytest.raises(PolicyError) as e:
        policy_from_dict({"filesystem": {"workspace": {"path": d, "mount_at": "same"},
                                         "ro_binds": [d]}})
    assert e.value.field == "filesystem.ro_binds[0]"
