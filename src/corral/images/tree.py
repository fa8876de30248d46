"""Building an image tree from hostile input, and its digest.

A tree is built in a fresh directory by `TreeBuilder`, member by member, from tar streams
(an OCI layer, a `docker save` layer, mmdebstrap's output) or from a directory a sandbox
wrote (the install phase's layer). Everything it is handed is treated as hostile:

- a member's name is split into components and checked: no absolute path, no `..`, no
  empty or `.` component after normalisation, no NUL or newline, bounded length and depth;
- the builder walks to the member's parent with `openat(dirfd, component, O_DIRECTORY |
  O_NOFOLLOW)`, one component at a time, so a symlink planted by an earlier member is
  never followed (ELOOP/ENOTDIR: refused), and creates the member relative to that fd;
- only directories, regular files, symlinks and hard links (to a regular file already in
  the tree) are accepted; device nodes, FIFOs and sockets are refused;
- a relative symlink whose target climbs above the tree's root is refused (absolute
  targets resolve inside the image when it is the root; corral never follows them);
- member sizes, member count and total bytes are bounded (`Limits`).

Owners are never taken from the input (every file belongs to whoever runs corral: root,
normally), and modes are recorded in `modes`, applied only at `finish()`.

The digest (`digest_of`) is the sha256 of the tree's manifest (`manifest_bytes`): one line
per entry except the root, sorted by path (bytes), each

    PATH \\0 TYPE \\0 MODE \\0 SIZE \\0 DATA \\n

TYPE is `d`, `f` or `l`; MODE the permission bits in octal (4 digits; `0777` for links);
SIZE the file's length in bytes (0 for others); DATA the file's sha256 in hex, a link's
target, or empty for a directory. Mtimes, owners, hard-link structure and the order in
which members arrived are not part of it, so the same content gives the same digest.

A *layer* (`TreeBuilder(..., layer=True)`) is a tree that lies over lower ones (an
overlayfs lower directory at run time). It keeps what a layer removes: an OCI whiteout
`.wh.NAME` becomes an overlayfs whiteout at NAME (a character device 0/0, TYPE `w` in the
manifest, MODE 0000), an opaque marker `.wh..wh..opq` the directory's
`trusted.overlay.opaque` xattr (its manifest line's DATA is `opaque`). Device nodes in the
input are still refused; whiteouts are made only by corral, from `.wh.` names.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from ..errors import ImageError

#: entries corral mounts on in every image root (namespace: bwrap binds; gvisor: the OCI
#: mounts); added when absent, so they are part of the tree and of its digest
MOUNT_POINTS = (("proc", "d", 0o555), ("dev", "d", 0o755), ("dev/shm", "d", 0o755),
                ("tmp", "d", 0o1777),
                ("scratch", "d", 0o755), ("workspace", "d", 0o755), ("etc", "d", 0o755),
                ("etc/corral-ca.pem", "f", 0o644))
CHUNK = 1 << 20
_DIRFLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Limits:
    """Bounds on what one build may unpack (all counted over every layer)."""

    def __init__(self, *, member_bytes: int = 4 << 30, total_bytes: int = 32 << 30,
                 members: int = 2_000_000, name_bytes: int = 4096, depth: int = 128) -> None:
        self.member_bytes = member_bytes
        self.total_bytes = total_bytes
        self.members = members
        self.name_bytes = name_bytes
        self.depth = depth


def split_name(name: str, what: str = "member") -> list[str]:
    """The components of a member name, normalised (`./a//b/` -> [a, b]); refuses absolute
    paths, `..`, NUL and newlines with one line naming the member."""
    if "\0" in name or "\n" in name:
        raise ImageError(f"{what} {name!r}: a NUL or newline in a name; refusing the archive",
                         field="image")
    if name.startswith("/"):
        raise ImageError(f"{what} {name!r}: an absolute path; refusing the archive",
                         field="image")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(len(os.fsencode(p)) > 255 for p in parts):
        raise ImageError(f"{what} {name[:80]!r}...: a name component over 255 bytes; refusing "
                         "the archive", field="image")
    if ".." in parts:
        raise ImageError(f"{what} {name!r}: a '..' component leaves the tree; refusing the "
                         "archive", field="image")
    return parts


class TreeBuilder:
    """A tree under construction in `path` (an empty directory corral made)."""

    def __init__(self, path: str, limits: Limits | None = None, layer: bool = False) -> None:
        self.path = path
        self.limits = limits or Limits()
        #: a layer over lower trees: whiteouts and opaque directories are kept, not applied
        self.layer = layer
        #: directories of this layer marked opaque (layer only)
        self.opaque: set[str] = set()
        #: make checked hash-based .pyc files unchecked (builds and installs: see
        #: _unchecked_pyc); imports keep every byte as it came
        self.unchecked_pycs = False
        self.root_fd = os.open(path, _DIRFLAGS)
        #: recorded permission bits per path (components joined by "/")
        self.modes: dict[str, int] = {}
        self.members = 0
        self.bytes = 0
        #: paths created by the layer being applied (opaque whiteouts spare them)
        self.layer_paths: set[str] = set()

    def close(self) -> None:
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    # -- walking -------------------------------------------------------------------------
    def _parent(self, parts: list[str], name: str, create: bool = True) -> int:
        """An fd of the directory holding parts[-1], walked without following any link;
        missing directories are made (mode recorded 0755) when `create`."""
        if len(parts) > self.limits.depth:
            raise ImageError(f"member {name!r}: deeper than {self.limits.depth} directories",
                             field="image")
        fd = os.dup(self.root_fd)
        try:
            for i, comp in enumerate(parts[:-1]):
                try:
                    nfd = os.open(comp, _DIRFLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(comp, 0o755, dir_fd=fd)
                    self.modes.setdefault("/".join(parts[:i + 1]), 0o755)
                    nfd = os.open(comp, _DIRFLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise ImageError(f"member {name!r}: {'/'.join(parts[:i + 1])!r} is "
                                         "a symlink or a file, not a directory; refusing to "
                                         "go through it", field="image") from None
                    raise
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _clear(self, fd: int, leaf: str, rel: str, keep_dir: bool = False) -> None:
        """Remove what is at leaf (in fd), if anything; a directory stays when keep_dir."""
        try:
            st = os.lstat(leaf, dir_fd=fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            import shutil

            shutil.rmtree(leaf, dir_fd=fd)   # fd-based: never follows a link
            self._forget(rel)
        else:
            os.unlink(leaf, dir_fd=fd)
            self.modes.pop(rel, None)

    def _forget(self, rel: str) -> None:
        self.modes.pop(rel, None)
        self.opaque.discard(rel)
        prefix = rel + "/"
        for k in [k for k in self.modes if k.startswith(prefix)]:
            del self.modes[k]
        for k in [k for k in self.opaque if k.startswith(prefix)]:
            self.opaque.discard(k)

    def _count(self, name: str, size: int = 0) -> None:
        self.members += 1
        if self.members > self.limits.members:
            raise ImageError(f"more than {self.limits.members} members; refusing the archive",
                             field="image")
        if size > self.limits.member_bytes:
            raise ImageError(f"member {name!r}: {size} bytes, over the limit of "
                             f"{self.limits.member_bytes}", field="image")
        self.bytes += size
        if self.bytes > self.limits.total_bytes:
            raise ImageError(f"the image unpacks to more than {self.limits.total_bytes} bytes; "
                             "refusing it", field="image")

    # -- members -------------------------------------------------------------------------
    def add_dir(self, name: str, mode: int) -> None:
        parts = split_name(name)
        self._count(name)
        if not parts:   # the root itself
            return
        rel = "/".join(parts)
        fd = self._parent(parts, name)
        try:
            self._clear(fd, parts[-1], rel, keep_dir=True)
            try:
                os.mkdir(parts[-1], 0o755, dir_fd=fd)
            except FileExistsError:
                pass
        finally:
            os.close(fd)
        self.modes[rel] = mode & 0o7777
        self.layer_paths.add(rel)

    def add_file(self, name: str, mode: int, size: int, src) -> None:
        """A regular file of `size` bytes read from the file object `src`."""
        parts = split_name(name)
        self._count(name, size)
        if not parts:
            raise ImageError(f"member {name!r}: a file where the root should be", field="image")
        rel = "/".join(parts)
        fd = self._parent(parts, name)
        try:
            self._clear(fd, parts[-1], rel)
            out = os.open(parts[-1], os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                left = size
                while left:
                    chunk = src.read(min(CHUNK, left))
                    if not chunk:
                        raise ImageError(f"member {name!r}: the archive ends inside it",
                                         field="image")
                    _write_all(out, chunk)
                    left -= len(chunk)
                if self.unchecked_pycs and rel.endswith(".pyc") and size >= 16:
                    _unchecked_pyc(out)
            finally:
                os.close(out)
        finally:
            os.close(fd)
        self.modes[rel] = mode & 0o7777
        self.layer_paths.add(rel)

    def add_symlink(self, name: str, target: str) -> None:
        parts = split_name(name)
        self._count(name)
        if not parts:
            raise ImageError(f"member {name!r}: a link where the root should be", field="image")
        if "\0" in target or "\n" in target or not target or len(target) > self.limits.name_bytes:
            raise ImageError(f"member {name!r}: a symlink target that is empty, too long or "
                             "holds a NUL or newline", field="image")
        if not target.startswith("/"):
            depth = len(parts) - 1
            for comp in target.split("/"):
                if comp == "..":
                    depth -= 1
                    if depth < 0:
                        raise ImageError(f"member {name!r}: symlink to {target!r} leaves the "
                                         "tree; refusing the archive", field="image")
                elif comp not in ("", "."):
                    depth += 1
        rel = "/".join(parts)
        fd = self._parent(parts, name)
        try:
            self._clear(fd, parts[-1], rel)
            os.symlink(target, parts[-1], dir_fd=fd)
        finally:
            os.close(fd)
        self.modes[rel] = 0o777
        self.layer_paths.add(rel)

    def add_hardlink(self, name: str, target: str) -> None:
        """A hard link to a regular file already in the tree (`target` a member name)."""
        parts = split_name(name)
        tparts = split_name(target, "hard link target")
        self._count(name)
        if not parts or not tparts:
            raise ImageError(f"member {name!r}: a hard link to or at the root", field="image")
        rel, trel = "/".join(parts), "/".join(tparts)
        try:
            tfd = self._parent(tparts, target, create=False)
        except FileNotFoundError:
            raise ImageError(f"member {name!r}: hard link to {target!r}, which is not in the "
                             "tree", field="image") from None
        try:
            st = os.lstat(tparts[-1], dir_fd=tfd)
            if not stat.S_ISREG(st.st_mode):
                raise ImageError(f"member {name!r}: hard link to {target!r}, which is not a "
                                 "regular file in the tree", field="image")
            fd = self._parent(parts, name)
            try:
                self._clear(fd, parts[-1], rel)
                os.link(tparts[-1], parts[-1], src_dir_fd=tfd, dst_dir_fd=fd,
                        follow_symlinks=False)
            finally:
                os.close(fd)
        except FileNotFoundError:
            raise ImageError(f"member {name!r}: hard link to {target!r}, which is not in the "
                             "tree", field="image") from None
        finally:
            os.close(tfd)
        self.modes[rel] = self.modes.get(trel, 0o644)
        self.layer_paths.add(rel)

    def whiteout(self, name: str) -> None:
        """An OCI whiteout member: `dir/.wh.NAME` deletes dir/NAME; `dir/.wh..wh..opq`
        empties dir of what lower layers put there."""
        parts = split_name(name)
        self._count(name)
        if self.layer:
            return self._layer_whiteout(parts, name)
        leaf = parts[-1]
        try:
            fd = self._parent(parts, name, create=False)
        except FileNotFoundError:
            return   # nothing below to hide
        try:
            if leaf == ".wh..wh..opq":
                dirrel = "/".join(parts[:-1])
                for entry in os.listdir(fd):
                    rel = f"{dirrel}/{entry}" if dirrel else entry
                    if rel not in self.layer_paths:
                        self._clear(fd, entry, rel)
            else:
                victim = leaf[len(".wh."):]
                if victim in ("", ".", ".."):
                    raise ImageError(f"member {name!r}: a whiteout of nothing", field="image")
                self._clear(fd, victim, "/".join([*parts[:-1], victim]))
        finally:
            os.close(fd)

    def _layer_whiteout(self, parts: list[str], name: str) -> None:
        """In a layer: `.wh.NAME` -> an overlayfs whiteout at NAME, `.wh..wh..opq` -> the
        directory marked opaque (lower layers' entries hidden)."""
        leaf = parts[-1]
        if leaf == ".wh..wh..opq":
            dparts = parts[:-1]
            if not dparts:
                raise ImageError(f"member {name!r}: an opaque marker at the root of a layer "
                                 "(it would hide the whole image); refusing the archive",
                                 field="image")
            self.add_dir("/".join(dparts) + "/", self.modes.get("/".join(dparts), 0o755))
            fd = self._parent([*dparts, "."], name)
            try:
                os.setxattr(fd, "trusted.overlay.opaque", b"y")
            except OSError as e:
                raise ImageError(f"member {name!r}: cannot mark {'/'.join(dparts)!r} opaque "
                                 f"({e.strerror}); layers with opaque directories need root",
                                 field="image") from None
            finally:
                os.close(fd)
            self.opaque.add("/".join(dparts))
            return
        victim = leaf[len(".wh."):]
        if victim in ("", ".", ".."):
            raise ImageError(f"member {name!r}: a whiteout of nothing", field="image")
        vparts = [*parts[:-1], victim]
        rel = "/".join(vparts)
        fd = self._parent(vparts, name)
        try:
            self._clear(fd, victim, rel)
            try:
                os.mknod(victim, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=fd)
            except OSError as e:
                raise ImageError(f"member {name!r}: cannot make the whiteout of {rel!r} "
                                 f"({e.strerror})", field="image") from None
        finally:
            os.close(fd)
        self.modes[rel] = 0
        self.layer_paths.add(rel)

    def refuse_whiteout_name(self, name: str) -> None:
        """A plain file named like an OCI whiteout would delete its namesake once exported
        and imported again: refused where whiteouts are not expected."""
        raise ImageError(f"member {name!r}: a name starting with '.wh.', which OCI layers "
                         "reserve for whiteouts; refusing it", field="image")

    def refuse(self, name: str, what: str) -> None:
        raise ImageError(f"member {name!r} is a {what}; images hold only files, directories "
                         "and links: refusing the archive", field="image")

    # -- tar streams ---------------------------------------------------------------------
    def apply_tar(self, fileobj, *, whiteouts: bool) -> None:
        """Every member of a tar stream (gzip is detected), in order."""
        import tarfile

        self.layer_paths = set()
        try:
            tf = open_tar(fileobj=fileobj, mode="r|*")
        except tarfile.TarError as e:
            raise ImageError(f"not a tar archive ({e})", field="image") from None
        try:
            while (m := tf.next()) is not None:
                tf.members.clear()   # tarfile keeps every member it read: not here
                name = m.name
                base = name.rstrip("/").rpartition("/")[2]
                if base.startswith(".wh."):
                    if not whiteouts:
                        self.refuse_whiteout_name(name)
                    self.whiteout(name)
                elif m.isdir():
                    self.add_dir(name, m.mode)
                elif m.isreg():
                    src = tf.extractfile(m)
                    self.add_file(name, m.mode, m.size, src)
                elif m.issym():
                    self.add_symlink(name, m.linkname)
                elif m.islnk():
                    self.add_hardlink(name, m.linkname)
                elif m.ischr() or m.isblk():
                    self.refuse(name, "device node")
                elif m.isfifo():
                    self.refuse(name, "FIFO")
                else:
                    self.refuse(name, f"tar member of type {m.type!r}")
        except tarfile.TarError as e:
            raise ImageError(f"a corrupt tar archive ({e})", field="image") from None
        except EOFError:
            raise ImageError("the tar archive ends early", field="image") from None
        finally:
            tf.close()

    def apply_dir(self, src: str) -> None:
        """Copy a directory tree some sandbox wrote (hostile: walked with fds, no link
        followed) into this tree, as one layer."""
        self.layer_paths = set()
        top = os.open(src, _DIRFLAGS)
        try:
            self._copy_dir(top, [])
        finally:
            os.close(top)

    def _copy_dir(self, dfd: int, parts: list[str]) -> None:
        for entry in sorted(os.listdir(dfd)):
            p = [*parts, entry]
            name = "/".join(p)
            if entry.startswith(".wh."):
                self.refuse_whiteout_name(name)
            st = os.lstat(entry, dir_fd=dfd)
            if stat.S_ISDIR(st.st_mode):
                self.add_dir(name, st.st_mode)
                sub = os.open(entry, _DIRFLAGS, dir_fd=dfd)
                try:
                    self._copy_dir(sub, p)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                f = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                with os.fdopen(f, "rb") as fo:
                    self.add_file(name, st.st_mode, os.fstat(fo.fileno()).st_size, fo)
            elif stat.S_ISLNK(st.st_mode):
                self.add_symlink(name, os.readlink(entry, dir_fd=dfd))
            else:
                self.refuse(name, "device node, FIFO or socket")

    # -- the end ---------------------------------------------------------------------------
    def add_mount_points(self) -> None:
        """corral's mount points (MOUNT_POINTS), where the tree lacks them."""
        for rel, kind, mode in MOUNT_POINTS:
            parts = rel.split("/")
            fd = self._parent(parts, rel)
            try:
                try:
                    st = os.lstat(parts[-1], dir_fd=fd)
                except FileNotFoundError:
                    st = None
                if st is not None and (stat.S_ISDIR(st.st_mode) if kind == "d"
                                       else stat.S_ISREG(st.st_mode)):
                    continue
                if st is not None:
                    raise ImageError(f"/{rel} in the image is not a "
                                     f"{'directory' if kind == 'd' else 'file'}; corral mounts "
                                     "there", field="image")
                if kind == "d":
                    os.mkdir(parts[-1], 0o755, dir_fd=fd)
                else:
                    os.close(os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                     | os.O_NOFOLLOW, 0o644, dir_fd=fd))
                self.modes[rel] = mode
            finally:
                os.close(fd)

    def check_layer_mount_points(self) -> None:
        """A layer may not remove, or put a file or link where corral mounts (MOUNT_POINTS);
        under a directory it marks opaque, the mount point is added to the layer."""
        for rel, kind, mode in MOUNT_POINTS:
            parts = rel.split("/")
            fd = os.dup(self.root_fd)
            try:
                for i, comp in enumerate(parts):
                    here = "/".join(parts[:i + 1])
                    try:
                        st = os.lstat(comp, dir_fd=fd)
                    except FileNotFoundError:
                        above = "/".join(parts[:i])
                        if above in self.opaque:   # hidden below: the layer must have it
                            self._add_mount_point(parts, kind, mode)
                        break
                    want_dir = i < len(parts) - 1 or kind == "d"
                    if not (stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)):
                        what = "removes" if stat.S_ISCHR(st.st_mode) else "replaces"
                        raise ImageError(f"the layer {what} /{here}, where corral mounts; "
                                         "refusing it", field="image")
                    if want_dir:
                        nfd = os.open(comp, _DIRFLAGS, dir_fd=fd)
                        os.close(fd)
                        fd = nfd
            finally:
                os.close(fd)

    def _add_mount_point(self, parts: list[str], kind: str, mode: int) -> None:
        rel = "/".join(parts)
        fd = self._parent(parts, rel)
        try:
            if kind == "d":
                os.mkdir(parts[-1], 0o755, dir_fd=fd)
            else:
                os.close(os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                 | os.O_NOFOLLOW, 0o644, dir_fd=fd))
        finally:
            os.close(fd)
        self.modes[rel] = mode

    def finish(self) -> tuple[bytes, int]:
        """(manifest bytes, total file bytes); then every mode on disk becomes read-only
        (write, set-id and sticky bits cleared: `mode & 0o555`); the recorded modes stay in
        the manifest."""
        manifest, size = manifest_of(self.path, self.modes,
                                     self.opaque if self.layer else None)
        for dirpath, dirnames, filenames in os.walk(self.path, topdown=False):
            for n in filenames + dirnames:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                    rel = os.path.relpath(p, self.path)
                    os.chmod(p, self.modes.get(rel, 0o755) & 0o555, follow_symlinks=False)
        self.close()
        return manifest, size


