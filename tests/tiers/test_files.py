"""The files API (corral.runtime.files) on real sandboxes, one-shot and live
(Sandbox.create: "namespace-live", "gvisor-live", whose sb.files the runtime makes).

namespace: the view is /proc/PID/root of a command running in the sandbox (a `sleep`
started with Sandbox.exec in a thread), as a live sandbox's init will give it.
gvisor: gVisor's root lives in its own kernel, so the view is the host directories behind
its writable mounts (scratch, /tmp, /dev/shm), which the gofer serves to it.
Every claim is checked from inside too, with a command of the sandbox's own."""

import hashlib
import io
import os
import secrets
import stat
import tarfile
import threading
import time

import pytest
from conftest import tier_unavailable

from corral.runtime.files import Caps, FileNotFound, Files, FilesError, open_root

TIERS = ("namespace", "gvisor")
#: the live sandboxes' own sb.files (runtime/live.py) on the same tests
VIEWS = (*TIERS, "namespace-live", "gvisor-live")
HOST_MARK = "corral-host-only-" + secrets.token_hex(4)


def _find_pid(argv: bytes, uid: int) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() != argv:
                    continue
            with open(f"/proc/{pid}/status") as f:
                uids = next(ln for ln in f if ln.startswith("Uid:")).split()
        except (OSError, StopIteration):
            continue
        if int(uids[1]) == uid:
            return int(pid)
    return None


class Live:
    """A Sandbox with a files view of it (see the module's docstring)."""

    def __init__(self, tier: str, caps: Caps | None = None, policy: dict | None = None):
        import corral

        tier, _, kept = tier.partition("-")
        self.tier = tier
        self.thread = None
        self.pid = None
        if kept:   # a live sandbox: its own sb.files, its commands through sb.exec
            self.sb = corral.Sandbox.create({"isolation": tier, **(policy or {})},
                                            timeout=300)
            self.uid, self.gid = self.sb.ids
            self.files = self.sb.files
            if caps is not None:
                self.files.caps = caps
            return
        self.sb = corral.Sandbox({"isolation": tier, **(policy or {})}).open()
        live = self.sb._live
        self.uid, self.gid = live.uid, live.gid
        if tier == "namespace":
            token = f"{500 + secrets.randbelow(10**6) / 10**6:.6f}"
            self.thread = threading.Thread(target=self.sb.exec, args=(["sleep", token],),
                                           daemon=True)
            self.thread.start()
            want = b"sleep\0" + token.encode() + b"\0"
            for _ in range(1000):
                self.pid = _find_pid(want, self.uid)
                if self.pid:
                    break
                time.sleep(0.02)
            assert self.pid, "the sandbox's sleep never showed up"
            self.pidfd = os.pidfd_open(self.pid)
            root = open_root(self.pid, self.pidfd)
            try:
                self.files = Files(root, self.uid, self.gid, cwd="/scratch", caps=caps)
            finally:
                os.close(root)
        else:
            fds = []
            try:
                for sub, dest in (("home", "/scratch"), ("tmp", "/tmp"), ("shm", "/dev/shm")):
                    fds.append((dest, os.open(os.path.join(live.scratch, sub),
                                              os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW),
                                True))
                self.files = Files.over_mounts(fds, self.uid, self.gid, cwd="/scratch",
                                               caps=caps)
            finally:
                for _, fd, _ in fds:
                    os.close(fd)

    def sh(self, script: str):
        return self.sb.exec(["/bin/sh", "-c", script])

    # coreutils' stat and ls use statx(2), which gVisor here refuses (EINVAL): python's
    # os.stat does not
    def stat(self, *paths: str) -> list[str]:
        """'uid:gid mode(octal) size nlink' of each path, from inside."""
        code = ("import os, sys\nfor p in sys.argv[1:]:\n s = os.lstat(p); "
                "print(f'{s.st_uid}:{s.st_gid} {s.st_mode & 0o7777:o} {s.st_size} "
                "{s.st_nlink}')")
        r = self.sb.exec(["python3", "-c", code, *paths])
        assert r.exit_code == 0, r.stderr
        return r.stdout.splitlines()

    def ls(self, path: str) -> list[str]:
        code = "import os, sys; print(*sorted(os.listdir(sys.argv[1])))"
        r = self.sb.exec(["python3", "-c", code, path])
        assert r.exit_code == 0, r.stderr
        return r.stdout.split()

    def close(self):
        self.files.close()
        if self.pid:
            import signal

            signal.pidfd_send_signal(self.pidfd, 9)
            os.close(self.pidfd)
            self.thread.join(30)
        self.sb.close()


