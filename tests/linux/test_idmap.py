"""Idmapped workspace mounts on the real kernel, as root; uid X is a dedicated sandbox uid.

Each test builds a fresh tree under /tmp (searchable by X, mode 0711):
    base/src   the workspace, owned by O:G (root 0700, or 1000:1000 0700)
    base/dst   the run dir's mount point, where idmapped_bind puts the mount
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest

from corral.errors import SandboxSetupError
from corral.linux import idmap

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="idmapped mounts need root")

X = 2_000_000_000 + os.getpid() % 1_000_000   # the sandbox's host uid (and gid)
Y = X + 1                                      # some other unprivileged host user
O = G = 1000                                   # a user-owned workspace
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SRC_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(idmap.__file__))))


def as_uid(uid: int, code: str, **kw) -> subprocess.CompletedProcess:
    """Run Python code as uid:uid with no supplementary groups."""
    return subprocess.run([PY, "-I", "-S", "-c", code], check=False, user=uid, group=uid,
                          extra_groups=[], capture_output=True, text=True, timeout=20, **kw)


def errno_of(uid: int, code: str) -> str:
    """Run code as uid; print 'ok' or the errno name of the OSError it raises."""
    wrapped = ("import errno, os\ntry:\n" + "".join(f"    {ln}\n" for ln in code.splitlines())
               + "    print('ok')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])")
    r = as_uid(uid, wrapped)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def mounts_of(base: str) -> list[str]:
    """The mounts whose mount point, or whose root in its filesystem, is in the test's
    own tree `base` (a mkdtemp name no one else uses): what a bind of it could leave.
    Not every mount of the host: other processes (sandboxes of other suites) mount and
    unmount meanwhile."""
    name = os.path.basename(base)
    with open("/proc/self/mountinfo") as f:
        return [ln for ln in f if any(name in p.split("/") for p in ln.split()[3:5])]


def mountinfo(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln for ln in f if ln.split()[4] == path]


@dataclass
class Tree:
    base: str
    src: str
    dst: str

    def file(self, name: str, data: str, mode: int, owner: tuple[int, int]) -> str:
        path = os.path.join(self.src, name)
        with open(path, "w") as f:
            f.write(data)
        os.chown(path, *owner)
        os.chmod(path, mode)
        return path


def make_tree(owner: tuple[int, int]) -> Tree:
    base = tempfile.mkdtemp(prefix="corral-idmap-", dir="/tmp")
    os.chmod(base, 0o711)
    t = Tree(base, os.path.join(base, "src"), os.path.join(base, "dst"))
    os.mkdir(t.src, 0o700)
    os.chown(t.src, *owner)
    os.mkdir(t.dst, 0o755)
    return t


@pytest.fixture
def trees():
    made: list[Tree] = []

    def make(owner: tuple[int, int]) -> Tree:
        made.append(make_tree(owner))
        return made[-1]

    yield make
    for t in made:
        idmap.unmount(t.dst)  # before rmtree, which would otherwise delete through the mount
        assert not mountinfo(t.dst)
        shutil.rmtree(t.base)


@pytest.fixture
def root_ro(trees) -> Tree:
    """A root-owned 0700 workspace with a 0600 secret, mounted ro, root -> X."""
    t = trees((0, 0))
    t.file("secret", "hello", 0o600, (0, 0))
    idmap.idmapped_bind(t.src, t.dst, uid_map=(0, X), gid_map=(0, X), readonly=True)
    return t


@pytest.fixture
def user_rw(trees) -> Tree:
    """A 1000:1000 0700 workspace mounted rw, 1000 -> X."""
    t = trees((O, G))
    t.file("mine", "data", 0o600, (O, G))
    idmap.idmapped_bind(t.src, t.dst, uid_map=(O, X), gid_map=(G, X), readonly=False)
    return t


def test_supported_here():
    assert idmap.supported("/tmp") is True
    reason = idmap.supported("/proc")
    assert isinstance(reason, str) and "proc filesystem" in reason and "ext4" in reason
    assert "does not exist" in idmap.supported("/nonexistent/corral-idmap")


def test_ro_root_owned_workspace_readable_by_x_not_writable(root_ro):
    t = root_ro
    secret = os.path.join(t.dst, "secret")
    assert as_uid(X, f"print(open({secret!r}).read())").stdout == "hello\n"
    # Owner O=0 appears as X through the mount; on disk it is still 0:0.
    st = os.stat(secret)
    assert (st.st_uid, st.st_gid) == (X, X)
    st = os.stat(os.path.join(t.src, "secret"))
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert errno_of(X, f"open({os.path.join(t.dst, 'new')!r}, 'w')") == "EROFS"
    assert errno_of(X, f"open({secret!r}, 'a')") == "EROFS"
    assert os.listdir(t.src) == ["secret"]


def test_plain_path_is_denied_to_x(root_ro):
    """Control: without the idmapped mount, X cannot read the workspace at all."""
    assert errno_of(X, f"open({os.path.join(root_ro.src, 'secret')!r})") == "EACCES"
    assert errno_of(X, f"os.listdir({root_ro.src!r})") == "EACCES"


def test_rw_files_created_by_x_land_on_disk_as_owner(user_rw):
    t = user_rw
    code = (f"open({os.path.join(t.dst, 'new')!r}, 'w').write('x')\n"
            f"os.mkdir({os.path.join(t.dst, 'dir')!r})\n"
            f"print(open({os.path.join(t.dst, 'mine')!r}).read())")
    r = as_uid(X, "import os\n" + code)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "data\n"
    for name in ("new", "dir"):
        st = os.stat(os.path.join(t.src, name))
        assert (st.st_uid, st.st_gid) == (O, G), name
        st = os.stat(os.path.join(t.dst, name))
        assert (st.st_uid, st.st_gid) == (X, X), name


def test_other_owners_stay_unmapped(user_rw):
    """Only O:G is mapped: a root file in the workspace shows as nobody and X gets 'other'."""
    t = user_rw
    t.file("roots", "r", 0o600, (0, 0))
    st = os.stat(os.path.join(t.dst, "roots"))
    assert (st.st_uid, st.st_gid) == (65534, 65534)
    assert errno_of(X, f"open({os.path.join(t.dst, 'roots')!r})") == "EACCES"


@pytest.mark.parametrize("readonly", [True, False])
def test_mount_flags(trees, readonly):
    t = trees((O, G))
    idmap.idmapped_bind(t.src, t.dst, uid_map=(O, X), gid_map=(G, X), readonly=readonly)
    (line,) = mountinfo(t.dst)
    opts = set(line.split()[5].split(","))
    assert {"nosuid", "nodev", "idmapped", "ro" if readonly else "rw"} <= opts


def test_setuid_bit_is_stored_but_not_honoured_through_the_mount(user_rw):
    """The kernel lets X chmod u+s a file it owns through the mount, and the bit is stored on
    disk (owned by O). nosuid makes it inert through the mount; through the host's own path it
    is honoured, which is why a rw root mapping is refused without setid_blocked."""
    t = user_rw
    shutil.copy("/usr/bin/id", os.path.join(t.src, "id"))
    os.chown(os.path.join(t.src, "id"), O, G)
    assert errno_of(X, f"os.chmod({os.path.join(t.dst, 'id')!r}, 0o4755)") == "ok"
    st = os.stat(os.path.join(t.src, "id"))
    assert st.st_mode & 0o4000 and st.st_uid == O
    os.chmod(t.src, 0o711)                             # let Y reach it, both ways
    via_mount = subprocess.run([os.path.join(t.dst, "id"), "-u"], check=False, user=Y,
                               group=Y, extra_groups=[], capture_output=True, text=True)
    assert via_mount.stdout.strip() == str(Y)          # nosuid: euid stays Y
    via_host = subprocess.run([os.path.join(t.src, "id"), "-u"], check=False, user=Y,
                              group=Y, extra_groups=[], capture_output=True, text=True)
    assert via_host.stdout.strip() == str(O)           # the host path honours it


def test_mknod_device_refused(user_rw):
    dev = os.path.join(user_rw.dst, "null")
    assert errno_of(X, f"os.mknod({dev!r}, 0o20666, os.makedev(1, 3))") == "EPERM"


def test_rw_root_mapping_needs_setid_blocked(trees):
    t = trees((0, 0))
    with pytest.raises(SandboxSetupError) as ei:
        idmap.idmapped_bind(t.src, t.dst, uid_map=(0, X), gid_map=(0, X), readonly=False)
    assert "setuid-root" in ei.value.message and ei.value.step == "workspace-idmap"
    assert not mountinfo(t.dst)
    idmap.idmapped_bind(t.src, t.dst, uid_map=(0, X), gid_map=(0, X), readonly=False,
                        setid_blocked=True)
    assert errno_of(X, f"open({os.path.join(t.dst, 'new')!r}, 'w')") == "ok"
    assert os.stat(os.path.join(t.src, "new")).st_uid == 0


def test_unmount_leaves_dst_empty_and_is_idempotent(root_ro):
    assert os.listdir(root_ro.dst) == ["secret"]
    idmap.unmount(root_ro.dst)
    assert os.listdir(root_ro.dst) == []
    assert not mountinfo(root_ro.dst)
    idmap.unmount(root_ro.dst)
    idmap.unmount(os.path.join(root_ro.base, "gone"))
    assert os.listdir(root_ro.src) == ["secret"]


def test_owner_must_match_the_tree_opened(trees):
    """The caller stats src, then binds it: a path swapped in between is refused."""
    t = trees((O, G))
    with pytest.raises(SandboxSetupError) as ei:
        idmap.idmapped_bind(t.src, t.dst, uid_map=(O + 1, X), gid_map=(G, X), readonly=True)
    assert ei.value.errno == errno.ESTALE and f"owned by {O}:{G}" in ei.value.message
    assert not mountinfo(t.dst)
    idmap.idmapped_bind(t.src, t.dst, uid_map=(O + 1, X), gid_map=(G, X), readonly=True,
                        check_owner=False)
    assert os.stat(t.dst).st_uid == 65534  # O is not mapped: only O+1 is


@pytest.mark.parametrize("case", ["missing-src", "proc-src", "missing-dst", "bad-map"])
def test_errors_are_one_line_and_leave_nothing_mounted(trees, case):
    t = trees((O, G))
    src, dst, umap, gmap = t.src, t.dst, (O, X), (G, X)
    if case == "missing-src":
        src = os.path.join(t.base, "nope")
    elif case == "proc-src":
        src, umap, gmap = "/proc", (0, X), (0, X)
    elif case == "missing-dst":
        dst = os.path.join(t.base, "nope")
    else:
        umap = (O, -1)
    before = mounts_of(t.base)
    with pytest.raises(SandboxSetupError) as ei:
        idmap.idmapped_bind(src, dst, uid_map=umap, gid_map=gmap, readonly=True)
    e = ei.value
    assert (e.step, e.field) == ("workspace-idmap", "filesystem.workspace")
    assert "\n" not in str(e)
    assert mounts_of(t.base) == before == []
    expected = {"missing-src": (errno.ENOENT, "does not exist"),
                "proc-src": (errno.EINVAL, "move it to ext4/xfs/btrfs/tmpfs"),
                "missing-dst": (errno.ENOENT, "cannot mount the workspace"),
                "bad-map": (None, "bad id mapping")}[case]
    assert e.errno == expected[0] and expected[1] in e.message, e.message
    if case == "proc-src":
        assert f"uid {X}" in e.message and "proc filesystem" in e.message


def test_unprivileged_caller_gets_a_reason():
    code = (f"import sys; sys.path.insert(0, {SRC_DIR!r})\n"
            "from corral.linux import idmap\nfrom corral.errors import SandboxSetupError\n"
            "print(idmap.supported('/tmp'))\n"
            "try:\n    idmap.idmapped_bind('/tmp', '/tmp', uid_map=(0, 1), gid_map=(0, 1),"
            " readonly=True)\nexcept SandboxSetupError as e:\n    print(e.errno, e.message)")
    r = as_uid(X, code)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first.startswith("not root")
    assert second.startswith(f"{errno.EPERM} idmapped mounts need root")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_inside_bubblewrap(user_rw):
    """bwrap started as X maps its uid 0 to X; through the idmapped bind the workspace's
    owner O shows as 0 inside, and what the sandbox creates is stored as O:G."""
    t = user_rw
    root = [a for d in ("bin", "lib", "lib64", "sbin") if os.path.islink(f"/{d}")
            for a in ("--symlink", os.readlink(f"/{d}"), f"/{d}")]
    script = ("id -u; id -g; ls -ln /workspace; touch /workspace/new; "
              "mount -o remount,suid /workspace 2>/dev/null; echo remount=$?")
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--uid", "0", "--gid", "0",
            "--ro-bind", "/usr", "/usr", *root, "--ro-bind", "/etc", "/etc",
            "--bind", t.dst, "/workspace", "--dev", "/dev", "--proc", "/proc", "--",
            "sh", "-c", script]
    r = subprocess.run(argv, check=False, user=X, group=X, extra_groups=[], capture_output=True,
                       text=True, timeout=20, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["0", "0"]
    mine = next(ln.split() for ln in lines if ln.endswith(" mine"))
    assert mine[2:4] == ["0", "0"]                      # O:G shows as the sandbox's root
    assert lines[-1] != "remount=0"                     # nosuid is locked
    st = os.stat(os.path.join(t.src, "new"))
    assert (st.st_uid, st.st_gid) == (O, G)


def test_concurrent_binds_from_threads(trees):
    """The namespace helper child shares our memory (CLONE_VM): binds from many threads at
    once must not disturb each other, and leave no child behind."""
    from concurrent.futures import ThreadPoolExecutor

    ts = [trees((O, G)) for _ in range(8)]
    for i, t in enumerate(ts):
        t.file("n", str(i), 0o600, (O, G))

    def cycle(i: int) -> str:
        t = ts[i % len(ts)]
        idmap.idmapped_bind(t.src, t.dst, uid_map=(O, X + i), gid_map=(G, X + i),
                            readonly=True)
        try:
            st = os.stat(os.path.join(t.dst, "n"))
            assert (st.st_uid, st.st_gid) == (X + i, X + i)
            with open(os.path.join(t.dst, "n")) as f:
                return f.read()
        finally:
            idmap.unmount(t.dst)

    with ThreadPoolExecutor(len(ts)) as pool:
        for _ in range(5):
            got = list(pool.map(cycle, range(len(ts))))
            assert got == [str(i) for i in range(len(ts))]
    assert not zombie_children()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()  # mask restored


def zombie_children() -> list[int]:
    pids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += f.read().split()
        except FileNotFoundError:
            pass  # a thread that just ended
    zombies = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    zombies.append(int(pid))
        except FileNotFoundError:
            pass
    return zombies


def test_supported_keeps_its_namespace_and_checks_it_is_still_its_own():
    """The probe's user namespace is made once; if its fd number comes to name another
    file (closed and reused by code that did not own it), the next probe makes a new
    one instead of handing mount_setattr the wrong file (which would refuse a workspace
    that can be idmapped)."""
    assert idmap.supported("/tmp") is True
    fd = idmap._probe_ns[0]
    assert idmap.supported("/tmp") is True and idmap._probe_ns[0] == fd   # kept
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, fd)           # the number now names /dev/null
        assert idmap.supported("/tmp") is True
        new = idmap._probe_ns[0]
        assert new != fd
        assert os.readlink(f"/proc/self/fd/{new}").startswith("user:[")
        assert os.readlink(f"/proc/self/fd/{fd}") == os.devnull    # left alone
    finally:
        os.close(null)
        os.close(fd)
