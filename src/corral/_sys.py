"""The few libc calls the standard library lacks: mount, umount2, prctl. Via ctypes."""

from __future__ import annotations

import _thread
import ctypes
import errno as _errno
import os

EINVAL = _errno.EINVAL
ENOENT = _errno.ENOENT
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong)


def mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode(), flags,
                   data.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def umount(target: str) -> int:
    """umount2(MNT_DETACH); returns 0 or the errno."""
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        return ctypes.get_errno()
    return 0


def set_pdeathsig(sig: int) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


PR_SET_CHILD_SUBREAPER = 36
_subreaper_users = 0
_subreaper_lock = _thread.allocate_lock()


def subreaper_acquire() -> None:
    """Make this process the reaper of its orphaned descendants while sandboxes run.

    bubblewrap's init process (pid 1 of the sandbox) outlives bubblewrap's monitor by a
    moment; without this it would be reparented to the host's init, which inside some
    containers never reaps it. Counted, so concurrent runs share it."""
    global _subreaper_users
    with _subreaper_lock:
        if _subreaper_users == 0:
            _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _subreaper_users += 1


def subreaper_release() -> None:
    global _subreaper_users
    with _subreaper_lock:
        _subreaper_users -= 1
        if _subreaper_users == 0:
            _libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


#: setresuid/setresgid syscall numbers, for a change of one thread's ids only (real_ids)
_SETRES = {"x86_64": (117, 119), "aarch64": (147, 149)}.get(os.uname().machine)


class real_ids:
    """`with real_ids(uid, gid):` this thread's *real* uid and gid are uid:gid; its effective
    and saved ids (root) and its capabilities stay as they are, and so do every other
    thread's. Raw syscalls: glibc's setresuid() would change every thread of the process.

    For prlimit(2) on a process of the sandbox's uid: the kernel allows it to a caller
    whose real ids match the target's, or with CAP_SYS_RESOURCE, which root in a container
    may lack. Nothing else runs in this thread meanwhile (a thread or child started from it
    inside the block would copy the real ids)."""

    __slots__ = ("_was", "gid", "uid")

    def __init__(self, uid: int, gid: int) -> None:
        self.uid, self.gid = uid, gid
        self._was = (0, 0)

    @staticmethod
    def _set(nr: int, value: int) -> None:
        if _libc.syscall(nr, value, -1, -1) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def __enter__(self) -> None:
        if _SETRES is None:   # another architecture: prlimit needs CAP_SYS_RESOURCE there
            return
        self._was = (os.getuid(), os.getgid())   # this thread's (raw syscalls too)
        self._set(_SETRES[1], self.gid)
        try:
            self._set(_SETRES[0], self.uid)
        except BaseException:
            self._set(_SETRES[1], self._was[1])
            raise

    def __exit__(self, *exc) -> None:
        if _SETRES is None:
            return
        self._set(_SETRES[0], self._was[0])
        self._set(_SETRES[1], self._was[1])
