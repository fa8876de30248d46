"""Path resolution that cannot leave a directory tree, and the few calls around it that the
standard library lacks: openat2(2), fstatfs(2)'s filesystem type, inotify(7), and
per-thread filesystem ids.

openat2 with RESOLVE_IN_ROOT resolves a path as if the dirfd were "/": `..` stops at it and
an absolute symbolic link (`/etc/shadow`) starts from it, so a sandbox's own links stay in
the sandbox's tree however they are written. RESOLVE_BENEATH refuses (EXDEV) any step that
would leave the dirfd instead. RESOLVE_NO_MAGICLINKS refuses /proc/PID/fd/N-style links,
which jump to whatever file a process holds, wherever it is. The kernel does the walk
atomically with respect to renames (a racing rename gives EAGAIN, retried here), so nothing
swapped under the walk can send it out. Linux >= 5.6.

`fs_ids` gives the calling thread, and only it, another uid/gid for file permission checks
(setfsuid/setfsgid and an empty group list, raw syscalls): file operations done for a
sandbox are then checked, and what they create is owned, as the sandbox's own user.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import struct

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
#: openat2's number is the same on every architecture (a syscall added after the unified table)
SYS_OPENAT2 = 437
#: racing renames make a RESOLVE_IN_ROOT/BENEATH walk fail with EAGAIN; tries before giving up
EAGAIN_TRIES = 64

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str | bytes, flags: int, resolve: int, mode: int = 0) -> int:
    """An fd for path resolved from dirfd under `resolve` (RESOLVE_* flags). O_CLOEXEC is
    always added. Raises OSError (ENOSYS on a kernel before 5.6: callers refuse then)."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    name = os.fsencode(path)
    if b"\0" in name:
        raise OSError(_errno.EINVAL, "a path with a NUL byte", os.fsdecode(name))
    for _ in range(EAGAIN_TRIES):
        fd = _libc.syscall(SYS_OPENAT2, dirfd, name, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        e = ctypes.get_errno()
        if e not in (_errno.EAGAIN, _errno.EINTR):
            raise OSError(e, os.strerror(e), os.fsdecode(name))
    raise OSError(_errno.EAGAIN, "the path kept changing under the walk", os.fsdecode(name))


def available() -> bool:
    """Whether this kernel has openat2 (a probe on "/": no file is opened for I/O)."""
    try:
        os.close(openat2(-100, "/", os.O_PATH, RESOLVE_NO_MAGICLINKS))  # AT_FDCWD
    except OSError as e:
        if e.errno == _errno.ENOSYS:
            return False
        raise
    return True


# -- filesystem types ---------------------------------------------------------------------
#: kernel interfaces that look like files (statfs f_type): what a sandbox's /proc, /sys,
#: /dev/pts hold is a window on a kernel, never data to read or write through a files API
KERNEL_FS = {
    0x9FA0: "proc", 0x62656572: "sysfs", 0x63677270: "cgroup2", 0x27E0EB: "cgroup",
    0x1CD1: "devpts", 0x64626720: "debugfs", 0x74726163: "tracefs", 0x73636673: "securityfs",
    0xCAFE4A11: "bpf", 0xF97CFF8C: "selinuxfs", 0x6165676C: "pstore", 0xDE5E81E4: "efivarfs",
    0x62656570: "configfs", 0x65735543: "fusectl", 0x42494E4D: "binfmt_misc",
    0x19800202: "mqueue", 0x6E736673: "nsfs",
}
_libc.fstatfs.argtypes = (ctypes.c_int, ctypes.c_void_p)


def fs_type(fd: int) -> int:
    """statfs(2)'s f_type of the filesystem holding fd (an O_PATH fd will do)."""
    buf = ctypes.create_string_buffer(256)   # struct statfs is 120 bytes on 64-bit Linux
    if _libc.fstatfs(fd, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return struct.unpack_from("l", buf.raw)[0] & 0xFFFFFFFF


# -- inotify -----------------------------------------------------------------------------
IN_ACCESS = 0x1
IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
#: struct inotify_event's fixed part: wd, mask, cookie, len
EVENT_HEAD = struct.Struct("iIII")
_libc.inotify_init1.argtypes = (ctypes.c_int,)
_libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
_libc.inotify_rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)


def inotify_init() -> int:
    fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return fd


def inotify_watch_fd(ifd: int, dirfd: int, mask: int) -> int:
    """Watch the directory held by `dirfd` (an O_PATH fd opened safely). inotify takes a
    path, never an fd: /proc/self/fd/N is the kernel's magic link to exactly the inode
    this process holds as fd N, already resolved, so nothing is looked up by name again
    (IN_ONLYDIR: it must still be a directory). Returns the watch descriptor."""
    wd = _libc.inotify_add_watch(ifd, f"/proc/self/fd/{dirfd}".encode(), mask | IN_ONLYDIR)
    if wd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return wd


def inotify_unwatch(ifd: int, wd: int) -> None:
    _libc.inotify_rm_watch(ifd, wd)   # EINVAL once the kernel dropped it itself: fine


def inotify_events(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(wd, mask, cookie, name) for each event in what one read of an inotify fd gave
    (the kernel writes whole events only)."""
    out = []
    off = 0
    while off + EVENT_HEAD.size <= len(data):
        wd, mask, cookie, n = EVENT_HEAD.unpack_from(data, off)
        off += EVENT_HEAD.size
        name = data[off:off + n].split(b"\0", 1)[0]
        off += n
        out.append((wd, mask, cookie, name))
    return out


# -- per-thread filesystem ids -----------------------------------------------------------
#: setfsuid, setfsgid, setgroups; capget, capset
_NR = {"x86_64": (122, 123, 116, 125, 126), "aarch64": (151, 152, 159, 90, 91)}.get(
    os.uname().machine)
_CAP_V3 = 0x20080522


def _sys(nr: int, *args) -> int:
    r = _libc.syscall(nr, *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


class fs_ids:
    """`with fs_ids(uid, gid):` this thread's file permission checks and the owner of the
    files it creates are uid:gid with no supplementary groups (setfsuid, setfsgid and
    setgroups as raw syscalls: per thread; glibc's setgroups would change every thread).
    A fsuid other than 0 takes CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN and the other file
    capabilities out of this thread's effective set; back to 0 puts them back. Nothing
    happens when the process is not root and uid:gid are its own ids; another uid without
    root is refused (PermissionError).

    Keep the block to file system calls: a Python finalizer that runs in it runs with
    those ids too (with less privilege, never more)."""

    __slots__ = ("_caps", "_groups", "_noop", "_was", "gid", "uid")

    def __init__(self, uid: int, gid: int) -> None:
        self.uid, self.gid = uid, gid
        self._noop = False

    def __enter__(self) -> None:
        if os.geteuid() != 0:
            if (self.uid, self.gid) != (os.getuid(), os.getgid()):
                raise PermissionError(_errno.EPERM, "acting as another uid needs root")
            self._noop = True
            return
        if _NR is None:
            raise OSError(_errno.ENOSYS, f"per-thread ids on {os.uname().machine}")
        self._groups = os.getgroups()
        self._was = (_libc.syscall(_NR[0], -1), _libc.syscall(_NR[1], -1))  # nests
        self._caps = (ctypes.c_uint32 * 6)()
        _sys(_NR[3], (ctypes.c_uint32 * 2)(_CAP_V3, 0), self._caps)
        _sys(_NR[2], 0, None)
        try:
            _libc.syscall(_NR[1], self.gid)
            _libc.syscall(_NR[0], self.uid)
            # setfsuid reports the old value, never an error: read back (-1 changes nothing)
            if (_libc.syscall(_NR[0], -1) != self.uid
                    or _libc.syscall(_NR[1], -1) != self.gid):
                raise PermissionError(_errno.EPERM, "setfsuid/setfsgid did not take")
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc) -> None:
        if not self._noop:
            self._restore()

    def _restore(self) -> None:
        _libc.syscall(_NR[0], self._was[0])
        _libc.syscall(_NR[1], self._was[1])
        groups = (ctypes.c_uint * len(self._groups))(*self._groups)
        _sys(_NR[2], len(self._groups), groups)
        _sys(_NR[4], (ctypes.c_uint32 * 2)(_CAP_V3, 0), self._caps)
