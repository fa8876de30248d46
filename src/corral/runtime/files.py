"""A sandbox's files, from the host side (`sb.files`): read, write, list, info, remove,
rename, make_dir, watch, and tar upload, on the sandbox's own view of its filesystem.

    files.write("/scratch/data.csv", b"a,b\n1,2\n")     # parents made, atomic
    files.read("/scratch/plot.png", format="bytes")      # binary-safe
    files.list("/scratch", depth=2)

Everything the sandbox made is hostile: its names, its symbolic links, its FIFOs. So no
path is ever joined to a host path string. The sandbox's tree is held as a directory fd
(`root`: for the namespace tier, /proc/PID/root of its init, opened after the pid was
checked through a pidfd) and every path is resolved from it with openat2(2)
RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS: `..` stops at the sandbox's root, a link to
`/etc/shadow` means the sandbox's /etc/shadow, and /proc/PID/fd-style links are refused.
Where a tier's view is not one tree the host can open (gVisor keeps its root in its own
kernel), the view is a table of the host directories behind its writable mounts, each
resolved with RESOLVE_BENEATH instead: a link leaving one of them is refused (EXDEV).

The last component of a path that is acted on (removed, renamed, replaced) is never
followed: the call works on its parent's fd with the *at() calls and AT_SYMLINK_NOFOLLOW.
A read follows links inside the tree (as `cat` in the sandbox would) but opens only a
regular file: the target is opened O_PATH first (no device or FIFO is ever opened),
checked with fstat, then reopened for reading through /proc/self/fd. Files of the kernel's
interfaces (a sandbox's /proc, /sys, /dev/pts: KERNEL_FS) are refused.

Every call runs with the sandbox's user as its file system ids (linux.openat2.fs_ids): the
sandbox's permissions apply, and what is made is owned by the sandbox's user. Sizes are
capped (Caps): reads and writes in bytes, list entries, archive members. A write goes to
a temporary file in the same directory, then renameat() over the name: a reader inside
sees the old file or the new one, never half of one; a write refused for its size leaves
nothing behind.
"""

from __future__ import annotations

import os
import posixpath
import stat

from .._record import Record
from ..errors import CorralError
from ..linux.openat2 import (
    KERNEL_FS,
    RESOLVE_BENEATH,
    RESOLVE_IN_ROOT,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    RESOLVE_NO_XDEV,
    fs_ids,
    fs_type,
    openat2,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Self

    from .watch import Watcher




#: bytes moved per read()/write() system call
CHUNK = 1 << 20


#: how deep list(), remove() and an archive's members may go
MAX_DEPTH = 256


#: the names written for an atomic write, in the target's directory
TEMP_PREFIX = ".corral-write-"


#: what a path that is acted on may not end in
NOT_A_NAME = ("", ".", "..")


PATH_MAX = 4096


_DIR = os.O_PATH | os.O_DIRECTORY


class Caps(Record):
    """The bounds of one files API. read/write: bytes one call moves (a read of a bigger
    file is refused before any is read; a write past it leaves nothing). entries: what one
    list() returns. members: what one archive holds."""

    read: int = 100 << 20
    write: int = 100 << 20
    entries: int = 10_000
    members: int = 10_000


class FilesError(CorralError):
    """A files API call failed: one line naming the path and why. `errno` when the kernel
    said so. Nothing was changed unless the message says what was."""

    kind = "files"
    exit_code = 1

    def __init__(self, message: str, *, path: str, errno: int | None = None) -> None:
        super().__init__(message, field=path)
        self.path = path
        self.errno = errno


class FileNotFound(FilesError, FileNotFoundError):
    """The path names nothing in the sandbox."""


class EntryInfo(Record):
    """One entry as the sandbox sees it. type: "file", "dir", "symlink", "fifo", "socket",
    "char_device", "block_device". mode: the permission bits (st_mode & 0o7777). mtime:
    seconds since the epoch. symlink_target: what a link says, as text, never followed."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: float
    symlink_target: str | None = None


class WriteInfo(Record):
    name: str
    path: str
    type: str = "file"


def entry_type(mode: int) -> str:
    """An EntryInfo's type for a file of st_mode `mode` (runtime/changes.py's kinds too)."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "char_device"
    return "block_device"


