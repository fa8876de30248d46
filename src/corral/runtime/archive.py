"""Tar upload into a sandbox (Files.write_archive): a check of the whole archive, then its
members made one by one through openat2 from the target directory's fd.

The archive comes from whoever calls the files API, and often from a sandbox before it (a
tarball built by code that ran there), so it is hostile: member names like `../../x` or
`/etc/x`, a symbolic link `l -> /` followed by a member `l/etc/x`, hard links to files
outside, device nodes, a decompression bomb. So:

 1. check(): the archive is read once, decompressed through a bounded reader (a bomb stops
    at the bound), and every member is checked by name alone: no absolute name, no `..`,
    only regular files, directories, symbolic links and hard links; a link's target must
    stay inside the tree (lexically: `a/b -> ../c` is fine, `a -> ../..` is not); a hard
    link must name an earlier regular member; members and bytes are counted against the
    caps. Names stay within the kernel's limits (NAME_MAX, PATH_MAX) and MAX_DEPTH, so
    none fails half way through. What parsing costs is bounded too, as tarfile reads each
    header block (_Headers): the headers of every kind, each extended header's size and
    all of theirs, extended headers in a row (tarfile recurses through them); a GNU
    sparse member is refused. Any failure refuses the archive before anything is written.
 2. extract(): every member's parent is opened from the target's fd with
    RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, so a link in the tree (made by an earlier
    member, or there before) that leads out fails with EXDEV instead of being followed (a
    real directory on the way is entered from its parent's fd, no link allowed); the
    member itself is made with the *at() calls (a regular file through Files._write_at: a
    temporary file renamed over the name), never following its last component.

tarfile is the standard library's parser; it runs here only on the bounded, decompressed
stream, in its sequential ("r|") mode.
"""

from __future__ import annotations

import errno
import lzma
import os
import posixpath
import stat
import tarfile
import zlib

