"""Host paths a policy names (the workspace, ro_binds), checked and opened without ever
following a symbolic link.

A path is only a name, and names change. An earlier read-write run can leave `sub -> /etc`
in a workspace; a concurrent one can swap a directory for a link between the policy's check
and the mount. Following either would hand the sandbox a host directory nobody named, and
on the idmapped workspace its owner becomes the sandbox's root (`cat /etc/shadow` worked
that way). So:

 1. at policy load, a path with a symbolic link at any component is refused (links(), with
    the component named in the error), and so is a system tree (policy/load.py's SYSTEM_TREES) as a whole;
 2. when a sandbox is built, the path is opened component by component from "/" with
    O_PATH | O_NOFOLLOW (open_nofollow()): every step is relative to the directory fd the
    step before got, and a link at any step is refused. The tiers then use only that fd
    (an idmapped clone of it, bwrap's --bind-fd, a Landlock rule on it), never the name
    again, so nothing swapped after this open reaches the sandbox.

Standard library only: the start-up path of `corral run` imports it.
"""

from __future__ import annotations

import errno
import os
import stat

#: host trees never bound or used as a workspace whole (a directory inside one may be)


class LinkInPath(OSError):
    """A component of a path is a symbolic link (ELOOP). `link` is that component."""

    def __init__(self, path: str, link: str) -> None:
        super().__init__(errno.ELOOP, f"{link} is a symbolic link", path)
        self.link = link


def components(path: str) -> list[str]:
    """The names of an absolute path ('.' and empty parts dropped); '..' is refused."""
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not absolute")
    parts = [p for p in path.split("/") if p and p != "."]
    if ".." in parts:
        raise ValueError(f"{path!r} contains '..'")
    return parts


def open_nofollow(path: str, *, directory: bool = False) -> int:
    """An O_PATH, close-on-exec fd of `path`, reached from "/" one component at a time
    without following a symbolic link at any of them. Raises LinkInPath for a link,
    NotADirectoryError / FileNotFoundError / PermissionError as open(2) would (and
    NotADirectoryError when `directory` and the last component is not one).

    Each component is opened with O_PATH | O_NOFOLLOW relative to the fd of the one
    before, so a rename or a swap on the way can only give a directory that really held
    the next name when it was opened, never the target of a link. (openat2's
    RESOLVE_NO_SYMLINKS does the same in one call on Linux 5.6+; this works everywhere and
    needs no ctypes.) Mount points are crossed as usual."""
    parts = components(path)
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags | os.O_DIRECTORY)
    try:
        cur = ""
        for i, name in enumerate(parts):
            cur += "/" + name
            nfd = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nfd
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise LinkInPath(path, cur)
            if (i < len(parts) - 1 or directory) and not stat.S_ISDIR(mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", cur)
        return fd
    except BaseException:
        os.close(fd)
        raise