@pytest.fixture(params=VIEWS)
def live(request):
    why = tier_unavailable(request.param.partition("-")[0])
    if why:
        pytest.skip(why)
    lv = Live(request.param)
    yield lv
    lv.close()


@pytest.fixture
def ns():
    why = tier_unavailable("namespace")
    if why:
        pytest.skip(why)
    lv = Live("namespace")
    yield lv
    lv.close()


def test_a_10mb_binary_file_round_trips_byte_for_byte(live):
    data = os.urandom(10 << 20)
    live.files.write("/scratch/blob.bin", data)
    assert live.files.read("/scratch/blob.bin", format="bytes") == data
    assert b"".join(live.files.read("/scratch/blob.bin", format="stream")) == data
    # the sandbox sees the same bytes, owned by its own user (uid 0 inside)
    r = live.sh("sha256sum /scratch/blob.bin")
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert live.stat("/scratch/blob.bin") == [f"0:0 644 {len(data)} 1"]
    # and what the sandbox writes, the API reads
    r = live.sh("printf 'caf\\303\\251\\000\\377' > /tmp/made-inside")
    assert r.exit_code == 0
    assert live.files.read("/tmp/made-inside", format="bytes") == b"caf\xc3\xa9\x00\xff"
    assert live.files.read("/tmp/made-inside") == "café\x00\ufffd"


def test_write_makes_parents_as_the_sandbox_user_and_is_atomic(live):
    live.files.write("/scratch/a/b/c/d.txt", "deep")
    a, c, d = live.stat("/scratch/a", "/scratch/a/b/c", "/scratch/a/b/c/d.txt")
    assert a.split()[:2] == ["0:0", "755"] and c.split()[:2] == ["0:0", "755"]
    assert d == "0:0 644 4 1"
    assert live.ls("/scratch/a/b/c") == ["d.txt"]      # no temporary file left behind
    # a replaced file keeps its mode
    assert live.sh("chmod 750 /scratch/a/b/c/d.txt").exit_code == 0
    live.files.write("/scratch/a/b/c/d.txt", b"again")
    assert live.stat("/scratch/a/b/c/d.txt") == ["0:0 750 5 1"]
    # a file object, and write_files
    live.files.write("rel.txt", io.BytesIO(b"from a file object"))
    live.files.write_files([{"path": "/tmp/x", "data": "1"}, {"path": "/tmp/y", "data": b"2"}])
    assert live.sh("cat /scratch/rel.txt /tmp/x /tmp/y").stdout == "from a file object12"


@pytest.mark.parametrize("target", ["/etc/passwd", "/etc/shadow", "../../../../etc/shadow",
                                    "../../../../etc/passwd", "/proc/1/root/etc/passwd"])
def test_a_planted_link_never_reads_host_content(live, target):
    """A link the sandbox made resolves in the sandbox's own tree (its /etc has no shadow;
    its passwd is corral's minimal one) or is refused: never the host's file."""
    with open("/etc/passwd") as f:
        host_passwd = f.read()
    r = live.sh(f"ln -s {target} /scratch/link && ln -s {target} /tmp/link")
    assert r.exit_code == 0, r.stderr
    for path in ("/scratch/link", "/tmp/link"):
        try:
            got = live.files.read(path)
        except FilesError as e:
            assert "refused" in str(e) or isinstance(e, FileNotFound), str(e)
            continue
        # only the sandbox's own view may come back: on namespace its /etc/passwd
        assert got != host_passwd
        assert got == live.sh("cat /etc/passwd").stdout
        assert live.tier == "namespace" and target.endswith("passwd") \
            and not target.startswith("/proc")


