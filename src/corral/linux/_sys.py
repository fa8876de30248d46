"""The few libc calls the standard library lacks (mount, umount2, prctl, capget/capset), prlimit
(the `resource` module's is an extension module of its own to load, ~0.2 ms of every
`corral run`, for one call) and the per-thread id changes glibc does not offer (raw
syscalls).

Through `_csys`, a small C module of corral's own (_csys.c, built by scripts/setup.sh),
or, where it was not built, the same calls through ctypes (_sys_ctypes.py): loading
ctypes, making its C types and each function's first call (its argument conversions
and call interface) cost `corral run` 0.5 to 3 ms of CPU, the C module's load about 0.15
ms (docs/architecture.md, session 15). CORRAL_SYS_CTYPES=1 in the environment takes
ctypes (the tests run both).
`_libc`, a whole `ctypes.CDLL(None, use_errno=True)`, is made on first use for the modules
off the run path that call other functions (enter, process_reaper, gvisor_runsc)."""

from __future__ import annotations

import _thread
import errno as _errno
import os
import sys

if os.environ.get("CORRAL_SYS_CTYPES") == "1":
    from . import _sys_ctypes as _calls
else:
    try:
        from . import _csys as _calls
    except ImportError:   # not built (a plain pip install): the same calls through ctypes
        from . import _sys_ctypes as _calls

EINVAL = _errno.EINVAL
ENOENT = _errno.ENOENT
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
PR_SET_PDEATHSIG = 1
#: resource numbers of the rlimits (x86_64 Linux; the `resource` module's RLIMIT_* values,
#: tests/linux/test_limits.py)
RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE, RLIMIT_NPROC, RLIMIT_NOFILE = 0, 1, 4, 6, 7

_mount, _umount2, _prctl, _prlimit, _syscall, _get_errno = (
    _calls.mount, _calls.umount2, _calls.prctl, _calls.prlimit, _calls.syscall,
    _calls.get_errno)


def _u32s(*values: int) -> bytearray:
    """A C array of uint32 (capget's header and sets, setgroups' list), to pass by pointer."""
    return bytearray(b"".join(v.to_bytes(4, sys.byteorder) for v in values))


def __getattr__(name: str):
    if name == "_libc":
        import ctypes

        global _libc
        _libc = ctypes.CDLL(None, use_errno=True)   # typed as the functions above
        _libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.c_ulong, ctypes.c_char_p)
        _libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
        _libc.prctl.argtypes = (ctypes.c_int, *(ctypes.c_ulong,) * 4)
        return _libc
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    if _mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
        e = _get_errno()
        raise OSError(e, os.strerror(e), target)


def prlimit(pid: int, which: int, soft: int, hard: int) -> None:
    """prlimit(2): set rlimit `which` of process `pid` (0: this one) to soft and hard (each
    0 to 2**64 - 1). OSError with the errno if the kernel refuses."""
    if _prlimit(pid, which, soft, hard) != 0:
        e = _get_errno()
        raise OSError(e, os.strerror(e))


def umount(target: str) -> int:
    """umount2(MNT_DETACH); returns 0 or the errno."""
    if _umount2(target.encode(), MNT_DETACH) != 0:
        return _get_errno()
    return 0


def set_pdeathsig(sig: int) -> None:
    _prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


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
            _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _subreaper_users += 1


def become_subreaper() -> None:
    """This process is a child subreaper from now on (for a process that reaps all its
    children; not counted, never released)."""
    if _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        e = _get_errno()
        raise OSError(e, os.strerror(e))


def subreaper_release() -> None:
    global _subreaper_users
    with _subreaper_lock:
        _subreaper_users -= 1
        if _subreaper_users == 0:
            _prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


#: setresuid/setresgid/setgroups syscall numbers, for a change of one thread's ids only
#: (real_ids, child_ids)
_SETRES = {"x86_64": (117, 119, 116), "aarch64": (147, 149, 159)}.get(os.uname().machine)


def _raw(nr: int, *args) -> None:
    """A raw syscall (glibc's wrappers of the id calls act on every thread)."""
    if _syscall(nr, *args) != 0:
        e = _get_errno()
        raise OSError(e, os.strerror(e))


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

    def __enter__(self) -> None:
        if _SETRES is None:   # another architecture: prlimit needs CAP_SYS_RESOURCE there
            return
        self._was = (os.getuid(), os.getgid())   # this thread's (raw syscalls too)
        _raw(_SETRES[1], self.gid, -1, -1)
        try:
            _raw(_SETRES[0], self.uid, -1, -1)
        except BaseException:
            _raw(_SETRES[1], self._was[1], -1, -1)
            raise

    def __exit__(self, *exc) -> None:
        if _SETRES is None:
            return
        _raw(_SETRES[0], self._was[0], -1, -1)
        _raw(_SETRES[1], self._was[1], -1, -1)


