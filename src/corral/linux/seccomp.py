"""The namespace tier's syscall profile: the tables below, compiled to classic BPF.

bubblewrap loads the program with `bwrap --seccomp FD` right before it execs the command,
after it has built the sandbox, so the profile only has to cover what the workload does.
The default action is ALLOW: this is a deny list of kernel surface the workload never needs,
at least what Docker's default profile refuses, plus rules that keep a writable host
directory free of set-id files, device nodes and file capabilities.

Everything the filter does is in the tables at the top of this file; `rules()` turns them
into a flat list, and `compile_bpf()` hands that list to libseccomp. Only x86_64 is written
and tested. The filter holds the native architecture only: a 32-bit `int 0x80` entry and
x32 numbers (nr | 0x40000000, refused by libseccomp's own check, which `compile_bpf`
verifies is present) kill the process (SIGSYS). Such entry points are never used
legitimately by the x86_64 userland a sandbox runs, and a process that tries one is treated
as hostile, so it is killed rather than handed an errno to probe with.

What it does not do: it is not an allow list, so a brand-new syscall is allowed until it is
listed here (numbers newer than libseccomp 2.5.4's tables are listed by number). seccomp
cannot read memory, so it cannot judge paths or structs: where flags or a mode sit in a
struct (openat2's open_how, clone3's clone_args, setxattrat's xattr_args) the call answers
ENOSYS, as on an older kernel, and libc falls back to a call whose arguments are registers
(fchmodat2 too, so that chmod goes through fchmodat). io_uring, which could open files with
any mode, is refused outright.
"""

from __future__ import annotations

import errno as _errno
import os

from .._record import Record
from ..errors import BackendUnavailable, SandboxSetupError

PROFILE_VERSION = "1"
ARCH = "x86_64"

EPERM = _errno.EPERM
ENOSYS = _errno.ENOSYS
EOPNOTSUPP = _errno.EOPNOTSUPP

# Syscalls newer than libseccomp 2.5.4's tables, by their x86_64 number.
SETXATTRAT = 463      # Linux 6.13
REMOVEXATTRAT = 466   # Linux 6.13
OPEN_TREE_ATTR = 467  # Linux 6.15

# ---------------------------------------------------------------------------------------
# Always refused with EPERM.
# ---------------------------------------------------------------------------------------

# Reading or writing another process's memory or fds: ptrace and its relatives.
TRACE = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp")

# The mount table is built by the tier before exec; the workload never edits it.
MOUNT = ("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
         "fsconfig", "fsmount", "fspick", "mount_setattr", OPEN_TREE_ATTR)

# The sandbox already sits in fresh namespaces; new ones would reopen user-namespace and
# mount attack surface (clone with CLONE_NEW* flags is in CLONE_NEW below).
NAMESPACES = ("unshare", "setns")

# The kernel keyring is not namespaced: keys would be shared with the host.
KEYRING = ("keyctl", "add_key", "request_key")

# Large kernel attack surfaces with a record of privilege-escalation bugs; io_uring can
# also open files with modes the filter cannot see.
ATTACK_SURFACE = ("bpf", "perf_event_open", "userfaultfd", "fanotify_init",
                  "io_uring_setup", "io_uring_enter", "io_uring_register")

# Loading, replacing or unloading kernel code.
KERNEL_CODE = ("kexec_load", "kexec_file_load", "init_module", "finit_module",
               "delete_module", "create_module", "get_kernel_syms", "query_module")

# File handles open any inode of a filesystem, ignoring the mount namespace ("shocker").
FILE_HANDLES = ("open_by_handle_at", "name_to_handle_at")

# Host-wide state: clocks, accounting, swap, power, host names, kernel log, quotas, I/O
# ports, the controlling terminal of others.
HOST_STATE = ("acct", "swapon", "swapoff", "reboot", "settimeofday", "clock_settime",
              "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "syslog",
              "quotactl", "quotactl_fd", "iopl", "ioperm", "vhangup")

# Obsolete interfaces that no current program needs and old bugs live in.
OBSOLETE = ("lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl")

DENY_EPERM = (TRACE + MOUNT + NAMESPACES + KEYRING + ATTACK_SURFACE + KERNEL_CODE
              + FILE_HANDLES + HOST_STATE + OBSOLETE)

