"""Idmapped bind mounts: show a host directory to a sandbox uid as if the sandbox owned it.

corral runs each sandbox as a dedicated host uid X (the sandbox's uid 0 is X on the host). A
workspace belongs to somebody else: owner O, group G, any mode. Instead of chown-ing it or
opening its mode, the root supervisor makes an *idmapped* bind of it on the host and lets
bubblewrap bind that mount into the sandbox:

    host disk     idmapped mount (dst)     inside bwrap (0 -> X)
    O:G    <->    X:X                 <->    0:0

Reading: a file stored as O:G appears as X:X through dst (and so as 0:0 in the sandbox).
Writing: a file created through dst by uid X is stored on disk as O:G. Nothing else is
mapped: files of other owners appear as nobody (65534) and only their "other" bits apply,
and a caller whose uid is unmapped (host root, unless O is 0) cannot create files through
dst (EOVERFLOW); the supervisor works on src, never on dst.

The steps, each one syscall (Linux 5.12+, a filesystem with FS_ALLOW_IDMAP: ext4, xfs,
btrfs, tmpfs, f2fs, overlayfs, ...; not NFS, not 9p):

1. a user namespace holding the mapping: a child made with clone(CLONE_NEWUSER|CLONE_VM|
   CLONE_VFORK) exits at once; while it is a zombie, open /proc/PID/ns/user and write
   /proc/PID/uid_map "O X 1" and gid_map "G X 1" (root may, with CAP_SETUID/CAP_SETGID over
   the parent namespace; no setgroups "deny" is needed); reap it. The namespace lives on
   through the fd. (A forked child that unshares and waits on a pipe works too, but fork
   costs ~1 ms for a small supervisor, 13 ms with 1 GiB of heap, and forks a threaded
   process; this costs ~0.3 ms whatever the heap.)
2. open_tree(src, OPEN_TREE_CLONE): a detached copy of the mount at src, *not* recursive.
   A workspace rarely holds submounts; when it does, they stay hidden (the sandbox sees the
   directories beneath them), which is the safe side: nothing the user did not name is
   exposed, and a submount whose filesystem cannot be idmapped (proc, NFS, ...) cannot make
   the whole workspace fail. A recursive clone would need every submount to be idmappable.
3. mount_setattr(fd, "", AT_EMPTY_PATH, {IDMAP|NOSUID|NODEV[|RDONLY], userns_fd}).
   The mount keeps the mapping (recent kernels copy it, older ones hold a reference to the
   namespace), so the namespace fd is closed right after.
4. move_mount(fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH). A symlink at dst is not
   followed (no MOVE_MOUNT_T_SYMLINKS).

Limits to know:

- nosuid/nodev on the idmapped mount protect only executions *through that mount*. On a
  read-write workspace the sandbox may chmod u+s (or set security.capability) on a file it
  owns through the mount, and the file lands on disk owned by O with that bit. Through the
  host's own path to the workspace the bit is honoured, unless that filesystem is nosuid.
  For O = 0 this is a root-owned setuid file that any host user can run (tested). bwrap's
  nosuid binds and no_new_privs stop its use inside sandboxes, but not on the host, so a
  read-write mapping of uid or gid 0 is refused unless the caller says the sandbox cannot
  set those bits (setid_blocked=True): its seccomp filter must refuse S_ISUID/S_ISGID in
  chmod, fchmod, fchmodat, fchmodat2 and in open/openat/creat/mknod/mknodat modes, and
  refuse openat2 and io_uring (their modes cannot be inspected). File capabilities need
  CAP_SETFCAP, which bwrap drops (setxattr security.capability gets EPERM).
  For O != 0 the same lets host users run a setuid-O file: the workspace owner's problem.
- The mount inherits the propagation of dst's parent mount. If that is shared, the mount
  propagates to its peers and slaves; keep corral's run directory on a private mount.
- The path to dst must be searchable by uid X (bwrap runs as X and binds dst by path).
"""

from __future__ import annotations

import _signal
import _thread
import ctypes
import errno as _errno
import os
import platform
import signal

from corral.errors import SandboxSetupError