from .._record import Record
from ..linux.openat2 import (
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    openat2,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .files import Files

#: header, padding and extended (pax, GNU long name) blocks allowed per member beyond the
#: data the members declare, in the decompressed stream
OVERHEAD_PER_MEMBER = 4096
#: one extended header (a PAX header, local or global, or a GNU long name or link): its
#: declared size, checked before tarfile reads it (a name and a link target fit in 8 KiB)
EXTENDED_MAX = 64 << 10
#: all extended headers of one archive together, in bytes: a base, and this much per
#: member the caps allow (parsing PAX records is what they cost: about 0.15 s a MiB)
EXTENDED_BASE, EXTENDED_PER_MEMBER = 1 << 20, 512
#: headers of one archive, of every kind (members, extended headers, `./` entries): per
#: member the caps allow (its own, a PAX header, a GNU long name and long link), and a few
#: more; tarfile keeps a record of each, and a million compress to a few MiB
HEADERS_PER_MEMBER, HEADERS_EXTRA = 4, 16
#: the kernel's limits on a name (a component, in bytes) and a path (with its NUL): a
#: member past them would fail half way through extract() with the members before it made
NAME_MAX, PATH_MAX = 255, 4096
#: entries the members' names make, directories they imply included: a base, and this
#: many per member the caps allow (check() keeps each, extract() makes each; a member
#: 200 levels down in a new directory makes 200)
ENTRIES_BASE, ENTRIES_PER_MEMBER = 1024, 32
#: extended headers before the header they extend: a global and a local PAX header, a
#: GNU long name and long link make 4 (tarfile reads each one's next by recursion)
EXTENDED_IN_A_ROW = 8
#: tar types that only carry another header's data
_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
             tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_DIR = os.O_PATH | os.O_DIRECTORY
#: what a damaged stream raises, from tarfile and from each decompressor (gzip's inflate
#: raises zlib.error and xz's LZMAError, neither an OSError: tests/fuzz found them)
_DAMAGED = (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError)


class Member(Record):
    """One checked member: its name as components, what it is, and for a link its target
    (a symbolic link's text; a hard link's member, as components)."""

    parts: tuple
    kind: str          # "file" | "dir" | "symlink" | "hardlink"
    size: int
    mode: int
    target: object = None


class _Bounded:
    """A read-only stream that fails once more than `limit` bytes were read from it."""

    def __init__(self, raw, limit: int, p: str) -> None:
        self.raw, self.left, self.p = raw, limit, p

    def read(self, n: int = -1) -> bytes:
        want = self.left + 1 if n is None or n < 0 else min(n, self.left + 1)
        data = self.raw.read(want)
        self.left -= len(data)
        if self.left < 0:
            from .files import FilesError

            raise FilesError("the archive decompresses to more than its members' caps "
                             "allow: nothing written", path=self.p)
        return data


def _stream(blob: bytes, limit: int, p: str):
    """The archive's decompressed bytes as a bounded stream (gzip, bzip2, xz or plain,
    known by their magic numbers)."""
    import io

    raw = io.BytesIO(blob)
    if blob[:2] == b"\x1f\x8b":
        import gzip

        raw = gzip.GzipFile(fileobj=raw, mode="rb")
    elif blob[:3] == b"BZh":
        import bz2

        raw = bz2.BZ2File(raw, "rb")
    elif blob[:6] == b"\xfd7zXZ\x00":
        import lzma

        raw = lzma.LZMAFile(raw, "rb")  # noqa: SIM115 - closed with the BytesIO
    return _Bounded(raw, limit, p)


def _show(name: str) -> str:
    """A member's name for a message: quoted, and cut short past 80 characters."""
    return repr(name) if len(name) <= 80 else repr(name[:80]) + "..."


class _Headers:
    """What one pass over an archive may parse: a count of headers and a budget of
    extended-header bytes, charged as tarfile reads each header block (before it reads
    the data an extended header declares); FilesError past either, and for a GNU sparse
    member (its map is a second layout of the data, and the file it makes is not the
    bytes the archive holds)."""

    def __init__(self, max_members: int, p: str) -> None:
        self.headers = HEADERS_PER_MEMBER * max_members + HEADERS_EXTRA
        self.extended = EXTENDED_BASE + EXTENDED_PER_MEMBER * max_members
        self.max_members, self.p = max_members, p
        self.row = 0            # extended headers since the last other one

    def charge(self, info: tarfile.TarInfo) -> None:
        from .files import FilesError

        self.headers -= 1
        if self.headers < 0:
            raise FilesError(f"the archive has more than {HEADERS_PER_MEMBER} headers a "
                             f"member ({self.max_members} members allowed), counting "
                             "extended headers and './' entries: nothing written", path=self.p)
        if info.type == tarfile.GNUTYPE_SPARSE:
            raise FilesError(f"member {_show(info.name)} is a GNU sparse file: refused "
                             "(write it without --sparse), nothing written", path=self.p)
        if info.type not in _EXTENDED:
            self.row = 0
            return
        self.row += 1
        if self.row > EXTENDED_IN_A_ROW:
            raise FilesError(f"more than {EXTENDED_IN_A_ROW} extended headers in a row (tar "
                             "reads each with the next): refused, nothing written",
                             path=self.p)
        if info.size > EXTENDED_MAX:
            raise FilesError(f"an extended header (tar type {info.type.decode()!r}) of "
                             f"{info.size} bytes, over {EXTENDED_MAX}: refused, nothing "
                             "written", path=self.p)
        self.extended -= info.size
        if self.extended < 0:
            raise FilesError("the archive's extended headers come to more than "
                             f"{EXTENDED_BASE + EXTENDED_PER_MEMBER * self.max_members} "
                             "bytes: nothing written", path=self.p)


def _header_class(budget: _Headers) -> type:
    class Charged(tarfile.TarInfo):
        """tarfile's TarInfo, every header block it parses charged to `budget` (frombuf
        is where tarfile makes one from its 512 bytes, an extended header's included)."""

        @classmethod
        def frombuf(cls, buf, encoding, errors):
            info = super().frombuf(buf, encoding, errors)
            budget.charge(info)
            return info

        def _sparse(self, nxt, *rest):
            """tarfile's readers of a PAX header's GNU sparse map (formats 0.0, 0.1 and
            1.0), refused before they run: 1.0 reads the map from the member's data, as
            many numbers as its first line says (an 80 KB gzip of "0\n" lines took 24 s
            and 490 MB before the member could be refused)."""
            from .files import FilesError

            raise FilesError(f"member {_show(nxt.name)} is a GNU sparse file: refused "
                             "(write it without --sparse), nothing written", path=budget.p)

        _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _sparse

    return Charged


def _open(blob: bytes, limit: int, p: str, max_members: int) -> tarfile.TarFile:
    from .files import FilesError

    try:
        return tarfile.open(fileobj=_stream(blob, limit, p), mode="r|", errorlevel=2,
                            tarinfo=_header_class(_Headers(max_members, p)))
    except _DAMAGED as e:
        if isinstance(e, FilesError):
            raise
        raise FilesError(f"not a tar archive ({e})", path=p) from None


def _parts(name: str, what: str, p: str) -> tuple[str, ...]:
    from .files import MAX_DEPTH, FilesError

    if name.startswith("/"):
        raise FilesError(f"{what} {_show(name)} is an absolute path: refused, nothing "
                         "written", path=p)
    if len(_bytes(name)) >= PATH_MAX:
        raise FilesError(f"{what} {_show(name)} is {len(_bytes(name))} bytes long, over "
                         f"PATH_MAX ({PATH_MAX}): refused, nothing written", path=p)
    parts = tuple(c for c in name.split("/") if c not in ("", "."))
    if ".." in parts:
        raise FilesError(f"{what} {_show(name)} has a '..' in it: refused, nothing written",
                         path=p)
    if "\0" in name:
        raise FilesError(f"{what} {_show(name)} has a NUL byte: refused", path=p)
    if len(parts) > MAX_DEPTH:
        raise FilesError(f"{what} {_show(name)} is {len(parts)} directories deep, over "
                         f"{MAX_DEPTH}: refused, nothing written", path=p)
    long = next((c for c in parts if len(_bytes(c)) > NAME_MAX), None)
    if long is not None:
        raise FilesError(f"{what} {_show(name)} has a name of {len(_bytes(long))} bytes, "
                         f"over NAME_MAX ({NAME_MAX}): refused, nothing written", path=p)
    return parts


def _bytes(name: str) -> bytes:
    """A name as the kernel gets it (tarfile decodes UTF-8 with surrogateescape)."""
    return name.encode("utf-8", "surrogateescape")


class _Node:
    """One path of the archive's tree, as its members make it: a directory (named or
    implied by a member below it), a regular file, or a link; `kids` by name. A tree, not
    a set of prefixes: a member 200 levels down adds what is new of its path, once."""

    __slots__ = ("kind", "kids")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.kids: dict[str, _Node] = {}


def check(blob: bytes, max_members: int, max_bytes: int, p: str) -> list[Member]:
    """Every member of the archive, checked (see the module's docstring); FilesError for
    the first that is refused."""
    from .files import FilesError

    limit = max_bytes + max_members * OVERHEAD_PER_MEMBER + (1 << 20)
    members: list[Member] = []
    root = _Node("dir")
    entries = [ENTRIES_BASE + ENTRIES_PER_MEMBER * max_members]   # what _place may add
    total = 0
    tf = _open(blob, limit, p, max_members)
    try:
        while True:
            try:
                m = tf.next()
            except _DAMAGED as e:
                raise FilesError(f"a damaged tar archive ({e}): nothing written",
                                 path=p) from None
            if m is None:
                break
            if len(members) >= max_members:
                raise FilesError(f"the archive has more than {max_members} members: "
                                 "nothing written", path=p)
            if m.sparse is not None or any(k.startswith("GNU.sparse.") for k in
                                           m.pax_headers):
                raise FilesError(f"member {_show(m.name)} is a GNU sparse file: refused "
                                 "(write it without --sparse), nothing written", path=p)
            parts = _parts(m.name, "member", p)
            if m.isreg():
                kind, target = "file", None
                total += m.size
                if total > max_bytes:
                    raise FilesError(f"the archive's files come to more than the write "
                                     f"cap of {max_bytes} bytes: nothing written", path=p)
            elif m.isdir():
                kind, target = "dir", None
            elif m.issym():
                kind, target = "symlink", m.linkname
                if not target or target.startswith("/") or "\0" in target:
                    raise FilesError(f"member {_show(m.name)} is a link to {_show(target)}, "
                                     "outside the archive's tree: refused, nothing written",
                                     path=p)
                if len(_bytes(target)) >= PATH_MAX:
                    raise FilesError(f"member {_show(m.name)} is a link to a path of "
                                     f"{len(_bytes(target))} bytes, over PATH_MAX "
                                     f"({PATH_MAX}): refused, nothing written", path=p)
                depth = len(parts) - 1    # where the link sits
                for c in target.split("/"):
                    if c == "..":
                        depth -= 1
                    elif c not in ("", "."):
                        depth += 1
                    if depth < 0:
                        raise FilesError(f"member {_show(m.name)} is a link to "
                                         f"{_show(target)}, which leaves the archive's "
                                         "tree: refused, nothing written", path=p)
            elif m.islnk():
                kind = "hardlink"
                target = _parts(m.linkname, "hard link target", p)
                earlier = _find(root, target)
                if earlier is None or earlier.kind != "file":
                    raise FilesError(f"member {_show(m.name)} is a hard link to "
                                     f"{_show(m.linkname)}, which is no earlier file of the "
                                     "archive: refused, nothing written", path=p)
            else:
                what = ("a device node" if m.ischr() or m.isblk() else
                        "a FIFO" if m.isfifo() else f"of tar type {m.type!r}")
                raise FilesError(f"member {_show(m.name)} is {what}: refused (only files, "
                                 "directories and links are unpacked), nothing written",
                                 path=p)
            if not parts:
                if kind != "dir":
                    raise FilesError(f"member {_show(m.name)} names no entry: refused",
                                     path=p)
                continue   # "./": the target directory itself
            _place(root, parts, kind, m.name, p, entries)
            members.append(Member(parts, kind, m.size, stat.S_IMODE(m.mode) & 0o1777,
                                  target))
    finally:
        tf.close()
    _check_link_chains(members, root, p)
    return members


def _find(root: _Node, parts: tuple) -> _Node | None:
    node = root
    for c in parts:
        node = node.kids.get(c)
        if node is None:
            return None
    return node


def _place(root: _Node, parts: tuple, kind: str, name: str, p: str, left: list) -> None:
    """Put a member in the tree: one kind per path. A member below a file or link of the
    archive, or a directory where it made a file (or the other way round) would fail half
    way through extract() with the members before it written (tests/fuzz found it).
    left[0]: the entries the tree may still grow by."""
    from .files import FilesError

    def new(k: str) -> _Node:
        left[0] -= 1
        if left[0] < 0:
            raise FilesError(f"the archive's names make more than {ENTRIES_BASE} entries "
                             f"and {ENTRIES_PER_MEMBER} a member allowed (directories they "
                             "imply counted): nothing written", path=p)
        return _Node(k)

    def clash(at: tuple) -> FilesError:
        return FilesError(f"member {_show(name)} clashes with an earlier member at "
                          f"{_show('/'.join(at))} (a file or link there, and a directory): "
                          "refused, nothing written", path=p)

    node = root
    for i, c in enumerate(parts[:-1]):
        kid = node.kids.get(c)
        if kid is None:
            kid = node.kids[c] = new("dir")     # implied by the member below it
        elif kid.kind != "dir":
            raise clash(parts[:i + 1])
        node = kid
    kid = node.kids.get(parts[-1])
    if kid is not None and (kid.kind == "dir") != (kind == "dir"):
        raise clash(parts)
    if kid is None:
        node.kids[parts[-1]] = new(kind)
    elif kind != "dir":
        kid.kind = kind         # a later file or link takes the name over


def _check_link_chains(members: list[Member], root: _Node, p: str) -> None:
    """A symbolic link whose target steps up (`..`) after passing through another link of
    the archive is refused: `d/s -> .` with `t -> d/s/../..` stays inside by the lexical
    count, but resolves above the tree (tests/fuzz found it), whichever comes first. The
    walk follows the tree's nodes, one step a component."""
    from .files import FilesError

    if sum(m.kind == "symlink" for m in members) < 2:
        return
    for m in members:
        if m.kind != "symlink":
            continue
        path: list[_Node | None] = [root]
        for c in m.parts[:-1]:
            path.append(path[-1].kids.get(c))
        through = False
        for c in m.target.split("/"):
            if c == "..":
                if through:
                    raise FilesError(f"member {_show('/'.join(m.parts))} is a link to "
                                     f"{_show(m.target)}, which steps out of another link "
                                     "of the archive: refused, nothing written", path=p)
                path.pop()
            elif c not in ("", "."):
                here = path[-1]
                node = here.kids.get(c) if here is not None else None
                path.append(node)
                through = through or (node is not None and node.kind == "symlink")


def extract(files: Files, dfd: int, blob: bytes, members: list[Member], p: str,
            max_members: int) -> None:
    """Make the checked members under the directory dfd (the caller maps OSError);
    max_members: check()'s, for the same bounds on the same bytes."""
    limit = (sum(m.size for m in members) + (len(members) + 1) * OVERHEAD_PER_MEMBER
             + (1 << 20))
    tf = _open(blob, limit, p, max_members)
    want = iter(members)
    try:
        with files._ids():
            for m in tf:
                parts = _parts(m.name, "member", p)
                if not parts:
                    continue
                member = next(want)
                if member.parts != parts:   # the same bytes, parsed again: never differs
                    raise AssertionError("the archive changed between its check and its use")
                _make(files, dfd, member, tf, m, p)
    finally:
        tf.close()


def _parent(dfd: int, parts: tuple) -> int:
    """An O_PATH fd of parts' directory beneath dfd, missing directories made. A link on
    the way may lead anywhere beneath dfd, never out: the whole path is resolved from dfd
    itself (one call, when the directory is there: every member after the first in it),
    and so is each prefix whose last component is a link. A real directory is entered
    from its parent's fd with no link allowed, so a deep path costs one step a component,
    not the walk of every prefix from the top."""
    if not parts:
        return os.dup(dfd)
    try:
        return openat2(dfd, "/".join(parts), _DIR, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    except FileNotFoundError:
        pass
    fd = os.dup(dfd)
    try:
        for i, c in enumerate(parts):
            try:
                os.mkdir(c, 0o755, dir_fd=fd)
            except FileExistsError:
                pass   # there already (a directory, or a link the open below resolves)
            try:
                sub = openat2(fd, c, _DIR, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                sub = openat2(dfd, "/".join(parts[:i + 1]), _DIR,
                              RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def _make(files: Files, dfd: int, member: Member, tf, m, p: str) -> None:
    name = member.parts[-1]
    pfd = _parent(dfd, member.parts[:-1])
    where = posixpath.join(p, *member.parts)
    try:
        if member.kind == "dir":
            try:
                os.mkdir(name, 0o755, dir_fd=pfd)
            except FileExistsError:
                pass
            sub = openat2(pfd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                          RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
            try:
                os.fchmod(sub, member.mode | 0o700)   # the user can still enter it
            finally:
                os.close(sub)
        elif member.kind == "file":
            files._write_at(pfd, name, tf.extractfile(m), where, mode=member.mode,
                            cap=member.size)
        else:
            _clear(pfd, name)
            if member.kind == "symlink":
                os.symlink(member.target, name, dir_fd=pfd)
            else:
                spfd = _parent(dfd, member.target[:-1])
                try:
                    os.link(member.target[-1], name, src_dir_fd=spfd, dst_dir_fd=pfd,
                            follow_symlinks=False)
                finally:
                    os.close(spfd)
    finally:
        os.close(pfd)


def _clear(pfd: int, name: str) -> None:
    """Make room for a link: an entry of that name that is not a directory goes."""
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=pfd)
