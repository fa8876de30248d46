"""Write review (issue 16): a workspace in mode "review" is writable inside, but what the
sandbox writes stays in an overlay's upper layer on its scratch until the caller applies
it; `changes()` lists it, `apply_changes()` copies it (never a link out, a device node, a
FIFO or set-id bits; never over a host change made meanwhile), `discard_changes()` drops
it; the CLI asks on a terminal, keeps nothing otherwise, and writes a git patch.

Real sandboxes (bwrap, runsc), a real overlay, real git. The setuid file and the device
node are planted in the upper layer from the host side: no sandbox can make them (seccomp
refuses set-id modes, and no capability allows mknod), but apply must refuse them anyway.
"""

import os
import shutil
import stat
import subprocess
import tempfile
import time

import pytest
from conftest import CORRAL, tier_unavailable

import corral
from corral.errors import PolicyError, UnsupportedRule
from corral.policy import policy_from_dict

OWNER = 1000   # the workspace belongs to someone other than root, as a checkout would
GIT = shutil.which("git")


@pytest.fixture
def ws():
    base = tempfile.mkdtemp(prefix="corral-review-", dir="/var/tmp")
    os.chmod(base, 0o755)
    d = os.path.join(base, "ws")
    files = {"a.txt": "hello\nworld\n", "keep": "keep\n", "sub/b": "b\n", "gone/g": "g\n",
             "bin.dat": b"\x00\x01\x02binary", "tool.sh": "#!/bin/sh\necho tool\n"}
    for rel, data in files.items():
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(p, 0o644)
    for root, dirs, names in os.walk(d):
        os.chown(root, OWNER, OWNER)
        for n in names:
            os.chown(os.path.join(root, n), OWNER, OWNER)
    settle(d)
    yield d
    shutil.rmtree(base)


def settle(root):
    """Wait until the kernel's clock is past every ctime below root by more than the
    slack apply allows (a host change just before a sandbox opens counts as made while it
    ran, the safe side): the fixture's files are then older than any sandbox of the test."""
    newest = max(os.lstat(os.path.join(r, n)).st_ctime_ns
                 for r, ds, fs in os.walk(root) for n in [*ds, *fs, "."])
    # CLOCK_REALTIME_COARSE, and well past backends/host/review.py's CTIME_SLACK_NS (10 ms)
    while time.clock_gettime_ns(5) <= newest + 100_000_000:
        time.sleep(0.005)


def review_policy(path, tier="namespace", **limits):
    p = {"isolation": tier, "filesystem": {"workspace": {"path": path, "mode": "review"}}}
    if limits:
        p["limits"] = limits
    return p


@pytest.fixture(params=("namespace", "gvisor"))
def tier(request, ws):
    why = tier_unavailable(request.param, review_policy(ws, request.param))
    if why:
        pytest.skip(f"review mode on the {request.param} tier is not available here: {why}")
    return request.param