def test_host_content_under_a_link_stays_out(live):
    """Links to host paths the sandbox's user could read and write, were they followed:
    only the resolution keeps the API inside (a permission check would not)."""
    import shutil
    import tempfile

    shared = tempfile.mkdtemp(prefix="corral-files-test-", dir="/dev/shm")
    try:
        os.chmod(shared, 0o777)
        secret = os.path.join(shared, "secret")
        with open(secret, "w") as f:
            f.write(HOST_MARK)
        os.chmod(secret, 0o666)
        live.sh(f"ln -s {secret} /scratch/s; mkdir -p /scratch/d; ln -s / /scratch/d/up")
        with pytest.raises(FilesError):
            live.files.read("/scratch/s")
        with pytest.raises(FilesError):
            live.files.read(f"/scratch/d/up{secret}")
        # writing through the link lands in the sandbox's own /dev/shm (namespace: on its
        # scratch) or is refused (gvisor: the link leaves the mount), never on the host
        try:
            live.files.write(f"/scratch/d/up{shared}/planted", "x")
            assert live.tier == "namespace"
            assert live.sh(f"cat {shared}/planted").stdout == "x"
        except FilesError as e:
            assert live.tier == "gvisor" and "refused" in str(e)
        assert not os.path.exists(os.path.join(shared, "planted"))
        # a link at the name itself is replaced, not written through
        live.sh(f"ln -s {secret} /scratch/w")
        live.files.write("/scratch/w", "mine")
        with open(secret) as f:
            assert f.read() == HOST_MARK
        assert live.files.info("/scratch/w").type == "file"
    finally:
        shutil.rmtree(shared)


def test_fifos_sockets_and_devices_are_refused(live):
    r = live.sh("mkfifo /scratch/fifo && python3 -c \"import socket; "
                "socket.socket(socket.AF_UNIX).bind('/scratch/sock')\"")
    assert r.exit_code == 0, r.stderr
    for path, kind in (("/scratch/fifo", "fifo"), ("/scratch/sock", "socket")):
        if live.tier == "gvisor":   # gVisor keeps both in its own kernel: not on the host
            with pytest.raises(FileNotFound):
                live.files.read(path)
            continue
        with pytest.raises(FilesError, match=f"is a {kind}, not a regular file"):
            live.files.read(path)
        assert live.files.info(path).type == kind
    host_fifo = "/scratch/host-fifo"   # one on the host side of the view, as a gofer might
    if live.tier == "gvisor":
        os.mkfifo(os.path.join(live.sb._live.scratch, "home", "host-fifo"))
        with pytest.raises(FilesError, match="is a fifo, not a regular file"):
            live.files.read(host_fifo)   # and the read does not hang on it
    if live.tier == "namespace":   # the sandbox's /dev/null: a device node it holds
        with pytest.raises(FilesError, match="char_device"):
            live.files.read("/dev/null")
        with pytest.raises(FilesError, match="kernel interface"):
            live.files.read("/proc/1/environ")


def test_read_only_root_and_outside_paths(live):
    """One line each: the read-only root (namespace), outside the mounts served (gvisor)."""
    want = "read-only root" if live.tier == "namespace" else "not under one of the"
    for path in ("/usr/corral-no", "/scratch/../../../etc/x"):
        with pytest.raises(FilesError, match=want) as e:
            live.files.write(path, "x")
        assert "\n" not in str(e.value)
    assert live.sh("test ! -e /usr/corral-no && test ! -e /etc/x").exit_code == 0