# -- the two kinds of view ----------------------------------------------------------------
class _InRoot:
    """The sandbox's whole tree as one fd: its root."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        return openat2(self.fd, path, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS, mode)

    def check_writable(self, path: str) -> None:
        pass   # the sandbox's own mounts say (EROFS)

    def close(self) -> None:
        os.close(self.fd)

    def where(self) -> str:
        return "the sandbox"


class _Mounts:
    """Host directories behind the sandbox's mounts, by where they are mounted inside, and
    whether the sandbox may write there."""

    def __init__(self, table: list[tuple[str, int, bool]]) -> None:
        # the longest mount point first: /scratch/ws before /scratch
        self.table = sorted(table, key=lambda m: -len(m[0]))

    def _find(self, path: str) -> tuple[str, int, bool, str]:
        for dest, fd, writable in self.table:
            if path == dest or path.startswith(dest.rstrip("/") + "/"):
                return dest, fd, writable, path[len(dest):].lstrip("/") or "."
        raise FilesError(f"is not under one of the sandbox's mounts this tier reaches "
                         f"from the host ({', '.join(self.points())})", path=path)

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        _, fd, _, rest = self._find(path)
        return openat2(fd, rest, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, mode)

    def check_writable(self, path: str) -> None:
        if not self._find(path)[2]:
            raise OSError(30, "read-only", path)   # EROFS, as the sandbox would get

    def points(self) -> list[str]:
        return sorted(d for d, _, _ in self.table)

    def close(self) -> None:
        for _, fd, _ in self.table:
            os.close(fd)

    def where(self) -> str:
        return "its mount"


class Files:
    """The files of one sandbox. `root_fd`: a directory fd of the sandbox's root as the
    sandbox sees it (duplicated: the caller keeps its own). uid, gid: the sandbox user's
    host ids, the file system ids of every call. `cwd`: what a relative path is relative
    to. Use `over_mounts` for a view made of mounts."""

    def __init__(self, root_fd: int, uid: int, gid: int, *, cwd: str = "/",
                 caps: Caps | None = None) -> None:
        self._init(_InRoot(os.dup(root_fd)), uid, gid, cwd, caps)

    @classmethod
    def over_mounts(cls, mounts: Iterable[tuple[str, int, bool]], uid: int, gid: int, *,
                    cwd: str = "/", caps: Caps | None = None) -> Files:
        """A view made of (mount point inside, host directory fd, writable) triples (fds
        duplicated). Paths outside every mount point are refused, and so is a link leaving
        its mount; writes where `writable` is False get EROFS, as inside."""
        self = cls.__new__(cls)
        self._init(_Mounts([(posixpath.normpath(d), os.dup(fd), bool(w))
                            for d, fd, w in mounts]), uid, gid, cwd, caps)
        return self

    def _init(self, root, uid: int, gid: int, cwd: str, caps: Caps | None) -> None:
        self._root = root
        self.uid, self.gid = uid, gid
        self.cwd = cwd
        self.caps = caps or Caps()

    def close(self) -> None:
        root, self._root = self._root, None
        if root is not None:
            root.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ids(self) -> fs_ids:
        return fs_ids(self.uid, self.gid)

    # -- paths ---------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        """The caller's path made absolute and normalised lexically (`a/../b` is `b`: the
        caller's `..`, not a link's, which the kernel resolves inside the root)."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise TypeError("a path is a str")
        if not path or "\0" in path or len(path) > PATH_MAX:
            raise FilesError("a path is a non-empty string without NUL bytes, at most "
                             f"{PATH_MAX} characters", path=repr(path)[:80])
        if self._root is None:
            raise FilesError("this files API is closed (its sandbox was closed)", path=path)
        p = posixpath.normpath(posixpath.join(self.cwd, path))
        return "/" + p.lstrip("/")   # normpath keeps a leading "//"

    def _split(self, p: str) -> tuple[str, str]:
        parent, name = posixpath.split(p)
        if name in NOT_A_NAME:
            raise FilesError("names no entry (the sandbox's root itself)", path=p)
        return parent, name

    def _open(self, p: str, flags: int, mode: int = 0) -> int:
        return self._root.open(p, flags, mode)

    def _dir(self, p: str, *, create: bool = False) -> tuple[int, bool]:
        """An O_PATH fd of the directory p (and whether any of it was made). With create,
        the missing components are made, each mkdirat() in the fd of the one before, owned
        by the sandbox's user (the caller holds fs_ids)."""
        try:
            return self._open(p, _DIR), False
        except FileNotFoundError:
            if not create:
                raise
        parts = [c for c in p.split("/") if c]
        have = len(parts) - 1     # the deepest existing ancestor, found walking up
        fd = -1
        while have >= 0:
            try:
                fd = self._open("/" + "/".join(parts[:have]), _DIR)
                break
            except FileNotFoundError:
                have -= 1
        if fd < 0:
            raise FileNotFoundError(2, "no existing ancestor", p)
        try:
            for i in range(have, len(parts)):
                made = True
                try:
                    os.mkdir(parts[i], 0o755, dir_fd=fd)
                except FileExistsError:
                    made = False   # made meanwhile, or a link: the open below says which
                sub = self._open("/" + "/".join(parts[:i + 1]),
                                 os.O_RDONLY | os.O_DIRECTORY if made else _DIR)
                try:
                    if made:
                        os.fchmod(sub, 0o755)   # whatever this process's umask
                finally:
                    os.close(fd)
                fd = sub
            return fd, True
        except BaseException:
            os.close(fd)
            raise

    def _check_fs(self, fd: int, p: str) -> None:
        kind = KERNEL_FS.get(fs_type(fd))
        if kind is not None:
            raise FilesError(f"is on the sandbox's {kind}, a kernel interface, not files: "
                             "refused", path=p)

    def _fail(self, e: OSError, p: str, doing: str) -> FilesError:
        """The one-line error for an OSError of a call on p."""
        n = e.errno
        why = {
            2: "no such file or directory in the sandbox",
            13: "permission denied to the sandbox's user",
            1: "not permitted to the sandbox's user",
            18: f"a symbolic link or mount on the way leads out of {self._root.where()}: "
                "refused",
            40: "too many symbolic links on the way, or a /proc magic link: refused",
            30: "is on the sandbox's read-only root; write under /scratch, /tmp or a "
                "writable workspace",
            28: "the sandbox's scratch is full (limits.scratch)",
            122: "the sandbox's disk quota is full",
            20: "a component on the way is not a directory",
            21: "is a directory",
            39: "is a directory that is not empty",
            17: "exists already",
            16: "is in use (a mount point): left as it is",
            36: "a name in it is too long",
        }.get(n, e.strerror or str(e))
        if n == 18 and doing == "rename":
            why = "renames only within one mount of the sandbox"
        cls = FileNotFound if n == 2 else FilesError
        return cls(f"{doing}: {why}", path=p, errno=n)

    # -- read ----------------------------------------------------------------------------
    def read(self, path: str, format: str = "text"):
        """The file's content: "text" (UTF-8, undecodable bytes replaced: read binary files
        as "bytes"), "bytes", or "stream" (an iterator of byte chunks, for big files; the
        file is opened now, read as you iterate). Links are followed inside the sandbox's
        tree; only a regular file is read. Refused past caps.read."""
        if format not in ("text", "bytes", "stream"):
            raise FilesError(f'format {format!r} is not "text", "bytes" or "stream"',
                             path=str(path))
        p = self._abs(path)
        fd = self._open_regular(p)
        if format == "stream":
            return self._stream(fd, p)
        try:
            data = self._read_all(fd, p)
        finally:
            os.close(fd)
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    def _open_regular(self, p: str) -> int:
        try:
            with self._ids():
                held = self._open(p, os.O_PATH)
                try:
                    st = os.fstat(held)
                    if not stat.S_ISREG(st.st_mode):
                        raise FilesError(f"is a {entry_type(st.st_mode)}, not a regular file: "
                                         "only regular files are read", path=p)
                    self._check_fs(held, p)
                    if st.st_size > self.caps.read:
                        raise FilesError(f"is {st.st_size} bytes, over the read cap of "
                                         f"{self.caps.read}", path=p)
                    # the inode held above, reopened for reading (its permissions checked
                    # as the sandbox's user): no name is looked up again
                    return os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_CLOEXEC)
                finally:
                    os.close(held)
        except OSError as e:
            raise self._fail(e, p, "read") from None

    def _read_all(self, fd: int, p: str) -> bytes:
        cap = self.caps.read
        size = os.fstat(fd).st_size
        data = os.read(fd, min(size, cap) + 1)   # one past: a file that grew is noticed
        if not data:
            return data
        chunks = [data]
        total = len(data)
        while total <= cap:
            more = os.read(fd, min(CHUNK, cap + 1 - total))
            if not more:
                return data if len(chunks) == 1 else b"".join(chunks)
            chunks.append(more)
            total += len(more)
        raise FilesError(f"grew past the read cap of {cap} bytes while being read", path=p)

    def _stream(self, fd: int, p: str) -> Iterator[bytes]:
        try:
            total = 0
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    return
                total += len(chunk)
                if total > self.caps.read:
                    raise FilesError(f"grew past the read cap of {self.caps.read} bytes "
                                     "while being read", path=p)
                yield chunk
        finally:
            os.close(fd)

    # -- write ---------------------------------------------------------------------------
    def write(self, path: str, data, *, extract: bool = False) -> WriteInfo:
        """Write data (str: UTF-8; bytes-like; or a readable file object, binary or text)
        to path, making missing parent directories. Atomic (a temporary file, then
        renameat over the name; a link at the name is replaced, never followed). The
        file keeps the mode of the one it replaces (set-id bits dropped), else 0644.
        Refused past caps.write, leaving nothing. extract=True: data is a tar archive to
        unpack into the directory path (write_archive)."""
        if extract:
            return self.write_archive(path, data)
        p = self._abs(path)
        parent, name = self._split(p)
        source = _source(data)
        if isinstance(source, memoryview) and source.nbytes > self.caps.write:
            raise FilesError(f"{source.nbytes} bytes is over the write cap of "
                             f"{self.caps.write}: nothing written", path=p)
        try:
            self._root.check_writable(p)
            with self._ids():
                dfd, _ = self._dir(parent, create=True)
            try:
                self._check_fs(dfd, p)
                self._write_at(dfd, name, source, p)
            finally:
                os.close(dfd)
        except OSError as e:
            raise self._fail(e, p, "write") from None
        return WriteInfo(name, p)

    def write_files(self, files: Iterable) -> list[WriteInfo]:
        """Write each of [{"path": ..., "data": ...}, ...] (or (path, data) pairs) in turn."""
        out = []
        for f in files:
            path, data = (f["path"], f["data"]) if isinstance(f, dict) else f
            out.append(self.write(path, data))
        return out

    def _write_at(self, dfd: int, name: str, source, p: str, mode: int | None = None,
                  cap: int | None = None) -> int:
        """Write source as `name` in the directory dfd via a temporary file; returns the
        bytes written. `mode`: the new file's (else the replaced file's, else 0644)."""
        cap = self.caps.write if cap is None else cap
        tmp = TEMP_PREFIX + os.urandom(8).hex()
        with self._ids():
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            try:
                written = _write_source(fd, source, cap)
                if written > cap:
                    raise FilesError(f"the data is over the write cap of {cap} bytes: "
                                     "nothing written", path=p)
                if mode is None:
                    mode = 0o644
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            mode = stat.S_IMODE(st.st_mode) & 0o1777
                    except FileNotFoundError:
                        pass
                os.fchmod(fd, mode & 0o1777)
            finally:
                os.close(fd)
            with self._ids():
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return written
        except BaseException:
            try:
                with self._ids():
                    os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise

    # -- directories ---------------------------------------------------------------------
    def make_dir(self, path: str) -> bool:
        """Make the directory and its missing parents, owned by the sandbox's user. True if
        anything was made, False if it existed already."""
        p = self._abs(path)
        try:
            self._root.check_writable(p)
            with self._ids():
                fd, made = self._dir(p, create=True)
            os.close(fd)
        except OSError as e:
            raise self._fail(e, p, "make_dir") from None
        return made

    def list(self, path: str = ".", depth: int = 1) -> list[EntryInfo]:
        """The entries of a directory, and of its subdirectories down to `depth` levels
        (1: its own entries only). A link to a directory is listed, never entered; nor is
        another kernel interface (/proc) or anything past MAX_DEPTH. Sorted by path;
        refused past caps.entries."""
        if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise FilesError(f"depth is a whole number from 1 to {MAX_DEPTH}", path=str(path))
        p = self._abs(path)
        out: list[EntryInfo] = []
        stack: list[tuple[int, str, int]] = []
        try:
            with self._ids():
                stack.append((self._open(p, os.O_RDONLY | os.O_DIRECTORY), p, 1))
                while stack:
                    dfd, dpath, level = stack.pop()
                    try:
                        self._list_one(dfd, dpath, level, depth, out, stack)
                    finally:
                        os.close(dfd)
        except OSError as e:
            raise self._fail(e, p, "list") from None
        finally:
            for fd, _, _ in stack:
                os.close(fd)
        out.sort(key=lambda e: e.path)
        return out

    def _list_one(self, dfd, dpath, level, depth, out, stack) -> None:
        with os.scandir(dfd) as it:   # scandir works on a duplicate of dfd
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue   # removed while listed
                epath = posixpath.join(dpath, entry.name)
                out.append(self._entry(entry.name, epath, st, dfd))
                if len(out) > self.caps.entries:
                    raise FilesError(f"holds more than {self.caps.entries} entries: list a "
                                     "narrower path or a smaller depth", path=dpath)
                if level < depth and stat.S_ISDIR(st.st_mode):
                    try:   # the entry itself, no link followed, on the same mount or not
                        sub = openat2(dfd, entry.name, os.O_RDONLY | os.O_DIRECTORY
                                      | os.O_NOFOLLOW, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
                                      | RESOLVE_NO_MAGICLINKS)
                    except OSError:
                        continue   # gone, or not ours to read: listed, not entered
                    if fs_type(sub) in KERNEL_FS:
                        os.close(sub)
                        continue
                    stack.append((sub, epath, level + 1))

    def _entry(self, name: str, path: str, st: os.stat_result, dfd: int) -> EntryInfo:
        target = None
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=dfd)
            except OSError:
                target = None
        return EntryInfo(name, path, entry_type(st.st_mode), st.st_size,
                         stat.S_IMODE(st.st_mode), st.st_mtime, target)

    def info(self, path: str) -> EntryInfo:
        """The entry itself (a link is described, not followed)."""
        p = self._abs(path)
        try:
            with self._ids():
                if p == "/":
                    fd = self._open(p, _DIR)
                    try:
                        return self._entry("/", "/", os.fstat(fd), fd)
                    finally:
                        os.close(fd)
                parent, name = self._split(p)
                dfd = self._open(parent, _DIR)
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    return self._entry(name, p, st, dfd)
                finally:
                    os.close(dfd)
        except OSError as e:
            raise self._fail(e, p, "info") from None

    def exists(self, path: str) -> bool:
        """Whether an entry of that name exists (a link counts, wherever it points)."""
        try:
            self.info(path)
        except FilesError as e:
            if e.errno in (2, 20):   # ENOENT, ENOTDIR
                return False
            raise
        return True

    # -- remove, rename ------------------------------------------------------------------
    def remove(self, path: str) -> None:
        """Remove a file, a link (not what it points to) or a directory tree. Another mount
        inside the tree is left whole, and the call fails there (EBUSY)."""
        p = self._abs(path)
        parent, name = self._split(p)
        try:
            self._root.check_writable(p)
            with self._ids():
                dfd = self._open(parent, _DIR)
                try:
                    self._check_fs(dfd, p)
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        self._rmtree(dfd, name, p, 0)
                        os.rmdir(name, dir_fd=dfd)
                    else:
                        os.unlink(name, dir_fd=dfd)
                finally:
                    os.close(dfd)
        except OSError as e:
            raise self._fail(e, p, "remove") from None

    def _rmtree(self, parent_fd: int, name: str, p: str, level: int) -> None:
        """Empty the directory `name` of parent_fd: each entry by name in the fd of its own
        directory, no link followed, no other mount entered."""
        if level >= MAX_DEPTH:
            raise FilesError(f"is more than {MAX_DEPTH} directories deep: not removed "
                             "(what was removed above that depth stays removed)", path=p)
        fd = openat2(parent_fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                     RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
                     | RESOLVE_NO_XDEV)
        try:
            with os.scandir(fd) as it:
                names = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            for child, is_dir in names:
                if is_dir:
                    self._rmtree(fd, child, posixpath.join(p, child), level + 1)
                    os.rmdir(child, dir_fd=fd)
                else:
                    os.unlink(child, dir_fd=fd)
        finally:
            os.close(fd)

    def rename(self, old: str, new: str) -> EntryInfo:
        """Rename (move) an entry within the sandbox, replacing a file at `new` as mv does.
        Neither name's last component is followed; both are resolved inside the root."""
        po, pn = self._abs(old), self._abs(new)
        (op_, on), (np_, nn) = self._split(po), self._split(pn)
        try:
            self._root.check_writable(po)
            self._root.check_writable(pn)
            with self._ids():
                ofd = self._open(op_, _DIR)
                try:
                    nfd = self._open(np_, _DIR)
                    try:
                        self._check_fs(ofd, po)
                        self._check_fs(nfd, pn)
                        os.rename(on, nn, src_dir_fd=ofd, dst_dir_fd=nfd)
                    finally:
                        os.close(nfd)
                finally:
                    os.close(ofd)
        except OSError as e:
            raise self._fail(e, po, "rename") from None
        return self.info(pn)

    # -- watch ---------------------------------------------------------------------------
    def watch(self, path: str, *, recursive: bool = False) -> Watcher:
        """Changes in a directory (and its subdirectories, up to MAX_WATCHES of them, with
        recursive=True), from now on: see Watcher."""
        from .watch import Watcher

        return Watcher(self, self._abs(path), recursive)

    # -- archives ------------------------------------------------------------------------
    def write_archive(self, path: str, tar) -> WriteInfo:
        """Unpack a tar archive (bytes or a binary file object; plain, gzip, bzip2 or xz)
        into the directory path (made if missing). The whole archive is checked before
        anything is written: a member named absolutely or with a `..`, a link (symbolic or
        hard) whose target leaves the tree, a device node, FIFO or other special member,
        more than caps.members members or caps.write bytes in all refuse it, and nothing is
        written. Then each member is made through openat2 RESOLVE_BENEATH from the
        directory's fd, so even a link made by an earlier member cannot send a later one
        out. Owners in the archive are ignored (the sandbox's user owns all); modes keep
        their permission bits, set-id bits dropped."""
        from . import archive

        p = self._abs(path)
        blob = _archive_bytes(tar, self.caps.write, p)
        members = archive.check(blob, self.caps.members, self.caps.write, p)
        try:
            self._root.check_writable(p)
            with self._ids():
                dfd, _ = self._dir(p, create=True)
            try:
                self._check_fs(dfd, p)
                archive.extract(self, dfd, blob, members, p, self.caps.members)
            finally:
                os.close(dfd)
        except OSError as e:
            raise self._fail(e, p, "write_archive") from None
        return WriteInfo(posixpath.basename(p) or "/", p, "dir")


