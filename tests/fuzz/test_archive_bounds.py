"""The bounds of the tar extractor (runtime/archive.py through Files.write_archive) on
archives built to cost time or memory rather than to escape: a huge PAX extended header,
GNU sparse members, names past NAME_MAX, PATH_MAX or any sane depth, and streams of
millions of headers that are not members. Each is refused whole with a one-line FilesError
saying which bound, nothing written; near misses just inside each bound are unpacked.
Real archives (the tarfile module, and headers made by hand where it cannot write them),
a real directory, the real Files API."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import zlib

import pytest

from corral.runtime.archive import EXTENDED_MAX
from corral.runtime.files import Caps, Files, FilesError

NAME_MAX, PATH_MAX = 255, 4096


def _tar(members, fmt=tarfile.PAX_FORMAT, pax_headers=None) -> bytes:
    """members: (name, kind, data-or-linkname, pax headers of its own)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt,
                      pax_headers=pax_headers or {}) as tf:
        for name, kind, extra, own in members:
            info = tarfile.TarInfo(name)
            info.pax_headers = dict(own or {})
            if kind == "file":
                info.size = len(extra)
                tf.addfile(info, io.BytesIO(extra))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.type, info.linkname = tarfile.SYMTYPE, extra
                tf.addfile(info)
    return buf.getvalue()