PR_GET_PDEATHSIG = 2
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_GET_SECUREBITS = 27
#: capget/capset syscall numbers, and the header of version 3 (two 32-bit words of sets)
_CAPS = {"x86_64": (125, 126), "aarch64": (90, 91)}.get(os.uname().machine)
_CAP_V3 = 0x20080522
_child_ids_lock = _thread.allocate_lock()
_child_ids_ok: bool | None = None


def _keepcaps(on: int) -> None:
    if _prctl(PR_SET_KEEPCAPS, on, 0, 0, 0) != 0:
        e = _get_errno()
        raise OSError(e, os.strerror(e))


class child_ids:
    """`with child_ids(uid, gid):` this thread, and only it, has uid:gid as its real,
    effective and saved ids and no supplementary groups. A child this thread starts with
    vfork (CLONE_VM: no page tables copied, no copy-on-write) then carries exactly those
    ids from its first instruction, without calling setuid(2) itself, which a vfork child
    must not do (glibc's setuid signals every thread of the memory it shares).

    To come back, the thread keeps its capabilities in its permitted set meanwhile
    (PR_SET_KEEPCAPS; the effective set is empty): the child copies them, and its exec of
    a plain file (as a uid that is not 0, with no ambient capabilities: `usable()`
    checks) leaves it none, as setuid would have. Changing the effective ids clears the
    process's dumpable flag and this thread's parent-death signal: both are put back.
    `usable()` says whether this thread is in the plain state this relies on (all ids 0,
    no ambient capabilities, no securebits, dumpable 0 or 1), and so what the way back
    restores; callers fork and setuid in the child otherwise. One thread at a time (a
    lock: the dumpable flag is the whole process's). A Python signal handler that runs
    inside the block (the main thread's, at a bytecode boundary) runs as uid:gid too:
    with less privilege, never more."""

    __slots__ = ("_caps", "_dumpable", "_groups", "_pdeathsig", "gid", "uid")

    def __init__(self, uid: int, gid: int) -> None:
        self.uid, self.gid = uid, gid

    @staticmethod
    def usable() -> bool:
        global _child_ids_ok
        if _child_ids_ok is None:   # what does not change: the machine, ambient capabilities
            ok = _SETRES is not None and _CAPS is not None
            if ok:
                with open("/proc/self/status", "rb") as f:
                    amb = [ln for ln in f.read().splitlines() if ln.startswith(b"CapAmb:")]
                ok = len(amb) == 1 and int(amb[0].split()[1], 16) == 0
            _child_ids_ok = ok
        return (_child_ids_ok and os.getresuid() == (0, 0, 0) and os.getresgid() == (0, 0, 0)
                and _prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) == 0
                and _prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) in (0, 1))

    def __enter__(self) -> None:
        _child_ids_lock.acquire()
        try:
            sig = bytearray(4)   # an int
            _prctl(PR_GET_PDEATHSIG, sig, 0, 0, 0)
            self._pdeathsig = int.from_bytes(sig, sys.byteorder, signed=True)
            self._dumpable = _prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
            self._groups = os.getgroups()
            self._caps = bytearray(24)   # three pairs of 32-bit sets
            _raw(_CAPS[0], _u32s(_CAP_V3, 0), self._caps)
            try:
                _keepcaps(1)
                _raw(_SETRES[2], 0, None)                      # setgroups(0, NULL)
                _raw(_SETRES[1], self.gid, self.gid, self.gid)
                _raw(_SETRES[0], self.uid, self.uid, self.uid)
            except BaseException:
                self._restore()
                raise
        except BaseException:
            _child_ids_lock.release()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self._restore()
        finally:
            _child_ids_lock.release()

    def _restore(self) -> None:
        header = _u32s(_CAP_V3, 0)
        _raw(_CAPS[1], header, self._caps)  # CAP_SETUID effective again, from permitted
        _raw(_SETRES[0], 0, 0, 0)
        _raw(_SETRES[1], 0, 0, 0)
        _raw(_SETRES[2], len(self._groups), _u32s(*self._groups) or None)
        _keepcaps(0)
        _raw(_CAPS[1], header, self._caps)  # exactly as before (setuid(0) raised them all)
        _prctl(PR_SET_DUMPABLE, self._dumpable, 0, 0, 0)
        _prctl(PR_SET_PDEATHSIG, self._pdeathsig, 0, 0, 0)


def _after_fork_in_child() -> None:
    """A child of os.fork() starts with one thread: a lock another thread of the parent
    held would never be released, and no process is a subreaper after a fork."""
    global _child_ids_lock, _subreaper_lock, _subreaper_users
    _child_ids_lock = _thread.allocate_lock()
    _subreaper_lock = _thread.allocate_lock()
    _subreaper_users = 0


os.register_at_fork(after_in_child=_after_fork_in_child)