def open_root(pid: int, pidfd: int | None = None) -> int:
    """An O_PATH fd of /proc/PID/root: the root directory of process pid as it sees it
    (its mount namespace's view). `pidfd`: one the caller took when it started the
    process; without it one is taken here. The pidfd is checked after the open (the
    process is still alive, so the pid was not recycled in between and the /proc entry
    opened was that process's)."""
    import _signal

    own = pidfd is None
    if own:
        pidfd = os.pidfd_open(pid)
    try:
        fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _signal.pidfd_send_signal(pidfd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        if own:
            os.close(pidfd)


# -- data sources ---------------------------------------------------------------------------
def _source(data):
    """bytes-like data as a memoryview of bytes; a file object as itself."""
    if isinstance(data, str):
        return memoryview(data.encode("utf-8"))
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).cast("B")
    if hasattr(data, "read"):
        return data
    raise TypeError("data is str, bytes-like, or a readable file object")


def _write_source(fd: int, source, cap: int) -> int:
    """Write all of source to fd; returns the bytes written, stopping once past cap."""
    if isinstance(source, memoryview):
        view, done = source, 0
        while done < view.nbytes:
            done += os.write(fd, view[done:])
        return done
    total = 0
    while total <= cap:
        chunk = source.read(min(CHUNK, cap + 1 - total))
        if not chunk:
            break
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        view = memoryview(chunk).cast("B")
        done = 0
        while done < view.nbytes:
            done += os.write(fd, view[done:])
        total += done
    return total


def _archive_bytes(tar, cap: int, p: str) -> bytes:
    """The archive as bytes, at most cap of them (it is read twice: checked, then made)."""
    if isinstance(tar, (bytes, bytearray, memoryview)):
        blob = bytes(tar)
    elif hasattr(tar, "read"):
        blob = tar.read(cap + 1)
        if isinstance(blob, str):
            raise TypeError("an archive is bytes, or a binary file object")
    else:
        raise TypeError("an archive is bytes, or a binary file object")
    if len(blob) > cap:
        raise FilesError(f"the archive is over the write cap of {cap} bytes: nothing "
                         "written", path=p)
    return blob


__all__ = ["Caps", "EntryInfo", "FileNotFound", "Files", "FilesError", "WriteInfo", "open_root"]