def test_size_caps_refuse_with_nothing_written():
    why = tier_unavailable("namespace")
    if why:
        pytest.skip(why)
    lv = Live("namespace", caps=Caps(read=1000, write=1000, entries=5))
    try:
        with pytest.raises(FilesError, match="over the write cap"):
            lv.files.write("/scratch/new/big", b"x" * 1001)
        with pytest.raises(FilesError, match="over the write cap"):
            lv.files.write("/scratch/big2", io.BytesIO(b"x" * 5000))
        assert lv.ls("/scratch") == []   # not even the parent directory
        lv.files.write("/scratch/ok", b"x" * 1000)
        lv.sh("head -c 1001 /dev/zero > /scratch/over; touch /scratch/f1 /scratch/f2 "
              "/scratch/f3 /scratch/f4")
        with pytest.raises(FilesError, match="over the read cap"):
            lv.files.read("/scratch/over")
        with pytest.raises(FilesError, match="more than 5 entries"):
            lv.files.list("/scratch")
    finally:
        lv.close()


def test_list_with_depth_never_enters_a_linked_directory(live):
    live.sh("mkdir -p /scratch/t/a/b/c && echo 1 > /scratch/t/a/f && echo 22 > /scratch/t/a/b/g"
            " && ln -s /usr /scratch/t/usr && ln -s a /scratch/t/rel")
    one = {e.path: e for e in live.files.list("/scratch/t")}
    assert set(one) == {"/scratch/t/a", "/scratch/t/usr", "/scratch/t/rel"}
    assert one["/scratch/t/usr"].type == "symlink"
    assert one["/scratch/t/usr"].symlink_target == "/usr"
    assert one["/scratch/t/a"].type == "dir"
    three = {e.path: e for e in live.files.list("/scratch/t", depth=3)}
    assert set(three) == {"/scratch/t/a", "/scratch/t/usr", "/scratch/t/rel", "/scratch/t/a/f",
                          "/scratch/t/a/b", "/scratch/t/a/b/g", "/scratch/t/a/b/c"}
    assert three["/scratch/t/a/b/g"].size == 3
    assert stat.S_IMODE(three["/scratch/t/a/b"].mode) == 0o755


def test_info_exists_remove_rename_make_dir(live):
    f = live.files
    assert f.make_dir("/scratch/m/n") is True
    assert f.make_dir("/scratch/m/n") is False
    f.write("/scratch/m/n/x", "x")
    live.sh("ln -s /etc /scratch/m/etc-link; ln -s nowhere /scratch/m/dangling")
    assert f.exists("/scratch/m/n/x") and f.exists("/scratch/m/dangling")
    assert not f.exists("/scratch/m/none") and not f.exists("/scratch/m/n/x/under-a-file")
    info = f.info("/scratch/m/dangling")
    assert (info.type, info.symlink_target) == ("symlink", "nowhere")
    # size, mode and mtime as the sandbox set them
    r = live.sh("printf 12345 > /scratch/m/t; chmod 640 /scratch/m/t; python3 -c "
                "\"import os; os.utime('/scratch/m/t', (1000000000, 1000000000.5))\"")
    assert r.exit_code == 0, r.stderr
    info = f.info("/scratch/m/t")
    assert (info.type, info.size, info.mode, info.mtime) == ("file", 5, 0o640, 1000000000.5)
    with pytest.raises(FileNotFound):
        f.info("/scratch/nothing")
    moved = f.rename("/scratch/m/n/x", "/scratch/m/y")
    assert (moved.path, moved.type) == ("/scratch/m/y", "file")
    # remove a link to a directory: the link goes, the directory stays
    f.remove("/scratch/m/etc-link")
    assert live.sh("test -e /etc/passwd && test ! -e /scratch/m/etc-link").exit_code == 0
    f.remove("/scratch/m")
    assert live.sh("test ! -e /scratch/m").exit_code == 0
    with pytest.raises(FilesError, match="names no entry"):
        f.remove("/")