# ---------------------------------------------------------------------------------------
# Always refused with ENOSYS: their flags or modes sit in a struct seccomp cannot read, so
# we pretend the kernel is older; glibc and CPython then use clone, fchmodat, openat and
# setxattr, whose arguments the rules below can inspect.
# ---------------------------------------------------------------------------------------
DENY_ENOSYS = ("clone3", "openat2", "fchmodat2", SETXATTRAT, REMOVEXATTRAT)

# ---------------------------------------------------------------------------------------
# Always refused with EOPNOTSUPP: writing extended attributes. security.capability would
# plant file capabilities in a host directory; EOPNOTSUPP makes cp -a, tar and rsync carry
# on as on a filesystem without xattrs. Reading xattrs stays allowed.
# ---------------------------------------------------------------------------------------
DENY_EOPNOTSUPP = ("setxattr", "lsetxattr", "fsetxattr",
                   "removexattr", "lremovexattr", "fremovexattr")

# ---------------------------------------------------------------------------------------
# Refused with EPERM when an argument matches. Arguments count from 0 in the x86_64 ABI.
# A set-id file or a device node written to a host directory outlives the sandbox.
# ---------------------------------------------------------------------------------------
S_ISUID = 0o4000
S_ISGID = 0o2000
SET_ID_BITS = (S_ISUID, S_ISGID)
S_IFMT = 0o170000
DEVICE_TYPES = (0o020000, 0o060000)  # S_IFCHR, S_IFBLK
O_CREAT = 0o100
O_TMPFILE = 0o20000000  # __O_TMPFILE; the public O_TMPFILE adds O_DIRECTORY

# chmod-like calls: (syscall, index of mode). Any S_ISUID or S_ISGID bit is refused.
SET_MODE = (("chmod", 1), ("fchmod", 1), ("fchmodat", 2))

# Calls that create a file: (syscall, index of flags or None if it always creates, index
# of mode). A set-id bit is refused when O_CREAT or O_TMPFILE is in the flags.
CREATE = (("open", 1, 2), ("openat", 2, 3), ("creat", None, 1))

# mknod: (syscall, index of mode). Refused: device types, and set-id bits (mknod S_IFREG
# creates a regular file). FIFOs, sockets and plain files stay allowed.
MKNOD = (("mknod", 1), ("mknodat", 2))

# clone(2) flags that create a namespace; flags are argument 0 on x86_64. CLONE_NEWTIME
# (0x80) overlaps clone's exit-signal byte, where no valid signal sets it; it is listed so
# the list is complete.
CLONE_NEW = (("CLONE_NEWTIME", 0x00000080), ("CLONE_NEWNS", 0x00020000),
             ("CLONE_NEWCGROUP", 0x02000000), ("CLONE_NEWUTS", 0x04000000),
             ("CLONE_NEWIPC", 0x08000000), ("CLONE_NEWUSER", 0x10000000),
             ("CLONE_NEWPID", 0x20000000), ("CLONE_NEWNET", 0x40000000))

# ioctl requests refused (argument 1; compared on the low 32 bits, which is all the kernel
# reads, so garbage in the high bits cannot slip past): pushing input into a terminal.
IOCTL_DENY = (("TIOCSTI", 0x5412), ("TIOCLINUX", 0x541C))

# personality(2): only the query (0xffffffff) and PER_LINUX (0) are allowed. Other values
# switch off ASLR, make reads imply exec, map page zero, ...
PERSONALITY_ALLOWED = (0x0, 0xFFFFFFFF)


# ---------------------------------------------------------------------------------------
# Tables -> rules.
# ---------------------------------------------------------------------------------------
class Cond(Record):
    """One argument comparison: `(arg & mask) == value` (op "masked_eq") or `arg > value`
    (op "gt", on the full 64 bits)."""
    arg: int
    op: str
    value: int
    mask: int = 0


class Rule(Record):
    """Refuse `syscall` (a name, or an x86_64 number) with `errno` when every condition
    holds; with no conditions, always."""
    syscall: str | int
    errno: int
    when: tuple[Cond, ...] = ()


def _bit(arg: int, bit: int, value: int | None = None) -> Cond:
    return Cond(arg, "masked_eq", bit if value is None else value, bit)


