"""A read-only workspace on the microvm tier: copied in, never shared.

No host directory is shared with a guest (no virtio-fs, no 9p: nothing of the host's file
system is reachable from QEMU's process). Instead, at the sandbox's start, corral reads
the workspace on the host (one directory fd, every entry opened relative to its parent
without following a link) into a tar stream, sends it over the control channel (W frames,
then a w frame naming the destination), and the guest agent unpacks it into a tmpfs at
/workspace (mounted by the initramfs), gives it to the sandbox's user and remounts it
read-only: the guest kernel refuses every write (EROFS), and nothing the guest does
reaches the host's copy. What changes on the host after the start is not seen inside.

What goes in: regular files, directories, and symbolic links whose target is relative
and stays inside the workspace; other links and special files are left out, and a notice
event says how many. Bounded: MAX_BYTES of file data and MAX_ENTRIES entries, else the
sandbox is refused in one line naming the bound. `mode = "rw"` and `"review"` (changes
copied back) are refused on this tier, naming the tiers that have them.
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile

from ..errors import UnsupportedRule

#: the file data a workspace may hold to be copied in (the guest's tmpfs is a little
#: larger, for the tar's own blocks)
MAX_BYTES = 64 << 20
MAX_ENTRIES = 20_000
#: directories nested deeper are refused (the walk recurses, holding an fd per level)
MAX_DEPTH = 128
#: the one destination the guest has a mount for
DEST = "/workspace"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: O_NONBLOCK: an entry listed as a regular file but swapped for a FIFO before the open
#: must not block the open forever (it is then seen as not regular on the fd, and skipped)
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def pack(path: str) -> tuple[bytes, int]:
    """The workspace at `path` as an uncompressed tar: (bytes, entries left out)."""
    from ..linux.hostpath import open_nofollow

    held = open_nofollow(path, directory=True)
    try:
        # the inode held, reopened for reading (the magic link is followed to it only)
        top = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(held)
    buf = io.BytesIO()
    state = {"bytes": 0, "entries": 0, "skipped": 0}
    try:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _walk(tar, top, "", state)
    finally:
        os.close(top)
    return buf.getvalue(), state["skipped"]


def _walk(tar: tarfile.TarFile, dfd: int, rel: str, state: dict, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise UnsupportedRule(f"the workspace nests directories more than {MAX_DEPTH} deep, "
                              f"more than the microvm tier copies in; use a shallower "
                              f"workspace or isolation = \"namespace\"", field="workspace")
    with os.scandir(dfd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        name = posixpath.join(rel, e.name) if rel else e.name
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:   # gone since the listing
            state["skipped"] += 1
            continue
        state["entries"] += 1
        if state["entries"] > MAX_ENTRIES:
            raise UnsupportedRule(f"the workspace holds more than {MAX_ENTRIES} entries, "
                                  f"more than the microvm tier copies in; use a smaller "
                                  f"workspace or isolation = \"namespace\"", field="workspace")
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = stat.S_IMODE(st.st_mode) & 0o755, int(st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            try:   # swapped since the listing (a link, a FIFO, gone): left out
                sub = os.open(e.name, _DIR, dir_fd=dfd)
            except OSError:
                state["skipped"] += 1
                continue
            try:
                tar.addfile(info)
                _walk(tar, sub, name, state, depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = os.open(e.name, _FILE, dir_fd=dfd)
            except OSError:
                state["skipped"] += 1
                continue
            try:
                fst = os.fstat(fd)
                if not stat.S_ISREG(fst.st_mode):   # swapped since the listing
                    state["skipped"] += 1
                    continue
                state["bytes"] += fst.st_size
                if state["bytes"] > MAX_BYTES:
                    raise UnsupportedRule(
                        f"the workspace holds more than {MAX_BYTES >> 20} MiB, more than "
                        f"the microvm tier copies in; use a smaller workspace or "
                        f"isolation = \"namespace\"", field="workspace")
                with os.fdopen(fd, "rb", closefd=False) as f:
                    data = f.read(fst.st_size)   # what it holds now, at most its size
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            finally:
                os.close(fd)
        elif stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(e.name, dir_fd=dfd)
            except OSError:   # swapped since the listing
                state["skipped"] += 1
                continue
            inside = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
            if target.startswith("/") or inside == ".." or inside.startswith("../"):
                state["skipped"] += 1
                continue
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
        else:
            state["skipped"] += 1


def check(op) -> str | None:
    """Why this workspace cannot be given on microvm, or None."""
    if op.writable or op.review:
        return ("the microvm tier copies a workspace in read-only (no host directory is "
                "shared with its guest); use mode = \"ro\", or isolation = \"namespace\" or "
                "\"gvisor\" for mode = \"rw\" or \"review\"")
    if op.dest != DEST:
        return (f"the microvm tier gives the workspace at {DEST} only; drop "
                f"workspace.mount_at, or use isolation = \"namespace\"")
    return None
