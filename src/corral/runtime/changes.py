"""Write review: what a sandbox changed in a workspace in review mode, and applying it.

    changes = list_changes(review)          # [Change]: added, modified, deleted paths
    report = apply(review, paths=None)      # copies the accepted ones to the host
    text = patch(review)                    # a git-style patch (`git apply` takes it)

`review` is a backends.review.ReviewMount: the overlay's upper directory (what the sandbox
wrote, on its scratch tmpfs) and an O_PATH fd of the host workspace as opened at start.
A change is the upper layer compared with the host workspace as it is now:

- a whiteout (a 0:0 character device) in upper is a deleted path; a directory marked
  opaque (trusted.overlay.opaque = "y") hides every host entry not in upper: deleted too;
- a file, directory or symbolic link in upper is added (nothing on the host), modified
  (content, mode or link target differ) or nothing (a copy-up that changed nothing);
- a type change is a deletion and an addition of the same path.

Everything in upper is hostile: the sandbox chose its names, sizes, types and modes (not
its trusted.* xattrs: the overlay sets those and the sandbox has no capability over the
host's namespace). So both trees are read with openat-style calls relative to directory fds,
O_NOFOLLOW at every step, O_NONBLOCK on every open (a FIFO never blocks us), types checked
on the open fd, reads bounded, walks bounded in entries and depth. Apply never follows a
link on the host side either: it walks from the workspace fd component by component
(O_PATH | O_NOFOLLOW, as linux/hostpath.py does), writes a new file beside the target and
renames it into place (so a hard link of a host file elsewhere is never written through).
It refuses (and says so per path): a symbolic link whose target leaves the workspace
(absolute, or `..` past its top), device nodes, FIFOs and sockets, set-id bits.

A host path whose ctime is later than the sandbox's start (ReviewMount.opened_ns) was
changed on the host while the sandbox ran: such a change is a conflict, listed, and apply
leaves it alone. (ctime is set by the kernel on every write, chmod, rename and link; no
process can set it back. A host change just before the start counts as one, the safe side;
so does a file the host changed before the sandbox first wrote it.)

Standard library only; pure but for the file system calls.
"""

from __future__ import annotations

import errno
import os
import stat

from .._record import Record
from ..errors import CorralError
from .files import entry_type
from .patch import _base85_lines, _blob_id, _git_mode, _git_name, hunks, unified

#: entries read from the upper layer and from host trees being deleted, in all
MAX_ENTRIES = 200_000


#: directory depth below the workspace walked
MAX_DEPTH = 256


#: files larger than this (either side) get sizes, not a diff, in a Change
DIFF_FILE_MAX = 1 << 20


#: a Change's diff text is cut here (diff_truncated says so)
DIFF_TEXT_MAX = 256 << 10


#: files larger than this (either side) are left out of a patch (a note says so)
PATCH_FILE_MAX = 64 << 20


#: git's rule: a NUL in the first this many bytes makes a file binary
SNIFF = 8000


CHUNK = 1 << 20


WHITEOUT_RDEV = 0


OPAQUE_XATTR = "trusted.overlay.opaque"


#: why a file past ReviewMount.budget is not copied
OVER_BUDGET = ("past the sandbox's scratch size in bytes copied in all (hard links or "
               "sparse files?)")


#: the name apply gives a file before renaming it into place
TMP_PREFIX = ".corral-apply-"


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ReviewError(CorralError):
    """The changes cannot be read or applied at all (too many, the sandbox closed, ...)."""

    kind = "review"
    exit_code = 125