__all__ = ["idmapped_bind", "readonly_bind", "supported", "unmount"]

STEP = "workspace-idmap"
FIELD = "filesystem.workspace"

# Since 5.1 (pidfd_send_signal, 424) every architecture uses the same numbers for new system
# calls (alpha adds 110; x32 would add 0x40000000 and is not listed).
_NR = {"open_tree": 428, "move_mount": 429, "mount_setattr": 442}
_UNIFIED_TABLE = {"x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "ppc64", "s390x",
                  "loongarch64", "armv7l", "armv8l", "i686", "i386"}

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8
CLONE_NEWUSER = 0x10000000
CLONE_VM = 0x100
CLONE_VFORK = 0x4000
CLONE_PIDFD = 0x1000
_CHILD_STACK = 16384


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


_libc_handle: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _libc_handle
    if _libc_handle is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.clone.restype = ctypes.c_int
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _libc_handle = libc
    return _libc_handle


def _child_fn() -> int:
    """Address of the helper child's function: libc's abs(int), pure, returns 0 for 0."""
    fn = ctypes.cast(_libc().abs, ctypes.c_void_p).value
    if not fn:
        raise OSError(_errno.ENOSYS, "clone(CLONE_NEWUSER): libc has no abs()")
    return fn


def _check(ret: int, call: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{call}: {os.strerror(e)}")
    return ret


def _syscall(name: str, *args: object) -> int:
    if platform.machine() not in _UNIFIED_TABLE:
        raise OSError(_errno.ENOSYS, f"{name}: no syscall number known for {platform.machine()}")
    return _check(_libc().syscall(ctypes.c_long(_NR[name]), *args), name)


def _open_tree(src: str | int, flags: int = 0) -> int:
    """A detached clone of the mount at src: a path, or an fd (an O_PATH fd opened without
    following links, hostpath.open_nofollow: then no name is looked up here at all)."""
    if isinstance(src, int):
        return _syscall("open_tree", ctypes.c_int(src), b"",
                        ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH
                                      | flags))
    return _syscall("open_tree", ctypes.c_int(AT_FDCWD), os.fsencode(src),
                    ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | flags))


def _set_idmap(tree_fd: int, userns_fd: int, attr_set: int) -> None:
    attr = _MountAttr(attr_set=attr_set | MOUNT_ATTR_IDMAP, userns_fd=userns_fd)
    _syscall("mount_setattr", ctypes.c_int(tree_fd), b"", ctypes.c_uint(AT_EMPTY_PATH),
             ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))


def _move_mount(tree_fd: int, dst: str) -> None:
    _syscall("move_mount", ctypes.c_int(tree_fd), b"", ctypes.c_int(AT_FDCWD),
             os.fsencode(dst), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH))


def _userns(uid_map: tuple[int, int], gid_map: tuple[int, int]) -> int:
    """A user namespace mapping uid_map[0] -> uid_map[1] and gid_map[0] -> gid_map[1]."""
    return userns([uid_map], [gid_map])


