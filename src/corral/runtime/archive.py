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
    caps. Any failure refuses the archive before anything is written.
 2. extract(): every member's parent is opened from the target's fd with
    RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, so a link in the tree (made by an earlier
    member, or there before) that leads out fails with EXDEV instead of being followed; the
    member itself is made with the *at() calls (a regular file through Files._write_at: a
    temporary file renamed over the name), never following its last component.

tarfile is the standard library's parser; it runs here only on the bounded, decompressed
stream, in its sequential ("r|") mode.
"""

from __future__ import annotations

import lzma
import os
import posixpath
import stat
import tarfile
import zlib

from .._record import Record
from ..linux.openat2 import RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, openat2

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .files import Files

#: header, padding and extended (pax, GNU long name) blocks allowed per member beyond the
#: data the members declare, in the decompressed stream
OVERHEAD_PER_MEMBER = 4096
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


def _open(blob: bytes, limit: int, p: str) -> tarfile.TarFile:
    from .files import FilesError

    try:
        return tarfile.open(fileobj=_stream(blob, limit, p), mode="r|",
                            errorlevel=2)
    except _DAMAGED as e:
        if isinstance(e, FilesError):
            raise
        raise FilesError(f"not a tar archive ({e})", path=p) from None


def _parts(name: str, what: str, p: str) -> tuple[str, ...]:
    from .files import FilesError

    if name.startswith("/"):
        raise FilesError(f"{what} {name!r} is an absolute path: refused, nothing written",
                         path=p)
    parts = tuple(c for c in name.split("/") if c not in ("", "."))
    if ".." in parts:
        raise FilesError(f"{what} {name!r} has a '..' in it: refused, nothing written",
                         path=p)
    if "\0" in name:
        raise FilesError(f"{what} {name!r} has a NUL byte: refused", path=p)
    return parts


def check(blob: bytes, max_members: int, max_bytes: int, p: str) -> list[Member]:
    """Every member of the archive, checked (see the module's docstring); FilesError for
    the first that is refused."""
    from .files import FilesError

    limit = max_bytes + max_members * OVERHEAD_PER_MEMBER + (1 << 20)
    members: list[Member] = []
    files: set[tuple] = set()
    dirs: set[tuple] = {()}        # directories the members make, named or implied
    others: set[tuple] = set()     # what is not a directory: files and links
    total = 0
    tf = _open(blob, limit, p)
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
            parts = _parts(m.name, "member", p)
            if m.isreg():
                kind, target = "file", None
                total += m.size
                if total > max_bytes:
                    raise FilesError(f"the archive's files come to more than the write "
                                     f"cap of {max_bytes} bytes: nothing written", path=p)
                files.add(parts)
            elif m.isdir():
                kind, target = "dir", None
            elif m.issym():
                kind, target = "symlink", m.linkname
                if not target or target.startswith("/") or "\0" in target:
                    raise FilesError(f"member {m.name!r} is a link to {target!r}, outside "
                                     "the archive's tree: refused, nothing written", path=p)
                depth = len(parts) - 1    # where the link sits
                for c in target.split("/"):
                    if c == "..":
                        depth -= 1
                    elif c not in ("", "."):
                        depth += 1
                    if depth < 0:
                        raise FilesError(f"member {m.name!r} is a link to {target!r}, "
                                         "which leaves the archive's tree: refused, "
                                         "nothing written", path=p)
            elif m.islnk():
                kind = "hardlink"
                target = _parts(m.linkname, "hard link target", p)
                if target not in files:
                    raise FilesError(f"member {m.name!r} is a hard link to {m.linkname!r}, "
                                     "which is no earlier file of the archive: refused, "
                                     "nothing written", path=p)
            else:
                what = ("a device node" if m.ischr() or m.isblk() else
                        "a FIFO" if m.isfifo() else f"of tar type {m.type!r}")
                raise FilesError(f"member {m.name!r} is {what}: refused (only files, "
                                 "directories and links are unpacked), nothing written",
                                 path=p)
            if not parts:
                if kind != "dir":
                    raise FilesError(f"member {m.name!r} names no entry: refused", path=p)
                continue   # "./": the target directory itself
            # one kind per path: a member below a file or link of the archive, or a
            # directory where it made a file (or the other way round) would fail half way
            # through extract() with the members before it written (tests/fuzz found it)
            under = next((parts[:i] for i in range(1, len(parts)) if parts[:i] in others),
                         None)
            if under is not None or (parts in others if kind == "dir" else parts in dirs):
                clash = "/".join(under if under is not None else parts)
                raise FilesError(f"member {m.name!r} clashes with an earlier member at "
                                 f"{clash!r} (a file or link there, and a directory): "
                                 "refused, nothing written", path=p)
            if kind == "dir":
                dirs.add(parts)
            else:
                others.add(parts)
            dirs.update(parts[:i] for i in range(1, len(parts)))
            members.append(Member(parts, kind, m.size, stat.S_IMODE(m.mode) & 0o1777,
                                  target))
    finally:
        tf.close()
    _check_link_chains(members, p)
    return members


def _check_link_chains(members: list[Member], p: str) -> None:
    """A symbolic link whose target steps up (`..`) after passing through another link of
    the archive is refused: `d/s -> .` with `t -> d/s/../..` stays inside by the lexical
    count, but resolves above the tree (tests/fuzz found it), whichever comes first."""
    from .files import FilesError

    links = {m.parts for m in members if m.kind == "symlink"}
    if len(links) < 2:
        return
    for m in members:
        if m.kind != "symlink":
            continue
        cur = list(m.parts[:-1])
        through = False
        for c in m.target.split("/"):
            if c == "..":
                if through:
                    raise FilesError(f"member {'/'.join(m.parts)!r} is a link to "
                                     f"{m.target!r}, which steps out of another link of the "
                                     "archive: refused, nothing written", path=p)
                cur.pop()
            elif c not in ("", "."):
                cur.append(c)
                through = through or tuple(cur) in links


def extract(files: Files, dfd: int, blob: bytes, members: list[Member], p: str) -> None:
    """Make the checked members under the directory dfd (the caller maps OSError)."""
    limit = (sum(m.size for m in members) + (len(members) + 1) * OVERHEAD_PER_MEMBER
             + (1 << 20))
    tf = _open(blob, limit, p)
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
    """An O_PATH fd of parts' directory beneath dfd, missing directories made. Each prefix
    is resolved from dfd itself, so a link may lead anywhere beneath dfd, never out."""
    fd = os.dup(dfd)
    try:
        for i, c in enumerate(parts):
            try:
                os.mkdir(c, 0o755, dir_fd=fd)
            except FileExistsError:
                pass   # there already (a directory, or a link the open below resolves)
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