def rules() -> tuple[Rule, ...]:
    """The whole profile as a flat tuple of rules (pure; no libseccomp needed)."""
    out = [Rule(s, EPERM) for s in DENY_EPERM]
    out += [Rule(s, ENOSYS) for s in DENY_ENOSYS]
    out += [Rule(s, EOPNOTSUPP) for s in DENY_EOPNOTSUPP]
    for name, mode in SET_MODE:
        out += [Rule(name, EPERM, (_bit(mode, b),)) for b in SET_ID_BITS]
    for name, flags, mode in CREATE:
        for b in SET_ID_BITS:
            if flags is None:
                out.append(Rule(name, EPERM, (_bit(mode, b),)))
            else:
                out += [Rule(name, EPERM, (_bit(flags, f), _bit(mode, b)))
                        for f in (O_CREAT, O_TMPFILE)]
    for name, mode in MKNOD:
        out += [Rule(name, EPERM, (Cond(mode, "masked_eq", t, S_IFMT),)) for t in DEVICE_TYPES]
        out += [Rule(name, EPERM, (_bit(mode, b),)) for b in SET_ID_BITS]
    out += [Rule("clone", EPERM, (_bit(0, f),)) for _, f in CLONE_NEW]
    out += [Rule("ioctl", EPERM, (Cond(1, "masked_eq", r, 0xFFFFFFFF),))
            for _, r in IOCTL_DENY]
    out += _personality_rules()
    return tuple(out)


def _personality_rules() -> list[Rule]:
    """Refuse personality(x) unless x is 0 or 0xffffffff.

    libseccomp allows one comparison per argument in a rule, so "x != 0 and x != ~0" is
    built from single comparisons: any bit above 31 (the kernel would ignore it; fail
    closed), or, in the low 32 bits, some bit i set with bit i+1 (cyclically) clear. A
    32-bit value that is neither all zeros nor all ones always has such a 1-then-0 pair.
    """
    assert PERSONALITY_ALLOWED == (0x0, 0xFFFFFFFF)
    out = [Rule("personality", EPERM, (Cond(0, "gt", 0xFFFFFFFF),))]
    for i in range(32):
        pair = (1 << i) | (1 << ((i + 1) % 32))
        out.append(Rule("personality", EPERM, (Cond(0, "masked_eq", 1 << i, pair),)))
    return out


# ---------------------------------------------------------------------------------------
# Compiling, caching, handing to bwrap.
# ---------------------------------------------------------------------------------------
def _libseccomp():
    try:
        import seccomp
    except ImportError as e:
        raise BackendUnavailable(
            f"libseccomp's Python binding cannot be imported ({e}); install python3-seccomp "
            "(apt-get install python3-seccomp) and link it into corral's venv "
            "(scripts/setup.sh does)", field="isolation") from e
    return seccomp


def _require_x86_64() -> None:
    machine = os.uname().machine
    if machine != ARCH:
        raise BackendUnavailable(
            f"corral's seccomp profile is written and tested for x86_64 only; this host is "
            f"{machine}; use another isolation tier here", field="isolation")


def compile_bpf() -> bytes:
    """Build the filter (default ALLOW, native arch only, bad arch kills) and return it
    as a classic BPF program. Raises BackendUnavailable without libseccomp and
    SandboxSetupError if a rule cannot be compiled: a rule is never silently dropped."""
    _require_x86_64()
    seccomp = _libseccomp()
    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    flt.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    for rule in rules():
        nr = rule.syscall
        if isinstance(nr, str):
            nr = seccomp.resolve_syscall(seccomp.Arch.X86_64, nr)
            if nr < 0:  # libseccomp ignores unknown names; we refuse to
                raise SandboxSetupError(f"libseccomp does not know syscall {rule.syscall!r}",
                                        step="seccomp")
        args = [seccomp.Arg(c.arg, seccomp.MASKED_EQ, c.mask, c.value) if c.op == "masked_eq"
                else seccomp.Arg(c.arg, seccomp.GT, c.value) for c in rule.when]
        try:
            flt.add_rule(seccomp.ERRNO(rule.errno), nr, *args)
        except (RuntimeError, ValueError) as e:
            raise SandboxSetupError(f"libseccomp refused {rule}: {e}", step="seccomp") from e
    with os.fdopen(os.memfd_create("corral-seccomp-export", os.MFD_CLOEXEC), "w+b") as f:
        flt.export_bpf(f)
        f.seek(0)
        data = f.read()
    if not _refuses_x32(data):
        raise SandboxSetupError("this libseccomp does not refuse x32 syscall numbers in an "
                                "x86_64 filter; the profile would leak", step="seccomp")
    return data