class Change(Record):
    """One path the sandbox changed in the workspace."""

    path: str                      # relative, "/"-separated; names as the OS gives them
    kind: str                      # "added" | "modified" | "deleted"
    type: str                      # "file" | "dir" | "symlink" | "fifo" | "socket" | "device"
    old_mode: int | None = None    # permission bits on the host (None: added)
    new_mode: int | None = None    # in the sandbox (None: deleted)
    old_size: int | None = None
    new_size: int | None = None
    binary: bool = False
    diff: str | None = None        # unified diff of a text file (both sides <= 1 MiB)
    diff_truncated: bool = False
    target: str | None = None      # a symbolic link's new target
    old_target: str | None = None
    conflict: str | None = None    # why apply leaves it: the host changed it meanwhile
    refused: str | None = None     # why apply never copies it (escape, device, set-id)

    def summary(self) -> str:
        """One line: a letter (A, M, D), the path, and what changed."""
        letter = {"added": "A", "modified": "M", "deleted": "D"}[self.kind]
        what: list[str] = []
        if self.type != "file":
            what.append(self.type)
        if self.type == "symlink" and self.target is not None:
            what.append(f"-> {show(self.target)}")
        if self.kind == "modified" and self.old_mode != self.new_mode:
            what.append(f"mode {self.old_mode:o} -> {self.new_mode:o}")
        if self.diff is not None:
            plus = sum(1 for ln in self.diff.splitlines() if ln.startswith("+")
                       and not ln.startswith("+++"))
            minus = sum(1 for ln in self.diff.splitlines() if ln.startswith("-")
                        and not ln.startswith("---"))
            what.append(f"+{plus} -{minus}")
        elif self.type == "file" and self.binary or (
                self.type == "file" and self.diff is None and self.kind != "deleted"):
            what.append(f"{_size(self.old_size)} -> {_size(self.new_size)}"
                        if self.kind == "modified" else _size(self.new_size))
        if self.conflict:
            what.append(f"CONFLICT: {self.conflict}")
        if self.refused:
            what.append(f"REFUSED: {self.refused}")
        return f"{letter} {show(self.path)}" + (f"  ({', '.join(what)})" if what else "")


class Applied(Record):
    """What apply did: the paths copied, and those left with the reason."""

    applied: tuple[str, ...] = ()
    conflicts: tuple[tuple[str, str], ...] = ()
    refused: tuple[tuple[str, str], ...] = ()


def show(text: str) -> str:
    """A name from the sandbox as one safe line: control characters (newline and tab
    too), DEL, C1 controls and undecodable bytes (surrogate escapes) written as \\xNN;
    bidirectional controls and zero-width characters as \\uNNNN (termsafe.review)."""
    from ..termsafe import review

    return review(text.replace("\n", "\\x0a").replace("\t", "\\x09"))


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n} bytes"


