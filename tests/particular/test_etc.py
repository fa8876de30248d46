"""The sandbox's shared /etc tree (backends/host/etc.py), on a real tmpfs with real bind mounts:
copies that follow their sources, symlinks into /usr, directories bound once read-only,
and what must stay out."""

import os

import pytest

import corral
from corral.backends.host import etc
from corral.backends.host.etc import FILES, ensure_etc
from corral.linux import _sys

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="binds and a tmpfs need root")


def read(path) -> str:
    with open(path) as f:
        return f.read()


@pytest.fixture(autouse=True)
def no_recheck_delay(monkeypatch):
    """Every call checks its sources (corral waits up to RECHECK_S between checks)."""
    monkeypatch.setattr(etc, "RECHECK_S", 0.0)


@pytest.fixture
def host(tmp_path):
    """A fake host /etc (src) and a tmpfs base for the tree, unmounted afterwards."""
    src, base = tmp_path / "etc", tmp_path / "base"
    src.mkdir()
    base.mkdir()
    _sys.mount("tmpfs", str(base), "tmpfs", 0, "mode=0711,size=16m")
    (src / "services").write_text("ssh 22/tcp\n")
    (src / "secret").write_text("root only\n")
    os.chmod(src / "secret", 0o600)
    (src / "ssl").mkdir()
    (src / "ssl" / "cert.pem").write_text("CERT\n")
    os.symlink("/usr/share/zoneinfo/Etc/UTC", src / "localtime")
    sources = tuple(str(src / n) for n in ("services", "secret", "ssl", "localtime", "gone"))
    yield src, base, sources
    for line in reversed(read("/proc/self/mountinfo").splitlines()):
        mp = line.split()[4]
        if mp.startswith(str(base)):
            _sys.umount(mp)


def test_the_tree_copies_links_and_binds_what_it_should(host):
    src, base, sources = host
    path, binds = ensure_etc(str(base), prebind=True, sources=sources, root=str(src))
    assert binds == ()                                # all bound in the tree already
    assert read(os.path.join(path, "services")) == "ssh 22/tcp\n"
    assert not os.path.lexists(os.path.join(path, "secret"))    # not world-readable: out
    assert not os.path.lexists(os.path.join(path, "gone"))
    if os.path.exists("/usr/share/zoneinfo/Etc/UTC"):
        assert os.readlink(os.path.join(path, "localtime")) == "/usr/share/zoneinfo/Etc/UTC"
    ssl = os.path.join(path, "ssl")
    assert os.path.ismount(ssl) and os.listdir(ssl) == ["cert.pem"]
    with pytest.raises(OSError):                      # bound read-only
        open(os.path.join(ssl, "new"), "w")
    for name, text in FILES.items():
        assert read(os.path.join(path, name)) == text
    # without prebind, the same tree, and the directories are the sandbox's to bind
    assert ensure_etc(str(base), prebind=False, sources=sources, root=str(src)) == \
        (path, (str(src / "ssl"),))


def test_a_changed_source_reaches_the_next_sandbox(host):
    src, base, sources = host
    path, _ = ensure_etc(str(base), prebind=True, sources=sources, root=str(src))
    tmp = src / "services.new"                        # as a package update writes it
    tmp.write_text("ssh 22/tcp\nhttp 80/tcp\n")
    os.rename(tmp, src / "services")
    assert ensure_etc(str(base), prebind=True, sources=sources, root=str(src))[0] == path
    assert read(os.path.join(path, "services")) == "ssh 22/tcp\nhttp 80/tcp\n"
    (src / "ssl" / "new.pem").write_text("NEW\n")     # a directory is a live view
    assert sorted(os.listdir(os.path.join(path, "ssl"))) == ["cert.pem", "new.pem"]
    os.chmod(src / "secret", 0o644)                   # a new kind of source: a new tree
    other, _ = ensure_etc(str(base), prebind=True, sources=sources, root=str(src))
    assert other != path and read(os.path.join(other, "secret")) == "root only\n"


def test_a_sandbox_sees_the_hosts_etc_files_read_only():
    r = corral.run(["/bin/sh", "-c", "cat /etc/services | head -c 200 >/dev/null && "
                    "ls /etc/ssl/certs | head -1 && readlink -f /etc/localtime; "
                    "touch /etc/services /etc/ssl/x 2>&1; "
                    "cut -d' ' -f5 /proc/self/mountinfo | grep '^/etc/'"])
    assert r.verdict == "ok", r
    assert r.stdout.count("cannot touch") == 2     # read-only, or not ours to touch
    assert read("/etc/services")                    # the control: it is there on the host
    etc_mounts = [line for line in r.stdout.splitlines() if line.startswith("/etc/")]
    # files are copies, not one bind each (bwrap re-reads mountinfo per bind)
    assert "/etc/services" not in etc_mounts and "/etc/ld.so.cache" not in etc_mounts
    assert "/etc/ssl" in etc_mounts


@pytest.mark.parametrize("p, root", [
    ("/etc/ssl", "/etc"), ("/etc/ssl", "/etc/"), ("/etc/a/b", "/etc"), ("/etc/ssl/", "/etc"),
    ("/etc//ssl", "/etc"), ("/etc/./ssl", "/etc"), ("/etc/../usr", "/etc"), ("/etcx/y", "/etc"),
    ("/etc/ssl", "/"), ("/usr/lib", "/etc"), ("etc/ssl", "etc"), ("etc/ssl", "/etc"),
])
def test_below_is_relpath(p, root):
    # _below(): os.path.relpath's answer, its abspath()s skipped only for a plain name below
    assert etc._below(p, root) == os.path.relpath(p, root)


def test_system_binds_say_what_islink_and_isdir_said():
    want = []
    from corral.plan import SYSTEM_PATHS

    for p in SYSTEM_PATHS:
        if os.path.islink(p):
            want += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            want += ["--ro-bind", p, p]
    etc._system = None
    assert etc.system_binds() == want