def snapshot(root):
    """Every entry below root, never following a link: type, mode, content or target,
    mtime and inode."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    body = f.read()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            else:
                body = None
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                             body, st.st_mtime_ns, st.st_ino)
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read()


CHANGE = ("set -e; echo more >> a.txt; echo new > new.txt; rm sub/b; chmod 700 keep; "
          "rm -rf gone; mkdir -p nd/deep; echo deep > nd/deep/f")


def kinds(changes):
    return {(c.kind, c.path) for c in changes}


def test_review_leaves_the_host_untouched_until_apply(tier, ws):
    before = snapshot(ws)
    with corral.Sandbox(review_policy(ws, tier)) as sb:
        r = sb.exec(["sh", "-c", CHANGE])
        assert r.exit_code == 0, r.stderr
        # the sandbox sees its writes, in this exec and the next (upper is kept)
        r = sb.exec(["sh", "-c", "cat a.txt new.txt; test ! -e sub/b && echo no-b"])
        assert r.stdout == "hello\nworld\nmore\nnew\nno-b\n", r.stderr
        assert snapshot(ws) == before          # every file's content, mode, mtime, inode
        changes = sb.changes()
        assert kinds(changes) == {
            ("modified", "a.txt"), ("added", "new.txt"), ("deleted", "sub/b"),
            ("modified", "keep"), ("deleted", "gone"), ("deleted", "gone/g"),
            ("added", "nd"), ("added", "nd/deep"), ("added", "nd/deep/f")}
        by = {c.path: c for c in changes}
        assert "+more" in by["a.txt"].diff and by["a.txt"].diff.startswith("--- a/a.txt")
        assert (by["keep"].old_mode, by["keep"].new_mode) == (0o644, 0o700)
        assert by["keep"].diff is None         # a mode change only
        assert "-b" in by["sub/b"].diff
        assert not any(c.conflict or c.refused for c in changes)
        assert snapshot(ws) == before          # listing wrote nothing either

        done = sb.apply_changes()
        assert set(done.applied) == {c.path for c in changes}
        assert not done.conflicts and not done.refused
        assert sb.changes() == []              # the host now is what the sandbox sees
    assert read(os.path.join(ws, "a.txt")) == b"hello\nworld\nmore\n"
    assert read(os.path.join(ws, "new.txt")) == b"new\n"
    assert read(os.path.join(ws, "nd/deep/f")) == b"deep\n"
    assert not os.path.lexists(os.path.join(ws, "sub/b"))
    assert not os.path.lexists(os.path.join(ws, "gone"))
    assert stat.S_IMODE(os.stat(os.path.join(ws, "keep")).st_mode) == 0o700
    # new files belong to the workspace's owner, as a rw workspace's would
    assert os.stat(os.path.join(ws, "new.txt")).st_uid == OWNER
    assert os.stat(os.path.join(ws, "nd/deep")).st_uid == OWNER
    # untouched files kept their inode and mtime
    after = snapshot(ws)
    for rel in ("bin.dat", "tool.sh"):
        assert after[rel] == before[rel]


def test_a_binary_change_is_listed_with_sizes_not_a_diff(tier, ws):
    """Issue 16: "a unified diff for text files and sizes for binary ones"."""
    with corral.Sandbox(review_policy(ws, tier)) as sb:
        r = sb.exec(["sh", "-c", "printf '\\000\\377 more binary!' >> bin.dat; "
                     "head -c 3000 /dev/zero > zeros.bin"])
        assert r.exit_code == 0, r.stderr
        by = {c.path: c for c in sb.changes()}
        mod, new = by["bin.dat"], by["zeros.bin"]
        assert (mod.kind, mod.binary, mod.diff) == ("modified", True, None)
        assert (mod.old_size, mod.new_size) == (9, 9 + 15)
        assert (new.kind, new.binary, new.diff, new.new_size) == ("added", True, None, 3000)
        assert mod.summary() == "M bin.dat  (9 bytes -> 24 bytes)", mod.summary()
        assert new.summary() == "A zeros.bin  (3000 bytes)", new.summary()
        patch, _ = sb.changes_patch()
        assert b"GIT binary patch" in patch or b"Binary files" in patch, patch[:400]


def test_a_directory_replaced_inside_is_opaque_its_old_entries_deleted(ws):
    """rm -rf sub; mkdir sub: the overlay marks the new sub opaque; the host's sub/b is
    then deleted even though no whiteout names it, and a file recreated as it was is no
    change at all."""
    with corral.Sandbox(review_policy(ws)) as sb:
        r = sb.exec(["sh", "-c", "set -e; cp sub/b /tmp/b; rm -rf sub; mkdir sub; "
                                 "echo z > sub/z; cp /tmp/b sub/b; rm -rf gone; mkdir gone"])
        assert r.exit_code == 0, r.stderr
        assert os.getxattr(os.path.join(sb._live.review.upper, "sub"),
                           "trusted.overlay.opaque") == b"y"
        assert kinds(sb.changes()) == {("added", "sub/z"), ("deleted", "gone/g")}
        sb.apply_changes()
    assert sorted(os.listdir(os.path.join(ws, "sub"))) == ["b", "z"]
    assert os.listdir(os.path.join(ws, "gone")) == []


def _plant(upper, name, make):
    p = os.path.join(upper, name)
    make(p)
    return p


def test_apply_refuses_escapes_devices_and_setid(ws):
    outside = tempfile.mkdtemp(prefix="corral-review-out-", dir="/var/tmp")
    passwd = read("/etc/passwd")
    try:
        with corral.Sandbox(review_policy(ws)) as sb:
            r = sb.exec(["sh", "-c", "set -e; ln -s /etc/passwd leak; ln -s ../../etc sub/up; "
                                     "ln -s ../a.txt sub/ok; ln -s x/../../.. sub/trick; "
                                     "mkfifo ff; echo fine > fine.txt"])
            assert r.exit_code == 0, r.stderr
            # a sandbox cannot chmod u+s (seccomp) or mknod: plant them in upper directly
            upper = sb._live.review.upper

            def suid(p):
                with open(p, "w") as f:
                    f.write("#!/bin/sh\nid\n")
                os.chmod(p, 0o4755)

            _plant(upper, "suid", suid)
            _plant(upper, "sgid", lambda p: (os.close(os.open(p, os.O_CREAT | os.O_WRONLY)),
                                             os.chmod(p, 0o2755)))
            _plant(upper, "null", lambda p: os.mknod(p, stat.S_IFCHR | 0o666,
                                                     os.makedev(1, 3)))
            _plant(upper, "disk", lambda p: os.mknod(p, stat.S_IFBLK | 0o600,
                                                     os.makedev(8, 0)))
            by = {c.path: c for c in sb.changes()}
            for bad in ("leak", "sub/up", "sub/trick", "ff", "suid", "sgid", "null", "disk"):
                assert by[bad].refused, bad
            assert by["sub/ok"].refused is None and by["fine.txt"].refused is None
            done = sb.apply_changes()
            assert {p for p, _ in done.refused} == {"leak", "sub/up", "sub/trick", "ff",
                                                    "suid", "sgid", "null", "disk"}
            assert set(done.applied) == {"sub/ok", "fine.txt"}
        for bad in ("leak", "sub/up", "sub/trick", "ff", "suid", "sgid", "null", "disk"):
            assert not os.path.lexists(os.path.join(ws, bad)), bad
        assert os.readlink(os.path.join(ws, "sub/ok")) == "../a.txt"
        assert read(os.path.join(ws, "fine.txt")) == b"fine\n"
        for rel, (fmt, mode, *_rest) in snapshot(ws).items():
            assert fmt in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK), rel
            assert not mode & 0o6000, rel
        assert read("/etc/passwd") == passwd
        assert os.listdir(outside) == []
    finally:
        shutil.rmtree(outside)


def test_apply_never_follows_a_host_link_swapped_in(ws):
    """The host's `sub` becomes a link to a directory outside before apply: the new
    file the sandbox wrote in sub/ must not land there."""
    outside = tempfile.mkdtemp(prefix="corral-review-out-", dir="/var/tmp")
    try:
        with corral.Sandbox(review_policy(ws)) as sb:
            assert sb.exec(["sh", "-c", "echo x > sub/new && echo y >> sub/b"]).exit_code == 0
            os.rename(os.path.join(ws, "sub"), os.path.join(ws, "sub.real"))
            os.symlink(outside, os.path.join(ws, "sub"))
            done = sb.apply_changes()
            assert not done.applied
            assert {p for p, _ in done.conflicts} >= {"sub/new", "sub/b"}
        assert os.listdir(outside) == []
        assert read(os.path.join(ws, "sub.real/b")) == b"b\n"
    finally:
        shutil.rmtree(outside)


def test_apply_never_follows_a_host_link_swapped_in_after_the_listing(ws, monkeypatch):
    """The same swap between apply's own listing and its writes (the race a listing
    cannot see): the walk from the workspace fd refuses the link, nothing lands outside."""
    from corral.runtime import changes as ch

    outside = tempfile.mkdtemp(prefix="corral-review-out-", dir="/var/tmp")
    listed = ch.list_changes

    def list_then_swap(review):
        out = listed(review)
        os.rename(os.path.join(ws, "sub"), os.path.join(ws, "sub.real"))
        os.symlink(outside, os.path.join(ws, "sub"))
        return out

    try:
        with corral.Sandbox(review_policy(ws)) as sb:
            assert sb.exec(["sh", "-c", "echo x > sub/new && echo y >> sub/b"]).exit_code == 0
            monkeypatch.setattr(ch, "list_changes", list_then_swap)
            done = sb.apply_changes()
            assert not done.applied
            assert {p for p, _ in done.conflicts} == {"sub/new", "sub/b"}
        assert os.listdir(outside) == []
        assert read(os.path.join(ws, "sub.real/b")) == b"b\n"
    finally:
        shutil.rmtree(outside)


def test_a_host_change_during_the_run_is_a_conflict_never_overwritten(ws):
    with corral.Sandbox(review_policy(ws)) as sb:
        r = sb.exec(["sh", "-c", "echo sandbox >> a.txt; chmod 700 keep; echo n > new.txt; "
                                 "echo t >> tool.sh"])
        assert r.exit_code == 0, r.stderr
        # the host edits a.txt and deletes keep while the sandbox is open
        with open(os.path.join(ws, "a.txt"), "a") as f:
            f.write("host\n")
        os.unlink(os.path.join(ws, "keep"))
        by = {c.path: c for c in sb.changes()}
        assert by["a.txt"].conflict and by["keep"].conflict
        assert by["new.txt"].conflict is None and by["tool.sh"].conflict is None
        done = sb.apply_changes()
        assert {p for p, _ in done.conflicts} == {"a.txt", "keep"}
        assert set(done.applied) == {"new.txt", "tool.sh"}
        # a second apply does not take the first one's writes for the host's
        assert sb.exec(["sh", "-c", "echo again >> tool.sh"]).exit_code == 0
        again = sb.apply_changes(["tool.sh"])
        assert again.applied == ("tool.sh",) and not again.conflicts
    with pytest.raises(corral.UsageError):   # closed: its changes went with it
        sb.changes()
    assert read(os.path.join(ws, "a.txt")) == b"hello\nworld\nhost\n"
    assert not os.path.lexists(os.path.join(ws, "keep"))
    assert read(os.path.join(ws, "new.txt")) == b"n\n"
    assert read(os.path.join(ws, "tool.sh")).endswith(b"t\nagain\n")


def test_discard_empties_the_upper_layer(ws):
    before = snapshot(ws)
    with corral.Sandbox(review_policy(ws)) as sb:
        assert sb.exec(["sh", "-c", CHANGE]).exit_code == 0
        assert sb.changes()
        upper = sb._live.review.upper
        assert os.listdir(upper)
        sb.discard_changes()
        assert os.listdir(upper) == []
        assert sb.changes() == []
        r = sb.exec(["sh", "-c", "cat a.txt; ls sub gone"])
        assert r.stdout == "hello\nworld\ng\nb\n" or r.stdout.startswith("hello\nworld\n")
        assert "b" in r.stdout.split() and "g" in r.stdout.split()
        # and review goes on: new changes after the discard
        assert sb.exec(["sh", "-c", "echo after > after.txt"]).exit_code == 0
        assert kinds(sb.changes()) == {("added", "after.txt")}
    assert snapshot(ws) == before


def test_hard_links_cannot_make_apply_write_more_than_scratch_holds(ws):
    """600 KiB in one file with 9 more names is 6 MiB to copy out of a 1 MiB scratch:
    apply copies up to the scratch's size in all and refuses the rest."""
    with corral.Sandbox(review_policy(ws, scratch="1M")) as sb:
        r = sb.exec(["sh", "-c", "set -e; head -c 614400 /dev/urandom > h0; "
                                 "for i in 1 2 3 4 5 6 7 8 9; do ln h0 h$i; done"])
        assert r.exit_code == 0, r.stderr
        done = sb.apply_changes()
        assert 1 <= len(done.applied) <= 2
        assert len(done.refused) >= 8
        assert all("scratch size" in why for _, why in done.refused)
        data, left = sb.changes_patch()
        assert len(data) < 4 << 20
    copied = sum(os.path.getsize(os.path.join(ws, f"h{i}")) for i in range(10)
                 if os.path.exists(os.path.join(ws, f"h{i}")))
    assert copied <= 1 << 20