def _lstat(name: str, dir_fd: int | None):
    if dir_fd is None:
        return None
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _open_file(name: str, dir_fd: int) -> int:
    """A read fd of a regular file `name` in dir_fd, never a link, FIFO or device."""
    fd = os.open(name, _FILE, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", name)
    return fd


def _read(fd: int, limit: int) -> bytes | None:
    """Up to `limit` bytes of fd from its start, or None if it holds more."""
    parts, total = [], 0
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        b = os.read(fd, min(CHUNK, limit + 1 - total))
        if not b:
            return b"".join(parts)
        parts.append(b)
        total += len(b)
        if total > limit:
            return None


def _same_content(a: int, b: int) -> bool:
    os.lseek(a, 0, os.SEEK_SET)
    os.lseek(b, 0, os.SEEK_SET)
    while True:
        x, y = os.read(a, CHUNK), os.read(b, CHUNK)
        if x != y:
            return False
        if not x:
            return True


def _is_binary(data: bytes) -> bool:
    return b"\0" in data[:SNIFF]


def _readlink(name: str, dir_fd: int) -> str:
    return os.readlink(name, dir_fd=dir_fd)


def _perm(st) -> int:
    return stat.S_IMODE(st.st_mode)


def _kind_of(st) -> str:
    """The files API's entry type (runtime/files.py), a device of either kind "device"."""
    kind = entry_type(st.st_mode)
    return "device" if kind.endswith("_device") else kind


_NOUN = {"fifo": "FIFO", "socket": "socket", "device": "device node"}


def _is_whiteout(st) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == WHITEOUT_RDEV


def _opaque(dir_fd: int) -> bool:
    try:
        return os.getxattr(dir_fd, OPAQUE_XATTR) == b"y"
    except OSError:
        return False


def link_escapes(path: str, target: str) -> str | None:
    """Why a symbolic link at `path` (relative to the workspace) pointing at `target`
    could lead out of the workspace on the host, or None. Allowed: a relative target
    that climbs with leading `..` no higher than the workspace, then only descends (a
    `..` after a name could climb out through a link of that name)."""
    if not target:
        return "an empty link target"
    if target.startswith("/"):
        return f"an absolute link target ({target!r}): outside the workspace on the host"
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if ".." in parts[ups:]:
        return f"a link target with '..' after a name ({target!r})"
    if ups > path.count("/"):
        return f"a link target that climbs out of the workspace ({target!r})"
    return None


class _Walk:
    """One listing: the changes found, a budget of entries, the conflict test."""

    def __init__(self, review) -> None:
        self.review = review
        self.out: list[Change] = []
        self.left = MAX_ENTRIES

    def tick(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise ReviewError(f"more than {MAX_ENTRIES} entries in the workspace's changes; "
                              f"discard them, or use mode \"rw\" for a run that writes so much",
                              field="filesystem.workspace.mode")

    def host_changed(self, path: str, hst) -> bool:
        """Whether the host changed this path (or made it) while the sandbox ran."""
        if hst.st_ctime_ns < self.review.opened_ns:
            return False
        return self.review.applied.get(path) != (hst.st_ino, hst.st_ctime_ns)

    def conflict(self, path: str, hst) -> str | None:
        if hst is not None and self.host_changed(path, hst):
            return "changed on the host while the sandbox ran"
        return None

    # -- a directory of upper, against the same directory on the host (or none) -------
    def walk(self, up_fd: int, host_fd: int | None, rel: str, opaque: bool,
             depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ReviewError(f"the workspace's changes are nested deeper than {MAX_DEPTH} "
                              f"directories ({rel[:200]!r}...); discard them",
                              field="filesystem.workspace.mode")
        names = sorted(os.listdir(up_fd))
        for name in names:
            self.tick()
            self.entry(up_fd, host_fd, name, rel + name, depth)
        if opaque and host_fd is not None:
            seen = set(names)
            for name in sorted(os.listdir(host_fd)):
                if name not in seen:
                    self.tick()
                    hst = _lstat(name, host_fd)
                    if hst is not None:
                        self.deleted(host_fd, name, rel + name, hst, depth)

    def entry(self, up_fd: int, host_fd: int | None, name: str, path: str,
              depth: int) -> None:
        try:
            self._entry(up_fd, host_fd, name, path, depth)
        except OSError as e:
            # swapped or removed while it was read (a link for a file, a file for a
            # directory): the sandbox may still be writing, or racing corral
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL):
                raise
            self.out.append(Change(path=path, kind="modified", type="file",
                                   refused="it changed while corral read it; list the "
                                           "changes again"))

    def _entry(self, up_fd: int, host_fd: int | None, name: str, path: str,
               depth: int) -> None:
        st = _lstat(name, up_fd)
        if st is None:
            return   # gone since the listing (the sandbox may still be writing)
        hst = _lstat(name, host_fd)
        if _is_whiteout(st):
            if hst is not None:
                self.deleted(host_fd, name, path, hst, depth)
            return
        kind = _kind_of(st)
        if kind == "dir":
            self.directory(up_fd, host_fd, name, path, st, hst, depth)
            return
        if hst is not None and _kind_of(hst) != kind:
            self.deleted(host_fd, name, path, hst, depth)
            hst = None
        if kind == "file":
            self.file(up_fd, host_fd, name, path, st, hst)
        elif kind == "symlink":
            self.symlink(up_fd, host_fd, name, path, st, hst)
        else:
            self.out.append(Change(
                path=path, kind="modified" if hst is not None else "added", type=kind,
                new_mode=_perm(st), old_mode=_perm(hst) if hst is not None else None,
                refused=f"a {_NOUN[kind]}; never copied to the host"))

    def directory(self, up_fd, host_fd, name, path, st, hst, depth) -> None:
        ufd = os.open(name, _DIR, dir_fd=up_fd)
        hfd = None
        try:
            if not stat.S_ISDIR(os.fstat(ufd).st_mode):
                return
            opaque = _opaque(ufd)
            refused = "set-id bits" if _perm(st) & (stat.S_ISUID | stat.S_ISGID) else None
            if hst is not None and stat.S_ISDIR(hst.st_mode):
                hfd = os.open(name, _DIR, dir_fd=host_fd)
                if _perm(hst) != _perm(st):
                    self.out.append(Change(path=path, kind="modified", type="dir",
                                           old_mode=_perm(hst), new_mode=_perm(st),
                                           conflict=self.conflict(path, hst),
                                           refused=refused))
            else:
                if hst is not None:
                    self.deleted(host_fd, name, path, hst, depth)
                self.out.append(Change(path=path, kind="added", type="dir",
                                       new_mode=_perm(st), refused=refused))
            self.walk(ufd, hfd, path + "/", opaque, depth + 1)
        finally:
            os.close(ufd)
            if hfd is not None:
                os.close(hfd)

    def file(self, up_fd, host_fd, name, path, st, hst) -> None:
        refused = "set-id bits" if _perm(st) & (stat.S_ISUID | stat.S_ISGID) else None
        ufd = _open_file(name, up_fd)
        hfd = None
        try:
            ust = os.fstat(ufd)
            conflict = None
            same = False
            if hst is not None:
                hfd = _open_file(name, host_fd)
                hst = os.fstat(hfd)
                same = hst.st_size == ust.st_size and _same_content(ufd, hfd)
                if same and _perm(hst) == _perm(ust):
                    return   # a copy-up that changed nothing (opened for writing, touched)
                conflict = self.conflict(path, hst)
            elif self.review.applied.get(path) is None:
                conflict = self.deleted_on_host(ufd, host_fd, path)
            new = _read(ufd, DIFF_FILE_MAX)
            old = _read(hfd, DIFF_FILE_MAX) if hfd is not None else b""
            binary = (new is not None and _is_binary(new)) or (
                old is not None and _is_binary(old))
            diff = truncated = None
            if new is not None and old is not None and not binary and not same:
                text = unified(old, new, path if hfd is not None else None, path)
                truncated = len(text) > DIFF_TEXT_MAX
                diff = text[:DIFF_TEXT_MAX].decode("utf-8", "replace")
            self.out.append(Change(
                path=path, kind="modified" if hst is not None else "added", type="file",
                old_mode=_perm(hst) if hst is not None else None, new_mode=_perm(ust),
                old_size=hst.st_size if hst is not None else None, new_size=ust.st_size,
                binary=binary, diff=diff, diff_truncated=bool(truncated),
                conflict=conflict, refused=refused))
        finally:
            os.close(ufd)
            if hfd is not None:
                os.close(hfd)

    def deleted_on_host(self, ufd: int, host_fd: int | None, path: str) -> str | None:
        """An upper file with no host file: new, unless it was copied up (the overlay
        marks a copy with trusted.overlay.origin) into a directory the host changed
        while the sandbox ran, where the host may have deleted the original."""
        if host_fd is None:
            return None
        try:
            os.getxattr(ufd, "trusted.overlay.origin")
        except OSError:
            return None
        if self.host_changed(path.rpartition("/")[0], os.fstat(host_fd)):
            return "copied from a host file, and the host changed this directory while " \
                   "the sandbox ran (deleted or renamed that file?)"
        return None

    def symlink(self, up_fd, host_fd, name, path, st, hst) -> None:
        target = _readlink(name, up_fd)
        old = None
        if hst is not None:
            old = _readlink(name, host_fd)
            if old == target:
                return
        self.out.append(Change(
            path=path, kind="modified" if hst is not None else "added", type="symlink",
            new_mode=_perm(st), old_mode=_perm(hst) if hst is not None else None,
            target=target, old_target=old, conflict=self.conflict(path, hst),
            refused=link_escapes(path, target)))

    # -- a host entry the sandbox deleted (a whole tree for a directory) -------------------
    def deleted(self, host_fd: int, name: str, path: str, hst, depth: int) -> None:
        kind = _kind_of(hst)
        conflict = self.conflict(path, hst)
        change = dict(path=path, kind="deleted", type=kind, old_mode=_perm(hst))
        if kind == "dir":
            if depth > MAX_DEPTH:
                raise ReviewError(f"a deleted host tree is nested deeper than {MAX_DEPTH} "
                                  f"directories ({path[:200]!r}...)",
                                  field="filesystem.workspace.mode")
            hfd = os.open(name, _DIR, dir_fd=host_fd)
            try:
                for child in sorted(os.listdir(hfd)):
                    self.tick()
                    cst = _lstat(child, hfd)
                    if cst is not None:
                        self.deleted(hfd, child, path + "/" + child, cst, depth + 1)
            finally:
                os.close(hfd)
        elif kind == "file":
            change["old_size"] = hst.st_size
            try:
                fd = _open_file(name, host_fd)
            except OSError:
                fd = None
            if fd is not None:
                try:
                    old = _read(fd, DIFF_FILE_MAX)
                finally:
                    os.close(fd)
                if old is not None:
                    change["binary"] = _is_binary(old)
                    if not change["binary"]:
                        text = unified(old, b"", path, None)
                        change["diff_truncated"] = len(text) > DIFF_TEXT_MAX
                        change["diff"] = text[:DIFF_TEXT_MAX].decode("utf-8", "replace")
        elif kind == "symlink":
            change["old_target"] = _readlink(name, host_fd)
        self.out.append(Change(**change, conflict=conflict))


def _host_root(review) -> int:
    if review.host_fd < 0 or review.upper_fd < 0:
        raise ReviewError("the sandbox is closed; its changes are gone", field="review")
    return os.open(".", _DIR, dir_fd=review.host_fd)


def list_changes(review) -> list[Change]:
    """Every change in the upper layer against the host workspace as it is now, in walk
    order (a directory before its entries; a deletion before an addition of the same
    path)."""
    host = _host_root(review)
    up = os.open(".", _DIR, dir_fd=review.upper_fd)
    try:
        w = _Walk(review)
        ust, hst = os.fstat(up), os.fstat(host)
        if _perm(ust) != _perm(hst) & 0o1777:
            w.out.append(Change(path=".", kind="modified", type="dir", old_mode=_perm(hst),
                                new_mode=_perm(ust), conflict=w.conflict("", hst),
                                refused="set-id bits" if _perm(ust) & 0o6000 else None))
        w.walk(up, host, "", _opaque(up), 0)
        return w.out
    finally:
        os.close(up)
        os.close(host)


def _content(root_fd: int, path: str, kind: str) -> bytes:
    """A file's bytes or a link's target, reached from root_fd without following links."""
    parent, name = _walk_to(root_fd, path)
    try:
        if kind == "symlink":
            return os.fsencode(os.readlink(name, dir_fd=parent))
        fd = _open_file(name, parent)
        try:
            data = _read(fd, PATCH_FILE_MAX)
        finally:
            os.close(fd)
        if data is None:
            raise ReviewError(f"{path} is over {PATCH_FILE_MAX} bytes", field="--patch")
        return data
    finally:
        os.close(parent)


def patch(review, paths=None) -> tuple[bytes, list[tuple[str, str]]]:
    """A git-style patch of the changes (selected by `paths`, as apply's): (patch bytes,
    [(path, why it was left out)]). Left out: refused and conflicting changes, directories
    (git records none), mode changes git cannot express, files over PATCH_FILE_MAX."""
    changes = _select(list_changes(review), paths)
    host = _host_root(review)
    up = os.open(".", _DIR, dir_fd=review.upper_fd)
    out: list[bytes] = []
    left: list[tuple[str, str]] = []
    budget = review.budget
    try:
        for c in changes:
            if c.refused or c.conflict:
                left.append((c.path, c.refused or c.conflict))
                continue
            if c.type == "file" and c.kind != "deleted" and c.new_size is not None:
                if c.new_size > budget:
                    left.append((c.path, OVER_BUDGET))
                    continue
                budget -= c.new_size
            if c.type not in ("file", "symlink"):
                if c.type != "dir":
                    left.append((c.path, f"a {c.type}"))
                continue
            try:
                block = _patch_block(c, host, up)
            except (OSError, ReviewError) as e:
                left.append((c.path, getattr(e, "message", None) or
                             f"cannot read it: {os.strerror(e.errno or 0)}"))
                continue
            if block is None:
                left.append((c.path, "a mode change git does not record"))
            else:
                out.append(block)
    finally:
        os.close(up)
        os.close(host)
    return b"".join(out), left


def _patch_block(c: Change, host: int, up: int) -> bytes | None:
    a, b = _git_name("a/", c.path), _git_name("b/", c.path)
    head = [b"diff --git " + a + b" " + b + b"\n"]
    old = _content(host, c.path, c.type) if c.kind != "added" else b""
    new = _content(up, c.path, c.type) if c.kind != "deleted" else b""
    if c.kind == "added":
        head.append(f"new file mode {_git_mode(c.type, c.new_mode)}\n".encode())
    elif c.kind == "deleted":
        head.append(f"deleted file mode {_git_mode(c.type, c.old_mode)}\n".encode())
    else:
        om, nm = _git_mode(c.type, c.old_mode), _git_mode(c.type, c.new_mode)
        if om != nm:
            head += [f"old mode {om}\n".encode(), f"new mode {nm}\n".encode()]
        if old == new:
            return b"".join(head) if om != nm else None
    oid = _blob_id(old) if c.kind != "added" else "0" * 40
    nid = _blob_id(new) if c.kind != "deleted" else "0" * 40
    mode = f" {_git_mode(c.type, c.new_mode)}" if c.kind == "modified" and \
        _git_mode(c.type, c.old_mode) == _git_mode(c.type, c.new_mode) else ""
    head.append(f"index {oid}..{nid}{mode}\n".encode())
    src = a if c.kind != "added" else b"/dev/null"
    dst = b if c.kind != "deleted" else b"/dev/null"
    if c.type == "file" and (_is_binary(old) or _is_binary(new)):
        return b"".join(head) + (b"GIT binary patch\nliteral %d\n" % len(new)
                                 + _base85_lines(new) + b"\nliteral %d\n" % len(old)
                                 + _base85_lines(old) + b"\n")
    return b"".join(head) + b"--- " + src + b"\n+++ " + dst + b"\n" + hunks(old, new)


def _walk_to(root_fd: int, path: str, *, make: tuple[int, int] | None = None
             ) -> tuple[int, str]:
    """(O_PATH fd of path's parent directory, its last name), reached from root_fd one
    component at a time with O_NOFOLLOW: a link or non-directory on the way raises
    (ELOOP / ENOTDIR). The caller closes the fd."""
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, f"not a plain relative path: {path!r}")
    fd = os.open(".", _PATH | os.O_DIRECTORY, dir_fd=root_fd)
    try:
        for name in parts[:-1]:
            nfd = os.open(name, _PATH | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def _select(changes: list[Change], paths, exact: bool = False) -> list[Change]:
    """The changes at or below each of `paths` (None: all; exact: at them only), with the
    added directories they need."""
    if paths is None:
        return changes
    if isinstance(paths, str):
        paths = [paths]
    want = [p.strip("/") or "." for p in paths]

    def picked(path: str) -> bool:
        return any(path == p or not exact and path.startswith(p + "/") for p in want)

    chosen = {id(c) for c in changes if picked(c.path)}
    added_dirs = {c.path: c for c in changes if c.kind == "added" and c.type == "dir"}
    for c in changes:
        if id(c) in chosen:
            parent = c.path.rpartition("/")[0]
            while parent:
                if parent in added_dirs:
                    chosen.add(id(added_dirs[parent]))
                parent = parent.rpartition("/")[0]
    return [c for c in changes if id(c) in chosen]


def apply(review, paths=None, *, exact: bool = False) -> Applied:
    """Copy the changes (selected by `paths`: each a path, meaning it and everything
    below it; None: all) from the upper layer to the host workspace. Changes are listed
    again now; refused ones and conflicts are left and reported; each path is checked
    again as it is written. Deletions first (deepest first), then new directories, then
    files and links, then directory modes (deepest first)."""
    changes = _select(list_changes(review), paths, exact)
    host = _host_root(review)
    up = os.open(".", _DIR, dir_fd=review.upper_fd)
    applied: list[str] = []
    conflicts: list[tuple[str, str]] = []
    refused: list[tuple[str, str]] = []
    failed: list[str] = []     # nothing at or below a path that failed is applied after it

    def depth(c: Change) -> int:
        return c.path.count("/")

    dirs = [c for c in changes if c.type == "dir" and c.kind != "deleted"]
    phases = [("delete", sorted((c for c in changes if c.kind == "deleted"), key=depth,
                                reverse=True)),
              ("mkdir", sorted((c for c in dirs if c.kind == "added"), key=depth)),
              ("write", [c for c in changes if c.kind != "deleted" and c.type != "dir"]),
              ("mode", sorted(dirs, key=depth, reverse=True))]
    ap = _Apply(review, host, up)
    try:
        for phase, items in phases:
            for c in items:
                if c.refused:
                    if phase != "mode" or c.kind == "modified":
                        refused.append((c.path, c.refused))
                    continue
                if c.conflict:
                    conflicts.append((c.path, c.conflict))
                    failed.append(c.path)
                    continue
                if any(c.path == f or c.path.startswith(f + "/") for f in failed) and (
                        phase != "mode"):
                    conflicts.append((c.path, "a deletion or directory it needs was not "
                                              "applied"))
                    continue
                try:
                    why = getattr(ap, phase)(c)
                except OSError as e:
                    why = ("conflict", f"cannot apply it on the host: "
                                       f"{os.strerror(e.errno or 0)}")
                if why is None:
                    if c.path not in applied:
                        applied.append(c.path)
                    continue
                (refused if why[0] == "refused" else conflicts).append((c.path, why[1]))
                failed.append(c.path)
    finally:
        os.close(up)
        os.close(host)
    return Applied(applied=tuple(applied), conflicts=tuple(conflicts), refused=tuple(refused))


class _Apply:
    """The host-side steps of apply, each for one change, each relative to the workspace
    fd and re-checking what it is about to replace. Each returns None (done) or
    ("conflict" | "refused", why)."""

    def __init__(self, review, host: int, up: int) -> None:
        self.review, self.host, self.up = review, host, up
        self.root = os.geteuid() == 0
        self.walk = _Walk(review)   # for its conflict test
        self.left = review.budget   # bytes still to copy (ReviewMount.budget)

    def _note(self, parent: int, name: str, path: str) -> None:
        """Record what apply left at path (and its directory's new ctime), so a later
        listing does not take corral's own writes for the host's."""
        st = _lstat(name, parent)
        if st is not None:
            self.review.applied[path] = (st.st_ino, st.st_ctime_ns)
        pst = os.fstat(parent)
        self.review.applied[path.rpartition("/")[0]] = (pst.st_ino, pst.st_ctime_ns)

    def _changed(self, path: str, hst) -> tuple[str, str] | None:
        if hst is not None and self.walk.host_changed(path, hst):
            return ("conflict", "changed on the host while the sandbox ran")
        return None

    def delete(self, c: Change):
        parent, name = _walk_to(self.host, c.path)
        try:
            hst = _lstat(name, parent)
            if hst is None:
                return None                  # gone already
            why = self._changed(c.path, hst)
            if why:
                return why
            if stat.S_ISDIR(hst.st_mode):
                try:
                    os.rmdir(name, dir_fd=parent)
                except OSError as e:
                    if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        return ("conflict", "the host has entries in it the sandbox never "
                                            "saw")
                    raise
            else:
                os.unlink(name, dir_fd=parent)
            self._note(parent, name, c.path)
            return None
        finally:
            os.close(parent)

    def mkdir(self, c: Change):
        parent, name = _walk_to(self.host, c.path)
        try:
            hst = _lstat(name, parent)
            if hst is not None:
                if stat.S_ISDIR(hst.st_mode):
                    return None              # made on the host meanwhile: use it
                return ("conflict", f"the host has a {_kind_of(hst)} there")
            os.mkdir(name, 0o700, dir_fd=parent)
            if self.root:
                os.chown(name, *self.review.owner, dir_fd=parent, follow_symlinks=False)
            self._note(parent, name, c.path)
            return None
        finally:
            os.close(parent)

    def mode(self, c: Change):
        if c.path == ".":   # the workspace's own mode
            parent, name = os.open(".", _PATH | os.O_DIRECTORY, dir_fd=self.host), "."
        else:
            parent, name = _walk_to(self.host, c.path)
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
            try:
                ust = self._upper_stat(c.path)
                if ust is None or not stat.S_ISDIR(ust.st_mode):
                    return ("conflict", "gone from the sandbox since it was listed")
                mode = _perm(ust)
                if mode & (stat.S_ISUID | stat.S_ISGID):
                    return ("refused", "set-id bits")
                os.fchmod(fd, mode & 0o1777)
            finally:
                os.close(fd)
            if c.path != ".":
                self._note(parent, name, c.path)
            return None
        finally:
            os.close(parent)

    def _upper_stat(self, path: str):
        if path == ".":
            return os.fstat(self.up)
        try:
            parent, name = _walk_to(self.up, path)
        except OSError:
            return None
        try:
            return _lstat(name, parent)
        finally:
            os.close(parent)

    def write(self, c: Change):
        if c.type not in ("file", "symlink"):
            return ("refused", f"a {c.type}; never copied to the host")
        uparent, uname = _walk_to(self.up, c.path)
        try:
            parent, name = _walk_to(self.host, c.path)
        except BaseException:
            os.close(uparent)
            raise
        tmp = None
        try:
            hst = _lstat(name, parent)
            why = self._changed(c.path, hst)
            if why:
                return why
            if hst is not None and stat.S_ISDIR(hst.st_mode):
                return ("conflict", "the host has a directory there")
            if hst is None and c.kind == "modified":
                return ("conflict", "deleted on the host while the sandbox ran")
            owner = (hst.st_uid, hst.st_gid) if hst is not None and c.kind == "modified" \
                else self.review.owner
            tmp = TMP_PREFIX + os.urandom(6).hex()
            if c.type == "symlink":
                target = os.readlink(uname, dir_fd=uparent)
                bad = link_escapes(c.path, target)
                if bad:
                    return ("refused", bad)
                os.symlink(target, tmp, dir_fd=parent)
                if self.root:
                    os.chown(tmp, *owner, dir_fd=parent, follow_symlinks=False)
            else:
                src = _open_file(uname, uparent)
                try:
                    sst = os.fstat(src)
                    mode = _perm(sst)
                    if mode & (stat.S_ISUID | stat.S_ISGID):
                        tmp = None
                        return ("refused", "set-id bits")
                    if sst.st_size > self.left:
                        tmp = None
                        return ("refused", OVER_BUDGET)
                    self.left -= sst.st_size
                    dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, 0o600, dir_fd=parent)
                    try:
                        _copy(src, dst)
                        if self.root:
                            os.fchown(dst, *owner)
                        os.fchmod(dst, mode & 0o1777)
                    finally:
                        os.close(dst)
                finally:
                    os.close(src)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            tmp = None
            self._note(parent, name, c.path)
            return None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp, dir_fd=parent)
                except OSError:
                    pass
            os.close(parent)
            os.close(uparent)


def _copy(src: int, dst: int) -> None:
    os.lseek(src, 0, os.SEEK_SET)
    while True:
        b = os.read(src, CHUNK)
        if not b:
            return
        view = memoryview(b)
        while view:
            view = view[os.write(dst, view):]