def _refuses_x32(bpf: bytes) -> bool:
    """Does the program test `nr >= 0x40000000` (libseccomp's x32 guard)?"""
    jge_k = 0x35  # BPF_JMP | BPF_JGE | BPF_K
    return any(int.from_bytes(bpf[i:i + 2], "little") == jge_k
               and int.from_bytes(bpf[i + 4:i + 8], "little") == 0x40000000
               for i in range(0, len(bpf), 8))


def _binding_file() -> str | None:
    """Where `import seccomp` would load the binding from, found without importlib.util
    (which costs start-up time): the first sys.path entry holding a seccomp extension."""
    import sys

    for d in sys.path:
        try:
            names = os.listdir(d or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("seccomp.") and name.endswith(".so"):
                return os.path.join(d, name)
    return None


def cache_key() -> str:
    """Hash of the profile version, the rules, the arch and libseccomp's identity.

    libseccomp is linked statically into its Python binding (upstream's setup.py links
    libseccomp.a; Debian's python3-seccomp does the same), so the binding file's path, size
    and mtime stand for the libseccomp version without importing it.
    """
    origin = _binding_file()
    if origin is None:
        _libseccomp()  # raises BackendUnavailable with the fix
        raise BackendUnavailable("libseccomp's Python binding has no file; reinstall "
                                 "python3-seccomp", field="isolation")
    origin = os.path.realpath(origin)
    st = os.stat(origin)
    material = {
        "profile": PROFILE_VERSION,
        "arch": os.uname().machine,
        "libseccomp": [origin, st.st_size, st.st_mtime_ns],
        "rules": [[r.syscall, r.errno, [[c.arg, c.op, c.value, c.mask] for c in r.when]]
                  for r in rules()],
    }
    # not a security boundary (the cache dir is the supervisor's own), only a change
    # detector: two cheap checksums instead of importing hashlib and json on every start
    import zlib

    text = repr(sorted(material.items())).encode()
    return f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}{len(text):x}"


#: the program this process built or read, by cache dir: the rules cannot change while it
#: runs, and neither can the libseccomp it would use (it is linked into the binding)
_built: dict[str | None, bytes] = {}


def bpf_bytes(cache_dir: str | None) -> bytes:
    """compile_bpf(), cached in cache_dir and in this process. A hit neither imports nor
    runs libseccomp. An unusable cache dir (missing and not creatable, read-only, not ours)
    means: compile."""
    data = _built.get(cache_dir)
    if data is not None:
        return data
    if cache_dir is None:
        data = compile_bpf()
    else:
        path = os.path.join(cache_dir, f"seccomp-{PROFILE_VERSION}-{cache_key()}.bpf")
        data = _read_cache(path)
        if data is None:
            data = compile_bpf()
            _write_cache(cache_dir, path, data)
    _built[cache_dir] = data
    return data


def _write_cache(cache_dir: str, path: str, data: bytes) -> None:
    """Store a compiled program atomically (temp file + rename); a cache dir that cannot
    be written is no error: the compiled program is just as good."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def _read_cache(path: str) -> bytes | None:
    """The cached program, or None if absent, not owned by us, writable by others, or not
    a whole number of BPF instructions."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        data = f.read()
    if not data or len(data) % 8:
        return None
    return data


def bpf_fd(data: bytes) -> int:
    """An inheritable, sealed memfd holding `data`, positioned at 0, for `bwrap --seccomp
    FD` (pass it with pass_fds). bwrap reads from the current offset: lseek to 0 before
    reusing the fd for another run. The caller closes it."""
    import fcntl

    fd = os.memfd_create("corral-seccomp", os.MFD_ALLOW_SEALING)  # no MFD_CLOEXEC
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