def _header(name: bytes, typeflag: bytes, size: int = 0) -> bytes:
    """One ustar header block made by hand, with its checksum."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = typeflag
    h[257:265] = b"ustar  \0"     # GNU magic: tarfile reads the old GNU fields
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _pax(records: bytes, typeflag: bytes = b"x") -> bytes:
    """A PAX header block and its records, padded."""
    return _header(b"././@PaxHeader", typeflag, len(records)) + records + b"\0" * (
        -len(records) % 512)


def _gz(raw: bytes) -> bytes:
    co = zlib.compressobj(9, wbits=31)
    return co.compress(raw) + co.flush()


@pytest.fixture
def unpack():
    """unpack(blob, caps) -> None or the FilesError; the target /t stays empty when
    refused."""
    top = tempfile.mkdtemp(prefix="corral-tar-bounds-")
    os.makedirs(os.path.join(top, "t"))
    fd = os.open(top, os.O_PATH | os.O_DIRECTORY)

    def run(blob: bytes, caps: Caps | None = None):
        with Files(fd, os.getuid(), os.getgid(), caps=caps or Caps()) as files:
            try:
                files.write_archive("/t", blob)
            except FilesError as e:
                assert str(e) and "\n" not in str(e) and len(str(e)) < 1000, str(e)[:300]
                assert os.listdir(os.path.join(top, "t")) == [], "a refusal left files"
                return e
        return None

    run.top = top
    try:
        yield run
    finally:
        os.close(fd)
        shutil.rmtree(top)


def test_a_pax_header_over_the_bound_is_refused_before_it_is_read(unpack):
    big = _tar([("f", "file", b"x", {"comment": "c" * (EXTENDED_MAX + 1)})])
    e = unpack(big)
    assert e is not None and "extended header" in str(e), e
    # a global header too, and a GNU long name of the same size
    e = unpack(_tar([("f", "file", b"x", None)], pax_headers={"comment": "c" * (4 << 20)}))
    assert e is not None and "extended header" in str(e), e
    longname = _header(b"././@LongLink", b"L", EXTENDED_MAX + 1) + b"a" * (
        EXTENDED_MAX + 1) + b"\0" * (-(EXTENDED_MAX + 1) % 512)
    e = unpack(longname + _header(b"f", b"0") + b"\0" * 1024)
    assert e is not None and "extended header" in str(e), e
    # just inside: a pax header of a few KiB is an ordinary long name
    assert unpack(_tar([("f", "file", b"x", {"comment": "c" * 4000})])) is None


def test_the_extended_headers_together_are_bounded(unpack):
    """Each under the bound, all of them past the archive's share: parsing them is the
    cost, whatever the members are."""
    per = EXTENDED_MAX - 1024
    members = [(f"f{i}", "file", b"", {"comment": "c" * per}) for i in range(40)]
    e = unpack(_gz(_tar(members)), Caps(members=40))
    assert e is not None and "extended headers" in str(e), e


def test_gnu_sparse_members_are_refused(unpack):
    # the old GNU sparse type ('S'), an empty map
    e = unpack(_header(b"holes", b"S") + b"\0" * 1024)
    assert e is not None and "sparse" in str(e), e
    # a PAX 0.1 sparse map on an ordinary member
    e = unpack(_tar([("holes", "file", b"abcd", {
        "GNU.sparse.map": "0,4", "GNU.sparse.name": "holes", "GNU.sparse.realsize": "4096"})]))
    assert e is not None and "sparse" in str(e), e
    # a PAX 1.0 sparse map, read from the member's data: a count of a billion and a
    # MiB of "0\n" lines was read number by number (24 s and 490 MB for 80 MiB of them)
    # before the member could be refused; now refused before the map is read
    data = b"1000000000\n" + b"0\n" * (1 << 19)
    e = unpack(_gz(_tar([("holes", "file", data, {
        "GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "holes",
        "GNU.sparse.realsize": "1"})])))
    assert e is not None and "sparse" in str(e), e


@pytest.mark.parametrize("name,kind,extra,word", [
    ("d/" + "n" * (NAME_MAX + 1), "file", b"x", "255"),
    ("é" * 128, "file", b"x", "255"),                            # 256 bytes in UTF-8
    ("/".join(["d" * 200] * 21), "file", b"x", str(PATH_MAX)),  # 4220 bytes
    ("/".join(["d"] * 300), "dir", b"", "deep"),
    ("l", "symlink", "/".join(["d" * 200] * 21), str(PATH_MAX)),
])
def test_names_past_the_kernels_limits_are_refused_up_front(unpack, name, kind, extra,
                                                            word):
    blob = _tar([("first", "file", b"written only if all is", None), (name, kind, extra, None)])
    e = unpack(blob)
    assert e is not None and word in str(e), e


def test_names_just_inside_the_limits_are_unpacked(unpack):
    ok = [("d/" + "n" * NAME_MAX, "file", b"x", None),
          ("/".join(["e"] * 200), "dir", b"", None),
          ("s", "symlink", "d/" + "n" * NAME_MAX, None)]
    assert unpack(_tar(ok)) is None
    assert os.path.getsize(os.path.join(unpack.top, "t", "d", "n" * NAME_MAX)) == 1


def test_a_stream_of_headers_that_are_no_members_is_bounded(unpack):
    """`./` entries (the target itself, skipped) and empty pax headers are not members, but
    each is a header to parse and a TarInfo kept: a million of them compress to a few MiB.
    The header count is bounded by the member cap."""
    dot = _header(b"./", b"5")
    e = unpack(_gz(dot * 200_000 + b"\0" * 1024), Caps(members=100))
    assert e is not None and "headers" in str(e), e
    empty = _header(b"./", b"5", 0)
    e = unpack(_gz((empty + _pax(b"")) * 1_000 + b"\0" * 1024), Caps(members=100))
    assert e is not None and "headers" in str(e), e
    # a few of them are fine
    assert unpack(dot * 10 + _tar([("f", "file", b"x", None)]), Caps(members=100)) is None


def test_extended_headers_in_a_row_are_bounded(unpack):
    """tarfile reads the header after an extended one by recursion: a few thousand PAX
    headers in a row were a RecursionError (no FilesError: a server error)."""
    for kind in (b"x", b"g", b"L"):
        blob = _pax(b"", kind) * 3_000 + _header(b"f", b"0") + b"\0" * 1024
        e = unpack(_gz(blob))
        assert e is not None and "in a row" in str(e), (kind, e)
    # a GNU long name, long link and a PAX header before one member is ordinary
    name, link = b"n" * 150, b"t" * 150
    blob = (_header(b"././@LongLink", b"L", len(name) + 1) + name + b"\0" * (512 - 150)
            + _header(b"././@LongLink", b"K", len(link) + 1) + link + b"\0" * (512 - 150)
            + _pax(b"20 comment=abcdefgh\n") + _header(b"s", b"2") + b"\0" * 1024)
    assert unpack(blob) is None
    assert os.readlink(os.path.join(unpack.top, "t", "n" * 150)) == "t" * 150


def test_deep_new_directories_for_every_member_are_bounded(unpack):
    """Each member in a new directory 200 levels down: kept as every prefix of every name,
    that was memory and time quadratic in the depth, and every member makes 200
    directories. The entries the names make, implied directories counted, are bounded
    by the member cap; many members in one deep directory make few, and are unpacked."""
    deep = "/".join(["d"] * 199)
    members = [(f"m{i}/{deep}/f", "file", b"", None) for i in range(300)]
    e = unpack(_gz(_tar(members, fmt=tarfile.GNU_FORMAT)), Caps(members=300))
    assert e is not None and "entries" in str(e), e
    same = [(f"{deep}/f{i}", "file", b"", None) for i in range(300)]
    assert unpack(_gz(_tar(same, fmt=tarfile.GNU_FORMAT)), Caps(members=300)) is None
    assert len(os.listdir(os.path.join(unpack.top, "t", deep))) == 300