#: bounds on the headers tarfile reads whole into memory before the member they describe:
#: one PAX or GNU long-name header, such headers in a row, and every PAX global header
EXT_HEADER_MAX = 64 << 10
EXT_HEADERS_IN_A_ROW = 8
GLOBAL_HEADERS_MAX = 1 << 20


def open_tar(*args, **kw):
    """tarfile.open with the header bounds above (`BoundedTarInfo`)."""
    import tarfile

    return tarfile.open(*args, tarinfo=_bounded_tarinfo(), **kw)


_BOUNDED = None


def _bounded_tarinfo():
    """A TarInfo class that checks an extended header's size (in its 512-byte ustar block,
    already parsed) before tarfile reads the header's body: tarfile reads a PAX or GNU
    long-name body whole, and keeps PAX global headers for the rest of the archive.
    Sparse members are refused (images have none; their maps are unbounded too)."""
    global _BOUNDED
    if _BOUNDED is not None:
        return _BOUNDED
    import tarfile

    ext = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
           tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)

    class BoundedTarInfo(tarfile.TarInfo):
        def _proc_member(self, tf):
            state = tf.__dict__.setdefault("_corral_ext", [0, 0])   # in a row, global bytes
            if self.type in ext:
                state[0] += 1
                if self.size > EXT_HEADER_MAX:
                    raise ImageError(f"a tar extended header of {self.size} bytes at offset "
                                     f"{self.offset}, over the limit of {EXT_HEADER_MAX}; "
                                     "refusing the archive", field="image")
                if state[0] > EXT_HEADERS_IN_A_ROW:
                    raise ImageError(f"more than {EXT_HEADERS_IN_A_ROW} tar extended headers "
                                     f"in a row at offset {self.offset}; refusing the archive",
                                     field="image")
                if self.type == tarfile.XGLTYPE:
                    state[1] += self.size
                    if state[1] > GLOBAL_HEADERS_MAX:
                        raise ImageError(f"tar global headers over {GLOBAL_HEADERS_MAX} bytes "
                                         "in all; refusing the archive", field="image")
            else:
                state[0] = 0
                if self.type == tarfile.GNUTYPE_SPARSE:
                    self._sparse()
            return super()._proc_member(tf)

        def _sparse(self, *_):
            raise ImageError(f"member {self.name!r} is a sparse file; images hold only plain "
                             "files, directories and links: refusing the archive",
                             field="image")

        _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _sparse

    _BOUNDED = BoundedTarInfo
    return _BOUNDED


