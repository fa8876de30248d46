"""The tar extractor of the files API (runtime/archive.py through Files.write_archive) under
hostile archives built with the real tarfile module: names with `..` or absolute, links
leaving the tree, devices and FIFOs, sizes past the caps, damaged and compressed streams,
a link planted in the target beforehand. Every archive is written or refused whole
(FilesError, nothing written), and nothing outside the target ever changes."""

from __future__ import annotations

import bz2
import io
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zlib

import fuzz_profiles  # noqa: F401  (the ci/long settings profile, by CORRAL_FUZZ)
from hypothesis import example, given
from hypothesis import strategies as st

from corral.runtime.files import Caps, Files, FilesError

COMPONENT = st.sampled_from(["a", "b", "c", "..", ".", "", "d" * 120, "x y", "é"])
NAME = st.one_of(
    st.lists(COMPONENT, min_size=1, max_size=4).map("/".join),
    st.lists(COMPONENT, min_size=1, max_size=3).map(lambda c: "/" + "/".join(c)),
)
TARGET = st.one_of(NAME, st.sampled_from(["/", "/etc/passwd", "../../outside", "..",
                                          "a/../../..", "link/../..", ""]))
KIND = st.sampled_from(["file", "file", "dir", "symlink", "hardlink", "chr", "blk", "fifo"])
MEMBER = st.tuples(KIND, NAME, TARGET, st.integers(0, 3000), st.integers(0, 0o7777))


def build(members, fmt: int, compress: str, truncate: int | None) -> tuple[bytes, list]:
    """The archive's bytes, and the members it holds (a format may not hold a name)."""
    buf = io.BytesIO()
    added = []
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for kind, name, target, size, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            data = None
            if kind == "file":
                info.type, info.size = tarfile.REGTYPE, size
                data = io.BytesIO(b"z" * size)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, target
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, target
            elif kind in ("chr", "blk"):
                info.type = tarfile.CHRTYPE if kind == "chr" else tarfile.BLKTYPE
                info.devmajor, info.devminor = 1, 3
            else:
                info.type = tarfile.FIFOTYPE
            try:
                tf.addfile(info, data)
                added.append((kind, name, target, size, mode))
            except (ValueError, UnicodeError):
                pass      # a name this format cannot hold (ustar and a long name)
    raw = buf.getvalue()
    if truncate is not None:
        raw = raw[:truncate % (len(raw) + 1)]
    if compress == "gzip":
        co = zlib.compressobj(wbits=31)
        raw = co.compress(raw) + co.flush()
    elif compress == "bz2":
        raw = bz2.compress(raw)
    elif compress == "xz":
        raw = lzma.compress(raw)
    return raw, added


def snapshot(top: str) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st_ = os.lstat(p)
            kind = stat.S_IFMT(st_.st_mode)
            extra = os.readlink(p) if stat.S_ISLNK(st_.st_mode) else st_.st_size
            out[os.path.relpath(p, top)] = (kind, extra, st_.st_mtime_ns if
                                            stat.S_ISREG(st_.st_mode) else 0)
    return out


class Tree:
    """root/ (the sandbox's root as Files sees it) with a target inside, and outside/ next
    to it holding a file that must never change; a link in the target leads out."""

    def __init__(self, planted: bool) -> None:
        self.top = tempfile.mkdtemp(prefix="corral-fuzz-tar-")
        self.root = os.path.join(self.top, "root")
        os.makedirs(os.path.join(self.root, "t"))
        os.makedirs(os.path.join(self.top, "outside"))
        with open(os.path.join(self.top, "outside", "keep"), "w") as f:
            f.write("keep")
        if planted:
            os.symlink("../../outside", os.path.join(self.root, "t", "link"))
            os.symlink("/", os.path.join(self.root, "t", "abs"))

    def outside(self) -> dict:
        return {k: v for k, v in snapshot(self.top).items()
                if not (k == "root/t" or k.startswith("root/t/"))}

    def close(self) -> None:
        shutil.rmtree(self.top)


def _refused_by_name(members) -> bool:
    for kind, name, target, _, _ in members:
        if kind == "dir":
            name = name.rstrip("/")     # as tarfile reads a directory's name back
        parts = [c for c in name.split("/") if c not in ("", ".")]
        if name.startswith("/") or ".." in parts or kind in ("chr", "blk", "fifo"):
            return True
    return False