def userns(uids: list[tuple[int, int]], gids: list[tuple[int, int]], *,
           owner: int | None = None) -> int:
    """A user namespace where each (inside, host) pair of `uids` and `gids` maps one id;
    nothing else is mapped.

    `owner` (a host uid, corral being root): the namespace is made by this thread holding
    that uid (_sys.child_ids), so it belongs to it: a process of that uid (bwrap, dropped
    to the sandbox's uid) may then join it (bwrap --userns), and setgroups(2) is denied in
    it as in one bwrap makes. Without `owner` it belongs to this process's uid.

    Returns an O_CLOEXEC fd of it. The namespace comes from a child made with
    clone(CLONE_NEWUSER | CLONE_VM | CLONE_VFORK) that runs no Python and no syscall: its
    function is libc's abs(), so it exits at once, and clone returns when it has. Its files
    in /proc still reach the namespace until it is reaped (maps are written through the
    namespace held by the open file), so the maps are written while it is a zombie. No fork:
    the cost does not grow with the supervisor's memory, and a threaded supervisor is safe.
    A pidfd proves the files opened belong to our child and not to a reused pid.
    """
    libc = _libc()
    stack = ctypes.create_string_buffer(_CHILD_STACK)
    top = (ctypes.addressof(stack) + _CHILD_STACK) & ~15
    pidfd = ctypes.c_int(-1)
    flags = CLONE_NEWUSER | CLONE_VM | CLONE_VFORK | CLONE_PIDFD | signal.SIGCHLD
    # The child runs on `stack` in our memory: keep every signal handler out of it. (The
    # C functions of _signal: plain ints, not the ~60 Signals members signal's make.)
    old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    try:
        if owner is None:
            pid = libc.clone(ctypes.c_void_p(_child_fn()), ctypes.c_void_p(top),
                             ctypes.c_int(flags), ctypes.c_void_p(0), ctypes.byref(pidfd))
            err = ctypes.get_errno()
        else:
            from ._sys import child_ids

            with child_ids(owner, owner):
                pid = libc.clone(ctypes.c_void_p(_child_fn()), ctypes.c_void_p(top),
                                 ctypes.c_int(flags), ctypes.c_void_p(0),
                                 ctypes.byref(pidfd))
                err = ctypes.get_errno()   # before the way back's own syscalls
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old)
    if pid < 0:
        raise OSError(err, f"clone(CLONE_NEWUSER): {os.strerror(err)}")
    fds: list[int] = []
    try:
        ns = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        fds.append(ns)
        maps = [os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
                for name in ("uid_map", "gid_map")]
        fds += maps
        signal.pidfd_send_signal(pidfd.value, 0)  # ESRCH if someone reaped our child
        if owner is not None:    # before gid_map, or the kernel refuses it
            sg = os.open(f"/proc/{pid}/setgroups", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(sg, b"deny")
            finally:
                os.close(sg)
        # One write(2) each: the kernel takes a map whole or not at all.
        for fd, pairs in zip(maps, (uids, gids)):
            os.write(fd, "".join(f"{inside} {host} 1\n" for inside, host in pairs).encode())
        fds.remove(ns)
        return ns
    finally:
        for fd in fds:
            os.close(fd)
        try:
            os.waitid(os.P_PIDFD, pidfd.value, os.WEXITED)  # reaps our child, never a reused pid
        except ChildProcessError:  # reaped by someone's waitpid(-1); ESRCH above then
            pass
        finally:
            os.close(pidfd.value)


def _name(src: str | int) -> str:
    """A path, or what an fd's /proc link names (for messages: it is never opened)."""
    if isinstance(src, str):
        return src
    try:
        return os.readlink(f"/proc/self/fd/{src}")
    except OSError:
        return f"(fd {src})"


def _fstype(path: str) -> str:
    """The filesystem type at path, from /proc/self/mountinfo; "" if unknown."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                mnt_id = next(ln.split()[1] for ln in f if ln.startswith("mnt_id:"))
        finally:
            os.close(fd)
        with open("/proc/self/mountinfo") as f:
            for ln in f:
                fields = ln.split()
                if fields[0] == mnt_id:
                    return fields[fields.index("-") + 1]
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    return ""


def _reason(e: OSError, call: str, src: str, x: int | None, readonly: bool | None) -> str:
    """One line naming what failed and the fix."""
    who = f"uid {x}" if x is not None else "the sandbox uid"
    access = ("readable (ro) by " if readonly else "writable (rw) by ") if readonly is not None \
        else "readable (ro) / writable (rw) by "
    fallback = f"make the workspace {access}{who}"
    n = e.errno
    if n == _errno.ENOSYS:
        return (f"this kernel has no idmapped mounts ({call}: ENOSYS; Linux 5.12+ needed); "
                f"{fallback}, or upgrade the kernel")
    if call == "open_tree" and n in (_errno.ENOENT, _errno.ENOTDIR):
        return f"workspace {src} does not exist; create it or fix the path"
    if call == "open_tree" and n == _errno.EACCES:
        return f"cannot open workspace {src} (EACCES); fix the permissions of its parents"
    if call == "mount_setattr" and n == _errno.EINVAL:
        fs = _fstype(src)
        fs = f"the {fs} filesystem" if fs else "this filesystem"
        return (f"{fs} at {src} does not support idmapped mounts; {fallback}, "
                f"or move it to ext4/xfs/btrfs/tmpfs")
    if n == _errno.EPERM:
        return (f"idmapped mounts need root on the host ({call}: EPERM); run corral as root, "
                f"or {fallback}")
    if call == "clone(CLONE_NEWUSER)" and n == _errno.ENOSPC:
        return ("cannot create a user namespace for the idmap (ENOSPC); "
                "raise sysctl user.max_user_namespaces")
    if call == "move_mount":
        return f"cannot mount the workspace on {src}: {os.strerror(n)}"
    return f"{call} failed for {src}: {os.strerror(n or 0)}"


def _error(e: OSError, call: str, src: str, x: int | None, readonly: bool | None
           ) -> SandboxSetupError:
    return SandboxSetupError(_reason(e, call, src, x, readonly), step=STEP, errno=e.errno,
                             field=FIELD)


def idmapped_bind(src: str | int, dst: str, *, uid_map: tuple[int, int],
                  gid_map: tuple[int, int], readonly: bool,
                  setid_blocked: bool = False, check_owner: bool = True) -> None:
    """Mount src on dst (an existing empty directory) with uid_map[0] shown as uid_map[1]
    and gid_map[0] as gid_map[1]; nosuid, nodev, and read-only if readonly.

    src is a path or, better, an O_PATH fd opened without following links (corral's
    tiers pass one: hostpath.open_nofollow), so the tree cloned is the one checked.
    Typically uid_map = (st.st_uid, X) and gid_map = (st.st_gid, X) for st = os.fstat(fd).
    With check_owner (the default) the tree actually opened must be owned by uid_map[0]:
    gid_map[0], so a path swapped between the caller's stat and this call is refused. Raises SandboxSetupError(step="workspace-idmap") with a one-line fix on failure; on
    failure nothing is left mounted.

    A read-write mapping of uid 0 or gid 0 is refused unless setid_blocked: through it the
    sandbox could store a setuid-root (or setgid-root) file on the host's disk, which any
    host user could then run through the host's path to the workspace (nosuid on this mount
    does not cover that path). Pass setid_blocked=True only when the sandbox's seccomp filter
    refuses S_ISUID/S_ISGID in chmod/fchmod(at)(2), open/openat/creat/mknod(at) modes, and
    refuses openat2 and io_uring.
    """
    x = uid_map[1]
    name = _name(src)   # for messages only
    attr = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if readonly else 0)
    for pair in (uid_map, gid_map):
        if not all(isinstance(i, int) and 0 <= i < 0xFFFFFFFF for i in pair):
            raise SandboxSetupError(f"bad id mapping {pair!r}; give two ids in 0..4294967294",
                                    step=STEP, field=FIELD)
    if not readonly and not setid_blocked and 0 in (uid_map[0], gid_map[0]):
        raise SandboxSetupError(
            f"a read-write workspace owned by root (uid or gid 0: {name}) would let the sandbox leave "
            "setuid-root files on the host; mount it ro, chown it to a non-root user, or "
            "block set-id modes in the sandbox's seccomp filter",
            step=STEP, errno=_errno.EPERM, field=FIELD)
    call = "open_tree"
    try:
        tree = _open_tree(src)
    except OSError as e:
        raise _error(e, call, name, x, readonly) from None
    try:
        call = "fstat"
        st = os.fstat(tree)
        if check_owner and (st.st_uid, st.st_gid) != (uid_map[0], gid_map[0]):
            raise SandboxSetupError(
                f"workspace {name} is owned by {st.st_uid}:{st.st_gid}, not "
                f"{uid_map[0]}:{gid_map[0]} as when it was checked; retry, and keep the path "
                "stable while corral starts", step=STEP, errno=_errno.ESTALE, field=FIELD)
        call = "clone(CLONE_NEWUSER)"
        ns = _userns(uid_map, gid_map)
        try:
            call = "mount_setattr"
            _set_idmap(tree, ns, attr)
        finally:
            os.close(ns)
        call = "move_mount"
        try:
            _move_mount(tree, dst)
        except OSError as e:
            raise _error(e, call, dst, x, readonly) from None
    except OSError as e:
        raise _error(e, call, name, x, readonly) from None
    finally:
        os.close(tree)  # a detached tree that was never moved is freed here


AT_RECURSIVE = 0x8000


def readonly_bind(fd: int, dst: str, *, field: str) -> None:
    """Mount the tree `fd` names (an O_PATH fd, hostpath.open_nofollow) on dst (an existing
    empty directory or file), recursively, read-only, nosuid, nodev, with no id mapping:
    a bind that never looks the source up by name (the gvisor tier's ro_binds; runsc then
    binds dst, a path of corral's own). Raises SandboxSetupError; leaves nothing mounted
    on failure."""
    call = "open_tree"
    try:
        tree = _open_tree(fd, AT_RECURSIVE)
    except OSError as e:
        raise SandboxSetupError(f"cannot bind {_name(fd)}: {call}: {os.strerror(e.errno)}",
                                step="ro-bind", errno=e.errno, field=field) from None
    try:
        call = "mount_setattr"
        attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
        _syscall("mount_setattr", ctypes.c_int(tree), b"",
                 ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE), ctypes.byref(attr),
                 ctypes.c_size_t(ctypes.sizeof(attr)))
        call = "move_mount"
        _move_mount(tree, dst)
    except OSError as e:
        raise SandboxSetupError(f"cannot bind {_name(fd)} on {dst}: {call}: "
                                f"{os.strerror(e.errno)}", step="ro-bind", errno=e.errno,
                                field=field) from None
    finally:
        os.close(tree)


def unmount(dst: str) -> None:
    """Detach the mount on dst. Idempotent: a dst that is not a mount point, or is gone, is
    left alone. A sandbox still running keeps its own copy of the mount until it exits."""
    if _libc().umount2(os.fsencode(dst), MNT_DETACH | UMOUNT_NOFOLLOW) == 0:
        return
    e = ctypes.get_errno()
    if e in (_errno.EINVAL, _errno.ENOENT):
        return
    raise SandboxSetupError(f"cannot unmount the workspace at {dst}: {os.strerror(e)}",
                            step=STEP, errno=e, field=FIELD)


def supported(path: str) -> bool | str:
    """True if an idmapped mount of path works here, else a one-line reason.

    Tries the real thing on a detached copy (never attached, freed on close); ~0.3 ms.
    """
    if os.geteuid() != 0:
        return "not root: idmapped mounts need CAP_SYS_ADMIN on the host (EPERM)"
    call = "open_tree"
    try:
        tree = _open_tree(path)
    except OSError as e:
        return _reason(e, call, path, None, None)
    try:
        call = "clone(CLONE_NEWUSER)"
        ns = _probe_userns()
        call = "mount_setattr"
        _set_idmap(tree, ns, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
    except OSError as e:
        return _reason(e, call, path, None, None)
    finally:
        os.close(tree)
    return True


#: supported()'s user namespace (0 -> 65534, nothing else: it never reaches a mount that
#: is attached), made at its first use and kept: each tier check of a workspace (every
#: Sandbox() of a policy with one) then costs an open_tree and a mount_setattr, not a
#: clone, two map writes and a wait (~0.7 ms, and the most variable part of the check)
_probe_ns: tuple[int, int, int] | None = None      # (fd, st_dev, st_ino)
_probe_lock = _thread.allocate_lock()


def _probe_userns() -> int:
    """The kept namespace's fd, checked by identity first (a forked child, or code that
    closed fds it did not own, may hold another file under that number); made anew if
    it is not the same."""
    global _probe_ns
    with _probe_lock:
        if _probe_ns is not None:
            fd, dev, ino = _probe_ns
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == (dev, ino):
                    return fd
            except OSError:
                pass
            _probe_ns = None          # not ours any more: left alone, never closed
        fd = _userns((0, 65534), (0, 65534))
        st = os.fstat(fd)
        _probe_ns = (fd, st.st_dev, st.st_ino)
        return fd