def _unchecked_pyc(fd: int) -> None:
    """A checked hash-based .pyc (PEP 552: flags 0b11, what py_compile writes when
    SOURCE_DATE_EPOCH is set, as in mmdebstrap's and pip's runs) becomes an unchecked one
    (flags 0b01), as `compileall --invalidation-mode unchecked-hash` would write it: the
    same source hash and code, but python no longer reads and hashes the .py source on
    every import. An image is read-only, so its sources never change under their .pyc;
    python3 -c pass on an image read every stdlib module it imports without this (about
    30% slower than on the host, whose .pyc files are timestamp-checked)."""
    head = os.pread(fd, 8, 0)
    if len(head) == 8 and head[2:4] == b"\r\n" and head[4:8] == b"\x03\0\0\0":
        os.pwrite(fd, b"\x01\0\0\0", 4)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def manifest_of(path: str, modes: dict[str, int] | None = None,
                opaque: set[str] | None = None) -> tuple[bytes, int]:
    """The manifest of the tree at `path` (see the module docstring) and its file bytes.
    Modes come from `modes` (recorded at build) where given, else from the disk.
    `opaque` (a layer's): its opaque directories, and whiteouts (0/0 character devices)
    are allowed; without it a tree holds only directories, files and links."""
    entries: list[tuple[bytes, bytes]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, path)
            st = os.lstat(p)
            mode = (modes or {}).get(rel, stat.S_IMODE(st.st_mode))
            if stat.S_ISLNK(st.st_mode):
                line = (b"l", 0o777, 0, os.fsencode(os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                line = (b"d", mode, 0, b"opaque" if opaque and rel in opaque else b"")
            elif (opaque is not None and stat.S_ISCHR(st.st_mode)
                  and st.st_rdev == os.makedev(0, 0)):
                line = (b"w", 0, 0, b"")
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(p, "rb", buffering=0) as f:
                    while chunk := f.read(CHUNK):
                        h.update(chunk)
                hexd = h.hexdigest()
                total += st.st_size
                line = (b"f", mode, st.st_size, hexd.encode())
            else:
                raise ImageError(f"{p}: not a file, directory or link in an image tree",
                                 field="image")
            kind, m, size, data = line
            rb = os.fsencode(rel)
            entries.append((rb, b"\0".join([rb, kind, b"%04o" % m, b"%d" % size, data])))
    entries.sort()
    return b"".join(e[1] + b"\n" for e in entries), total


def manifest_entry(manifest: bytes, path: str) -> tuple[str, str] | None:
    """(TYPE, DATA) of `path` (relative, normalised) in a manifest, or None."""
    key = os.fsencode(path) + b"\0"
    if manifest.startswith(key):
        at = 0
    else:
        at = manifest.find(b"\n" + key) + 1
        if at == 0:
            return None
    end = manifest.find(b"\n", at)
    fields = manifest[at:end if end >= 0 else len(manifest)].split(b"\0")
    return fields[1].decode(), os.fsdecode(fields[4])


def digest_of(manifest: bytes) -> str:
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def parse_manifest(manifest: bytes):
    """Yield (path, kind, mode, size, data) per line, as str (surrogate-escaped)."""
    for line in manifest.split(b"\n"):
        if not line:
            continue
        p, kind, mode, size, data = line.split(b"\0")
        yield os.fsdecode(p), kind.decode(), int(mode, 8), int(size), os.fsdecode(data)