def _tar(*members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind, payload in members:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size = len(payload)
                tf.addfile(ti, io.BytesIO(payload))
                continue
            ti.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                       "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
            if kind in ("sym", "hard"):
                ti.linkname = payload
            tf.addfile(ti)
    return buf.getvalue()


def test_archive_upload_unpacks_files_dirs_and_inner_links(live):
    tar = _tar(("top/", "dir", None), ("top/a.txt", "file", b"A"),
               ("top/sub/b.bin", "file", bytes(range(256))), ("top/sub/l", "sym", "../a.txt"),
               ("top/h", "hard", "top/a.txt"))
    live.files.write("/scratch/up", tar, extract=True)
    assert live.files.read("/scratch/up/top/sub/b.bin", format="bytes") == bytes(range(256))
    assert live.sh("cat /scratch/up/top/sub/l /scratch/up/top/h").stdout == "AA"
    assert live.stat("/scratch/up/top/a.txt")[0].split()[3] == "2"   # links
    import gzip

    live.files.write_archive("/tmp/gz", gzip.compress(_tar(("z", "file", b"zipped"))))
    assert live.files.read("/tmp/gz/z") == "zipped"


@pytest.mark.parametrize("members, why", [
    ([("ok", "file", b"1"), ("../escape", "file", b"x")], "'..'"),
    ([("ok", "file", b"1"), ("a/../../escape", "file", b"x")], "'..'"),
    ([("ok", "file", b"1"), ("/abs-escape", "file", b"x")], "absolute"),
    ([("ok", "file", b"1"), ("l", "sym", "/"), ("l/abs-escape", "file", b"x")], "outside"),
    ([("ok", "file", b"1"), ("d/l", "sym", "../../.."), ("d/l/escape", "file", b"x")], "leaves"),
    ([("ok", "file", b"1"), ("h", "hard", "../../etc/passwd")], "'..'"),
    ([("ok", "file", b"1"), ("h", "hard", "not-a-member")], "no earlier file"),
    ([("ok", "file", b"1"), ("f", "fifo", None)], "FIFO"),
    ([("ok", "file", b"1"), ("c", "chr", None)], "device node"),
])
def test_a_hostile_archive_is_refused_whole(live, members, why):
    with pytest.raises(FilesError, match=why):
        live.files.write("/scratch/in/x", _tar(*members), extract=True)
    # nothing written: not the good member before it, not the target, nothing above
    assert live.ls("/scratch") == [] and live.ls("/tmp") == []


def test_archive_bounds(live):
    lv = live
    small = Files.__new__(Files)
    small._init(lv.files._root, lv.uid, lv.gid, "/scratch", Caps(write=1 << 20, members=3))
    try:
        with pytest.raises(FilesError, match="more than 3 members"):
            small.write_archive("/scratch/m", _tar(*[(f"f{i}", "file", b"") for i in range(4)]))
        with pytest.raises(FilesError, match="write cap"):   # declared sizes, checked first
            small.write_archive("/scratch/m", _tar(("big", "file", b"\0" * (2 << 20))))
        import gzip

        # a bomb: an 8 MiB pax header (tarfile reads those whole) in a few KiB of gzip,
        # refused by its declared size before it is read (runtime/archive.EXTENDED_MAX)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            ti = tarfile.TarInfo("f")
            ti.pax_headers = {"comment": "x" * (8 << 20)}
            tf.addfile(ti, io.BytesIO(b""))
        bomb = gzip.compress(buf.getvalue())
        assert len(bomb) < 64 << 10
        with pytest.raises(FilesError, match="an extended header .* over 65536"):
            small.write_archive("/scratch/m", bomb)
        assert lv.ls("/scratch") == []
    finally:
        small._root = None   # shared with lv.files, closed there


def test_watch_sees_changes_made_inside(live):
    live.files.make_dir("/scratch/w")
    with live.files.watch("/scratch/w") as w:
        assert w.get_new_events() == []
        live.sh("echo hi > /scratch/w/new; mv /scratch/w/new /scratch/w/moved; "
                "chmod 600 /scratch/w/moved; rm /scratch/w/moved")
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and ("remove", "moved") not in seen:
            seen += [(e.type, e.name) for e in w.next_events(1)]
        # in this order; gVisor's gofer adds attribute changes of its own (chmod) between
        order = [("add", "new"), ("modify", "new"), ("rename", "new"), ("add", "moved"),
                 ("chmod", "moved"), ("remove", "moved")]
        assert [e for e in seen if e in order] == order
        assert seen[-1] == ("remove", "moved")


def test_recursive_watch_follows_new_directories(ns):
    ns.files.make_dir("/scratch/r")
    with ns.files.watch("/scratch/r", recursive=True) as w:
        ns.sh("mkdir /scratch/r/sub")
        got = w.next_events(10)
        assert ("add", "sub") in [(e.type, e.name) for e in got]
        ns.sh("echo x > /scratch/r/sub/inner")
        names = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "sub/inner" not in names:
            names += [e.name for e in w.next_events(1)]
        assert "sub/inner" in names


def test_a_recursive_watch_past_its_cap_of_directories_still_watches(ns):
    """A sandbox that makes more directories than one watch follows (MAX_WATCHES): the
    watch is made on the first MAX_WATCHES and goes on reporting; the fd of a directory
    it did not take is closed, never scanned afterwards (its number may be another
    thread's by then)."""
    from corral.runtime.watch import MAX_WATCHES

    ns.sh(f"mkdir -p /scratch/many && cd /scratch/many && "
          f"seq -f d%g 1 {MAX_WATCHES + 50} | xargs mkdir")
    with ns.files.watch("/scratch/many", recursive=True) as w:
        assert len(w._wds) == MAX_WATCHES
        ns.sh("echo x > /scratch/many/top")
        names = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "top" not in names:
            names += [e.name for e in w.next_events(1)]
        assert "top" in names


def test_a_closed_view_refuses(ns):
    f = Files.__new__(Files)
    f._init(None, ns.uid, ns.gid, "/", None)
    with pytest.raises(FilesError, match="closed"):
        f.read("/etc/passwd")


@pytest.mark.parametrize("tier", TIERS)
def test_sandbox_files_reach_scratch_and_workspace(tier, tmp_path):
    """corral.Sandbox.files today: the mounts that outlive each exec, as the sandbox sees
    them; a link out of them refused; nothing lands on the host outside the workspace."""
    policy = {"isolation": tier, "filesystem": {"workspace": {"path": str(tmp_path),
                                                              "mode": "rw"}}}
    why = tier_unavailable(tier, policy)
    if why:
        pytest.skip(why)
    import corral

    (tmp_path / "in.txt").write_bytes(b"from the host\n")
    with corral.Sandbox(policy) as sb:
        f = sb.files
        assert f.read("in.txt") == "from the host\n"    # relative to the workspace (cwd)
        f.write("/scratch/x.bin", b"\0\1\2")
        f.write("out/y.txt", "made by the API")
        code = ("import os; print(open('/scratch/x.bin','rb').read(), "
                "open('out/y.txt').read(), os.stat('out/y.txt').st_uid)")
        r = sb.exec(["python3", "-c", code])
        assert r.stdout == "b'\\x00\\x01\\x02' made by the API 0\n", r.stderr
        assert (tmp_path / "out" / "y.txt").read_text() == "made by the API"
        assert (tmp_path / "out" / "y.txt").stat().st_uid == os.getuid()  # the owner's
        sb.exec(["ln", "-s", "/etc", "/scratch/etc"])
        with pytest.raises(FilesError, match="leads out"):
            f.read("/scratch/etc/passwd")
        with pytest.raises(FilesError, match="not under one of the sandbox's mounts"):
            f.read("/etc/passwd")
    with pytest.raises(FilesError, match="closed"):
        f.read("in.txt")