def test_the_upper_layer_is_capped_by_the_scratch_limit(ws):
    before = snapshot(ws)
    with corral.Sandbox(review_policy(ws, scratch="1M")) as sb:
        r = sb.exec(["sh", "-c", "head -c 3000000 /dev/zero > big; echo rc=$?"])
        assert "No space left" in r.stderr and "rc=1" in r.stdout
        big = {c.path: c for c in sb.changes()}.get("big")
        assert big is None or big.new_size <= 1 << 20
    assert snapshot(ws) == before


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_patch_is_accepted_by_git_apply_and_matches_apply(ws, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ws, copy, symlinks=True)
    with corral.Sandbox(review_policy(ws)) as sb:
        r = sb.exec(["sh", "-c", CHANGE + "; chmod +x tool.sh; printf 'x\\000y' > bin.dat; "
                                 "printf 'no newline' > nonl; ln -s a.txt link; "
                                 "printf 'a\\nb' >> a.txt; ln -s /etc/passwd leak"])
        assert r.exit_code == 0, r.stderr
        data, left = sb.changes_patch()
        assert dict(left).keys() == {"leak"}
        (tmp_path / "p.patch").write_bytes(data)
        check = subprocess.run([GIT, "apply", "--check", "-v", str(tmp_path / "p.patch")],
                               cwd=copy, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr + data.decode(errors="replace")
        subprocess.run([GIT, "apply", str(tmp_path / "p.patch")], cwd=copy, check=True)
        done = sb.apply_changes()
        assert dict(done.refused).keys() == {"leak"}

    def files(root):   # git records no directories and only the x bit of a mode
        return {rel: (fmt, mode & 0o100 if fmt == stat.S_IFREG else None, body)
                for rel, (fmt, mode, body, *_r) in snapshot(root).items()
                if fmt != stat.S_IFDIR}

    assert files(copy) == files(ws)
    assert read(os.path.join(ws, "bin.dat")) == b"x\x00y"
    assert os.readlink(os.path.join(ws, "link")) == "a.txt"


#: names git quotes in a patch ("a/\\303\\244 b"), and near misses it does not
ODD_NAMES = ["\u00e4 b", 'q"uote', "back\\slash", "new\nline", "tab\there", "trail ",
             "\udcff\udcfe", "x b", "sp ace/b y", "--- a", "+++ b", "@@ -1 +1 @@",
             "a/b c"]


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_patch_names_git_quotes_reach_the_same_paths_through_git_apply(ws, tmp_path):
    """Every odd name of the patch is the path git apply writes, byte for byte, and the
    path apply_changes writes: no name lands on another path (the patch is git's own
    quoting, C-style with octal escapes, which git parses back)."""
    copy = tmp_path / "copy"
    shutil.copytree(ws, copy, symlinks=True)
    script = ("i=0; for n in \"$@\"; do mkdir -p \"$(dirname -- \"$n\")\"; "
              "printf 'line %d\\n' $i > \"$n\"; i=$((i+1)); done; "
              "echo more >> a.txt; rm keep")
    with corral.Sandbox(review_policy(ws)) as sb:
        r = sb.exec(["sh", "-c", script, "sh", *ODD_NAMES])
        assert r.exit_code == 0, r.stderr
        data, left = sb.changes_patch()
        assert left == []
        # the review's own diffs quote the names as the patch does: a newline in a name
        # starts no header line of its own
        diffs = {c.path: c.diff for c in sb.changes()}
        assert diffs["new\nline"].splitlines()[:2] == ['--- /dev/null', '+++ "b/new\\nline"']
        assert diffs["+++ b"].splitlines()[1] == "+++ b/+++ b"
        assert diffs["\udcff\udcfe"].splitlines()[1] == '+++ "b/\\377\\376"'
        (tmp_path / "p.patch").write_bytes(data)
        numstat = subprocess.run([GIT, "apply", "--numstat", "-z", str(tmp_path / "p.patch")],
                                 cwd=copy, capture_output=True)
        assert numstat.returncode == 0, numstat.stderr
        named = {os.fsdecode(x.split(b"\t", 2)[2]) for x in numstat.stdout.split(b"\0")
                 if x}
        assert named == {*ODD_NAMES, "a.txt", "keep"}, named
        subprocess.run([GIT, "apply", str(tmp_path / "p.patch")], cwd=copy, check=True)
        done = sb.apply_changes()
        assert done.refused == () and done.conflicts == ()

    def files(root):
        return {rel: body for rel, (fmt, mode, body, *_r) in snapshot(root).items()
                if fmt != stat.S_IFDIR}

    assert files(copy) == files(ws)
    for i, n in enumerate(ODD_NAMES):
        assert read(os.path.join(ws, n)) == f"line {i}\n".encode(), n


def _cli(ws, *args, **kw):
    return subprocess.run([CORRAL, "run", "--workspace", f"{ws}:review", *args], cwd=ws,
                          capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, **kw)


def test_cli_without_apply_on_no_terminal_keeps_the_host_untouched(ws):
    before = snapshot(ws)
    p = _cli(ws, "--", "sh", "-c", CHANGE)
    assert p.returncode == 0, p.stderr
    assert "M a.txt" in p.stderr and "--apply" in p.stderr and "--patch" in p.stderr
    assert snapshot(ws) == before


def test_cli_apply_and_discard(ws):
    before = snapshot(ws)
    p = _cli(ws, "--discard", "--", "sh", "-c", CHANGE)
    assert p.returncode == 0 and "discarded" in p.stderr, p.stderr
    assert snapshot(ws) == before
    p = _cli(ws, "--apply", "--", "sh", "-c", CHANGE + "; ln -s /etc/passwd leak")
    assert p.returncode == 0, p.stderr
    assert "REFUSED: leak" in p.stderr
    assert read(os.path.join(ws, "a.txt")) == b"hello\nworld\nmore\n"
    assert not os.path.lexists(os.path.join(ws, "leak"))
    p = subprocess.run([CORRAL, "run", "--apply", "--", "true"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "review" in p.stderr


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_cli_patch_file_git_applies(ws, tmp_path):
    before = snapshot(ws)
    patch = tmp_path / "out.patch"
    p = _cli(ws, "--patch", str(patch), "--", "sh", "-c", CHANGE)
    assert p.returncode == 0, p.stderr
    assert snapshot(ws) == before
    check = subprocess.run([GIT, "apply", "--check", str(patch)], cwd=ws, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr


def _on_a_terminal(ws, answers: bytes, script: str) -> bytes:
    """`corral run --workspace WS:review -- sh -c SCRIPT` with a terminal as its stdin and
    stderr (the review's dialog), `answers` typed ahead; what the terminal showed. Fails
    unless corral exits 0."""
    master, slave = os.openpty()
    try:
        os.write(master, answers)
        p = subprocess.Popen([CORRAL, "run", "--workspace", f"{ws}:review", "--", "sh", "-c",
                              script], cwd=ws, stdin=slave, stderr=slave,
                             stdout=subprocess.PIPE)
        os.close(slave)
        slave = -1
        seen = b""
        while True:   # drain the terminal until corral closes its side
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        p.stdout.close()
        assert p.wait(timeout=180) == 0, seen
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    return seen


def test_cli_asks_on_a_terminal(ws):
    """y for the first change (a.txt), n for the rest: only a.txt reaches the host."""
    seen = _on_a_terminal(ws, b"y\n" + b"n\n" * 20,
                          "echo more >> a.txt; echo new > new.txt; rm sub/b")
    assert b"apply it?" in seen
    assert read(os.path.join(ws, "a.txt")) == b"hello\nworld\nmore\n"
    assert not os.path.lexists(os.path.join(ws, "new.txt"))
    assert read(os.path.join(ws, "sub/b")) == b"b\n"


#: "Trojan Source" (CVE-2021-42574): a line that renders as a comment but runs, and names
#: that render as another name
TROJAN = ("printf 'ok = 1  # \\342\\200\\256 } \\342\\201\\246if admin:\\342\\201\\251"
          " \\342\\201\\246 begin\\n' >> a.txt; "
          "echo x > \"$(printf 'run\\342\\200\\256txt.sh')\"; "
          "echo y > \"$(printf 'ke\\342\\200\\213ep\\357\\273\\277')\"")
HIDDEN = ["\u202e", "\u2066", "\u2069", "\u200b", "\ufeff"]


def test_review_shows_bidi_controls_and_zero_width_characters_escaped(ws):
    """The review's listing and the diffs it asks about on a terminal show each
    reordering or invisible character as an escape: none reaches the terminal raw."""
    p = _cli(ws, "--", "sh", "-c", TROJAN)
    assert p.returncode == 0, p.stderr
    assert not [c for c in HIDDEN if c in p.stderr], p.stderr
    assert "A run\\u202etxt.sh" in p.stderr and "A ke\\u200bep\\ufeff" in p.stderr
    seen = _on_a_terminal(ws, b"n\n" * 20, TROJAN)
    text = seen.decode()
    assert "apply it?" in text
    assert not [c for c in HIDDEN if c in text], text
    assert "+ok = 1  # \\u202e } \\u2066if admin:\\u2069 \\u2066 begin" in text, text
    assert read(os.path.join(ws, "a.txt")) == b"hello\nworld\n"


def test_the_process_tier_refuses_review_naming_a_tier_that_could(ws):
    with pytest.raises(UnsupportedRule) as e:
        corral.Sandbox(review_policy(ws, "process"))
    assert e.value.field == "filesystem.workspace"
    assert "review" in e.value.message and "mounts" in e.value.message
    if tier_unavailable("namespace", review_policy(ws)) is None:
        assert 'isolation = "' in e.value.message


def test_policy_takes_mode_review_and_names_it_in_errors(ws):
    p = policy_from_dict(review_policy(ws))
    assert p.filesystem.workspace.mode == "review"
    with pytest.raises(PolicyError) as e:
        policy_from_dict({"filesystem": {"workspace": {"path": ws, "mode": "overlay"}}})
    assert e.value.field == "filesystem.workspace.mode" and "review" in e.value.message
    with corral.Sandbox({"filesystem": {"workspace": {"path": ws, "mode": "ro"}}}) as sb:
        with pytest.raises(corral.UsageError):
            sb.changes()


def test_the_layers_are_one_tree_that_one_unmount_takes(ws):
    """The review overlay and its lower layer (the host's directory) are mounted below
    one bind of <run>/review, the only mount of the three the run dir unmounts: closing
    detaches all of them with one umount2(MNT_DETACH), one RCU grace period instead of
    one per mount, and leaves nothing of the workspace mounted."""
    def mounted_below(path):
        with open("/proc/self/mountinfo") as f:
            return sorted(line.split()[4] for line in f if path + "/" in line.split()[4])

    sb = corral.Sandbox(review_policy(ws)).open()
    try:
        live = sb._live
        home = os.path.join(live.dir.path, "review")
        assert home in live.dir.mounts
        assert live.review.lower not in live.dir.mounts
        assert live.review.merged not in live.dir.mounts
        assert os.path.dirname(live.review.lower) == home == os.path.dirname(
            live.review.merged)
        assert mounted_below(home) == sorted([live.review.lower, live.review.merged])
        r = sb.exec(["/bin/sh", "-c", "echo x > /workspace/new.txt && cat keep"])
        assert r.verdict == "ok" and r.stdout == "keep\n", r
        sb.discard_changes()       # the overlay mounted anew, still below the bind
        assert mounted_below(home) == sorted([live.review.lower, live.review.merged])
        run_dir = live.dir.path
    finally:
        sb.close()
    assert mounted_below(run_dir) == [] and not os.path.exists(run_dir)
    assert "new.txt" not in os.listdir(ws)
