"""Landlock, through its three system calls (x86_64 and aarch64 numbers 444-446), via ctypes.

    abi = landlock.abi()                       # 0 when the kernel has no Landlock
    rs = landlock.Ruleset(abi)                 # handles every right this ABI knows
    rs.allow_path("/usr", landlock.READ_EXEC)  # rights on a directory tree or one file
    rs.allow_port(3128, landlock.NET_CONNECT_TCP)
    ...                                        # in the child, after PR_SET_NO_NEW_PRIVS:
    landlock.restrict_self(rs.fd)              # from now on only what was allowed
    rs.close()

A ruleset *handles* access rights: a handled right is denied unless a rule allows it beneath
some path (or for some port); a right the ruleset does not handle is not restricted at all.
`Ruleset(abi)` handles every filesystem and network right of `abi` and, from ABI 6, scopes
signals and abstract unix sockets to the sandbox's own domain. What each ABI adds:

    1 (5.13)  filesystem: execute, read/write files, list dirs, create/remove entries;
              ptrace of processes outside the domain is refused (not a right: always on)
    2 (5.19)  REFER: rename/link across directories (always refused on ABI 1)
    3 (6.2)   TRUNCATE: truncate(2), O_TRUNC
    4 (6.7)   TCP bind and connect, by port
    5 (6.10)  IOCTL_DEV: ioctl on device files opened after restriction
    6 (6.12)  scopes: signals and abstract unix sockets stay inside the domain
    7 (6.15)  audit logging controls (nothing restricted in addition)

Landlock cannot deny below a directory it allows (rules only add), so a caller lists the
paths to allow rather than the ones to hide. It does not cover: stat(2)/access(2)/readlink
and other metadata lookups, connect(2) to pathname unix sockets, UDP and other non-TCP
protocols, and files opened before restrict_self (inherited fds keep their access).
"""

from __future__ import annotations

import ctypes
import os

SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

# filesystem rights
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13        # ABI 2
FS_TRUNCATE = 1 << 14     # ABI 3
FS_IOCTL_DEV = 1 << 15    # ABI 5
# network rights (ABI 4)
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
# scopes (ABI 6)
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

#: the rights that apply to a file (not a directory); a rule on a file may hold only these
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

READ = FS_READ_FILE | FS_READ_DIR
READ_EXEC = READ | FS_EXECUTE
#: everything a private writable tree needs; device nodes excluded
WRITE_TREE = (READ_EXEC | FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR
              | FS_MAKE_REG | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_SYM | FS_REFER
              | FS_TRUNCATE | FS_IOCTL_DEV)
#: a device like /dev/null: read, write, O_TRUNC
RW_FILE = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE


def handled_fs(abi: int) -> int:
    """The filesystem rights an ABI knows."""
    if abi < 1:
        return 0
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def handled_net(abi: int) -> int:
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def handled_scope(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the uapi header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

_abi: int | None = None
_abi_error = ""


def _call(*args) -> int:
    r = _syscall(*args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def abi() -> int:
    """The Landlock ABI version of the running kernel, 0 if Landlock is unavailable (see
    unavailable_reason()). Looked up once per process."""
    global _abi, _abi_error
    if _abi is None:
        if os.uname().machine not in ("x86_64", "aarch64"):
            _abi, _abi_error = 0, (f"corral knows Landlock's syscall numbers for x86_64 and "
                                  f"aarch64 only, not {os.uname().machine}")
        else:
            try:
                _abi = _call(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                             ctypes.c_uint32(CREATE_RULESET_VERSION))
            except OSError as e:
                _abi = 0
                _abi_error = {
                    38: "the kernel was built without Landlock (CONFIG_SECURITY_LANDLOCK)",
                    95: "Landlock is built in but not enabled; boot with lsm=landlock,... "
                        "(after the other LSMs in CONFIG_LSM)",
                }.get(e.errno or 0, f"landlock_create_ruleset failed: {e.strerror}")
    return _abi


def unavailable_reason() -> str:
    abi()
    return _abi_error


class Ruleset:
    """A Landlock ruleset under construction, then an fd to enforce in a child."""

    def __init__(self, abi_version: int, *, scoped: bool = True) -> None:
        if abi_version < 1:
            raise ValueError("Landlock is unavailable: " + (unavailable_reason() or "ABI 0"))
        self.abi = abi_version
        self.fs = handled_fs(abi_version)
        self.net = handled_net(abi_version)
        self.scoped = handled_scope(abi_version) if scoped else 0
        attr = _RulesetAttr(self.fs, self.net, self.scoped)
        size = 8 if abi_version < 4 else 16 if abi_version < 6 else 24
        self.fd = _call(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr),
                        ctypes.c_size_t(size), ctypes.c_uint32(0))
        #: (path, rights actually granted) of every rule added, for explain and tests
        self.rules: list[tuple[str, int]] = []

    def allow_path(self, path: str | int, access: int) -> bool:
        """Allow `access` beneath `path` (a directory) or on it (a file; only FILE_RIGHTS
        apply there). Rights this ABI does not know are dropped. A missing path is skipped:
        returns False. Symlinks are followed: the rule lands on their target. `path` may be
        an open (O_PATH) fd instead: the rule lands on what it names, with no lookup (the
        caller keeps the fd)."""
        if isinstance(path, int):
            pfd = os.dup(path)
            path = f"(fd {path})"
        else:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
        try:
            import stat

            if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                access &= FILE_RIGHTS
            access &= self.fs
            if not access:
                return False
            attr = _PathBeneathAttr(access, pfd)
            _call(ctypes.c_long(SYS_ADD_RULE), ctypes.c_long(self.fd),
                  ctypes.c_long(RULE_PATH_BENEATH), ctypes.byref(attr), ctypes.c_uint32(0))
        finally:
            os.close(pfd)
        self.rules.append((path, access))
        return True

    def allow_port(self, port: int, access: int) -> None:
        """Allow TCP bind/connect on `port` (ABI 4+; a no-op below, where TCP is not
        handled at all, so the caller must not rely on Landlock for the network then)."""
        access &= self.net
        if not access:
            return
        attr = _NetPortAttr(access, port)
        _call(ctypes.c_long(SYS_ADD_RULE), ctypes.c_long(self.fd),
              ctypes.c_long(RULE_NET_PORT), ctypes.byref(attr), ctypes.c_uint32(0))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def restrict_self(ruleset_fd: int) -> None:
    """Enforce a ruleset on the calling thread (and what it forks and execs), for good.
    Needs no_new_privs (or CAP_SYS_ADMIN). Safe between fork and exec: one syscall."""
    _call(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_long(ruleset_fd), ctypes.c_uint32(0))