@given(st.lists(MEMBER, min_size=1, max_size=6),
       st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]),
       st.sampled_from(["none", "gzip", "bz2", "xz"]),
       st.one_of(st.none(), st.integers(0, 1 << 16)), st.booleans(),
       st.sampled_from([Caps(), Caps(write=4096, members=4)]))
@example([("symlink", "l", "..", 0, 0o777)], tarfile.GNU_FORMAT, "none", None, False, Caps())
@example([("file", "link/x", "", 4, 0o644)], tarfile.GNU_FORMAT, "none", None, True, Caps())
@example([("symlink", "s", "a/../..", 0, 0o777)], tarfile.PAX_FORMAT, "none", None, False,
         Caps())
@example([("file", "big", "", 3000, 0o644), ("file", "big2", "", 3000, 0o644)],
         tarfile.GNU_FORMAT, "gzip", None, False, Caps(write=4096, members=4))
@example([("symlink", "d/s", ".", 0, 0o777), ("symlink", "t", "d/s/../..", 0, 0o777)],
         tarfile.GNU_FORMAT, "none", None, False, Caps())
@example([("file", "a", "", 0, 0o644), ("dir", "a", "", 0, 0o755)],
         tarfile.GNU_FORMAT, "none", None, False, Caps())
def test_archive_is_written_whole_or_refused_and_never_outside(members, fmt, compress,
                                                               truncate, planted, caps):
    blob, members = build(members, fmt, compress, truncate)
    tree = Tree(planted)
    try:
        before_out, before_t = tree.outside(), snapshot(os.path.join(tree.root, "t"))
        fd = os.open(tree.root, os.O_PATH | os.O_DIRECTORY)
        try:
            with Files(fd, os.getuid(), os.getgid(), caps=caps) as files:
                try:
                    files.write_archive("/t", blob)
                    ok = True
                except FilesError as e:
                    assert str(e) and "\n" not in str(e)
                    ok = False
        finally:
            os.close(fd)
        assert tree.outside() == before_out, "something outside the target changed"
        after_t = snapshot(os.path.join(tree.root, "t"))
        if truncate is None and _refused_by_name(members):
            assert not ok, f"a hostile member was unpacked: {members!r}"
        if not ok and not planted:
            assert after_t == before_t, "a refused archive left something behind"
        for rel, (kind, extra, _) in after_t.items():
            assert kind in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK), (rel, kind)
            if kind == stat.S_IFLNK and rel not in before_t:
                depth = rel.count("/")
                for c in extra.split("/"):
                    depth += -1 if c == ".." else 0 if c in ("", ".") else 1
                    assert depth >= 0, f"link {rel} -> {extra} leaves the tree"
                assert not extra.startswith("/")
                if not planted:   # resolved for real, through the archive's other links
                    real = os.path.realpath(os.path.join(tree.root, "t", rel))
                    assert (real + "/").startswith(os.path.join(tree.root, "t") + "/"), \
                        f"link {rel} -> {extra} resolves to {real}, outside the tree"
    finally:
        tree.close()


@given(st.binary(max_size=2048), st.sampled_from([b"", b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00"]))
def test_garbage_is_refused_cleanly(data, magic):
    tree = Tree(False)
    try:
        fd = os.open(tree.root, os.O_PATH | os.O_DIRECTORY)
        try:
            with Files(fd, os.getuid(), os.getgid()) as files:
                try:
                    files.write_archive("/t", magic + data)
                except FilesError as e:
                    assert "\n" not in str(e)
        finally:
            os.close(fd)
        assert tree.outside() == Tree.outside(tree)
    finally:
        tree.close()


def test_a_bomb_stops_at_the_bound():
    """A gzip stream that inflates far past the caps is refused before it is all read."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        info = tarfile.TarInfo("f")
        info.size = 64 << 20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    co = zlib.compressobj(9, wbits=31)
    blob = co.compress(raw.getvalue()) + co.flush()
    assert len(blob) < 1 << 20
    tree = Tree(False)
    try:
        fd = os.open(tree.root, os.O_PATH | os.O_DIRECTORY)
        try:
            with Files(fd, os.getuid(), os.getgid(), caps=Caps(write=1 << 20)) as files:
                try:
                    files.write_archive("/t", blob)
                except FilesError as e:
                    assert "nothing written" in str(e)
                else:
                    raise AssertionError("a 64 MiB member went past a 1 MiB cap")
        finally:
            os.close(fd)
        assert snapshot(os.path.join(tree.root, "t")) == {}
    finally:
        tree.close()
