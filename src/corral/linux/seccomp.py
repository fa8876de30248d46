"""The namespace tier's syscall profile: the tables below, compiled to classic BPF.

bubblewrap loads the program with `bwrap --seccomp FD` right before it execs the command,
after it has built the sandbox, so the profile only has to cover what the workload does.

It is an allow list, as Docker's default profile is: a syscall named nowhere in the tables
of this file answers ENOSYS, as on a kernel that does not have it, so programs fall back
and a syscall the kernel adds tomorrow is refused until it is listed here. On top of the
allow list come refusals (with their own errno: EPERM for what the workload may not do,
EOPNOTSUPP for xattr writes, EAFNOSUPPORT for socket families) of whole calls the sandbox
never needs, at least what Docker's default profile refuses, and of arguments: rules that
keep a writable host directory free of set-id files, device nodes and file capabilities,
namespaces out of clone, input out of terminals, and sockets to unix, inet and
NETLINK_ROUTE.

How it is built (compile_bpf): the program has two parts, run one after the other. The
first is the allow list, written here directly as a few range tests on the syscall number
(the listed numbers, sorted and merged into runs: fifteen today, two instructions each);
a number outside every range answers ENOSYS. The second is libseccomp's program for the
refusals, with the default ALLOW. A call passes only if both let it through, so a refusal
always wins over the allow list, whatever the arguments. (libseccomp itself cannot express
"allow, except with these arguments" in a filter whose default refuses: an unconditional
ALLOW of a syscall erases its conditional ERRNO rules, and for overlapping conditional rules
the one it tests first wins, by an internal order of arguments and operators, not by which
refuses. tests/linux/test_seccomp.py shows both.) Both parts check the architecture first.

Only x86_64 is written and tested. The filter holds the native architecture only: a 32-bit
`int 0x80` entry and x32 numbers (nr | 0x40000000; refused by both parts: by our range test
and by libseccomp's own check, which `compile_bpf` verifies is present) kill the process
(SIGSYS). Such entry points are never used legitimately by the x86_64 userland a sandbox
runs, and a process that tries one is treated as hostile, so it is killed rather than handed
an errno to probe with.

seccomp cannot read memory, so it cannot judge paths or structs: calls whose flags or mode
sit in a struct (openat2's open_how, clone3's clone_args, setxattrat's xattr_args) are left
off the list and answer ENOSYS, as on an older kernel, and libc falls back to a call whose
arguments are registers (fchmodat2 too, so that chmod goes through fchmodat). io_uring,
which could open files with any mode, is refused outright.

The gvisor tier applies the EPERM refusals of rules() inside gVisor (backends/gvisor.py);
the Sentry implements its own, smaller set of syscalls and answers ENOSYS for the rest.
"""

from __future__ import annotations

import errno as _errno
import os

from .._record import Record
from ..errors import BackendUnavailable, SandboxSetupError
from .seccomp_cache import (  # noqa: F401 - the cache's side, re-exported
    PROFILE_VERSION,
    _binding_file,
    _built,
    _file_digest,
    _read_cache,
    _sha256,
    _write_cache,
    bpf_bytes,
    bpf_fd,
    cache_key,
)

ARCH = "x86_64"

EPERM = _errno.EPERM
ENOSYS = _errno.ENOSYS
EOPNOTSUPP = _errno.EOPNOTSUPP
EAFNOSUPPORT = _errno.EAFNOSUPPORT
EPROTONOSUPPORT = _errno.EPROTONOSUPPORT

# Syscalls newer than libseccomp 2.5.4's tables, by their x86_64 number.
SETXATTRAT = 463      # Linux 6.13
REMOVEXATTRAT = 466   # Linux 6.13
OPEN_TREE_ATTR = 467  # Linux 6.15

# ---------------------------------------------------------------------------------------
# The allow list: every syscall a sandboxed program may make, by what it is for. Calls
# marked (*) have argument rules further down that refuse some uses. The calls refused
# outright further down (with EPERM or EOPNOTSUPP) are let through this list too, so that
# they answer their own errno; everything else answers ENOSYS.
# ---------------------------------------------------------------------------------------
ALLOWED = (
    (("its own memory: mapping, protecting, locking, advising (no NUMA policy: mbind, "
      "set_mempolicy, migrate_pages and move_pages are refused, as in Docker's profile)"),
     ("brk", "mmap", "munmap", "mremap", "mprotect", "msync", "mincore", "madvise", "mlock",
      "mlock2", "munlock", "mlockall", "munlockall", "membarrier", "memfd_create",
      "pkey_mprotect", "pkey_alloc", "pkey_free", "map_shadow_stack")),
    (("processes and threads: create (*clone), exec, wait, exit, thread state, its own "
      "limits and filters"),
     ("clone", "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4",
      "waitid", "set_tid_address", "set_robust_list", "get_robust_list", "futex",
      "futex_waitv", "futex_wake", "futex_wait", "futex_requeue", "rseq", "arch_prctl",
      "set_thread_area", "get_thread_area", "prctl", "personality", "seccomp",
      "restart_syscall", "capget", "capset", "getrlimit", "setrlimit", "prlimit64",
      "getrusage", "times", "landlock_create_ruleset", "landlock_add_rule",
      "landlock_restrict_self")),
    ("ids, sessions and process groups (only what the sandbox's own uid may change)",
     ("getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid", "getresuid",
      "getresgid", "getgroups", "setuid", "setgid", "setreuid", "setregid", "setresuid",
      "setresgid", "setfsuid", "setfsgid", "setgroups", "setsid", "getsid", "setpgid",
      "getpgid", "getpgrp")),
    ("scheduling and priority of its own processes",
     ("sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
      "sched_setparam", "sched_getscheduler", "sched_setscheduler", "sched_getattr",
      "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
      "sched_rr_get_interval", "getpriority", "setpriority", "ioprio_get", "ioprio_set",
      "getcpu")),
    ("signals, to its own processes (the PID namespace holds no others)",
     ("kill", "tkill", "tgkill", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn",
      "rt_sigpending", "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
      "rt_sigsuspend", "sigaltstack", "pause", "signalfd", "signalfd4", "pidfd_open",
      "pidfd_send_signal")),
    ("clocks and timers: reading them, sleeping (setting clocks is refused below)",
     ("clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday",
      "time", "getitimer", "setitimer", "alarm", "timer_create", "timer_settime",
      "timer_gettime", "timer_getoverrun", "timer_delete", "timerfd_create",
      "timerfd_settime", "timerfd_gettime")),
    ("file descriptors and I/O on them (*ioctl), polling, pipes, Linux AIO",
     ("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
      "preadv2", "pwritev2", "close", "close_range", "dup", "dup2", "dup3", "fcntl",
      "flock", "lseek", "ioctl", "pipe", "pipe2", "sendfile", "splice", "tee", "vmsplice",
      "copy_file_range", "eventfd", "eventfd2", "poll", "ppoll", "select", "pselect6",
      "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait",
      "epoll_pwait2", "inotify_init", "inotify_init1", "inotify_add_watch",
      "inotify_rm_watch", "io_setup", "io_destroy", "io_submit", "io_cancel",
      "io_getevents", "io_pgetevents", "readahead", "fadvise64", "fallocate", "fsync",
      "fdatasync", "sync", "syncfs", "sync_file_range", "ftruncate")),
    (("files and directories: open (*open, *openat, *creat), stat, walk, make and remove, "
      "rename (*renameat2), modes (*chmod, *fchmod, *fchmodat, *mknod, *mknodat), owners, "
      "times, reading extended attributes (writing them is refused below)"),
     ("open", "openat", "creat", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs",
      "fstatfs", "access", "faccessat", "faccessat2", "getcwd", "chdir", "fchdir",
      "getdents", "getdents64", "mkdir", "mkdirat", "rmdir", "rename", "renameat",
      "renameat2", "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat",
      "readlink", "readlinkat", "truncate", "chmod", "fchmod", "fchmodat", "chown",
      "fchown", "lchown", "fchownat", "umask", "mknod", "mknodat", "utime", "utimes",
      "utimensat", "futimesat", "getxattr", "lgetxattr", "fgetxattr", "listxattr",
      "llistxattr", "flistxattr")),
    (("sockets (*socket, *socketpair: unix, inet, inet6 and NETLINK_ROUTE only); where "
      "they reach is the network namespace's business"),
     ("socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
      "getsockname", "getpeername", "getsockopt", "setsockopt", "shutdown", "sendto",
      "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg")),
    ("System V IPC and POSIX message queues: the sandbox's own IPC namespace",
     ("shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
      "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
      "mq_timedreceive", "mq_notify", "mq_getsetattr")),
    ("what the system is", ("uname", "sysinfo", "getrandom")),
)

# Left off the list on purpose (they answer ENOSYS), besides everything the list does not
# name. Kept here so that a later edit does not add them back without reading why.
NOT_ALLOWED = (
    (("flags or modes in a struct seccomp cannot read: libc falls back to clone, openat, "
      "fchmodat and setxattr, whose arguments the rules below see"),
     ("clone3", "openat2", "fchmodat2", SETXATTRAT, REMOVEXATTRAT)),
    (("NUMA memory policy and page migration, and another process's memory (Docker's "
      "profile refuses these without CAP_SYS_NICE / CAP_SYS_PTRACE)"),
     ("mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
      "set_mempolicy_home_node", "process_madvise", "process_mrelease")),
    (("newer kernel interfaces no workload here needs yet: mount and LSM introspection, "
      "sealing, page-cache statistics, xattr and fsxattr calls with struct arguments"),
     ("cachestat", "memfd_secret", 457, 458, 459, 460, 461, 462, 464, 465, 468, 469)),
    (("old or obscure: 16-bit segments, unimplemented entry points, a useless half of "
      "fanotify"), ("modify_ldt", "remap_file_pages", "epoll_ctl_old", "epoll_wait_old",
                  "fanotify_mark")),
)

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

# renameat2(2) flags (argument 4): RENAME_WHITEOUT leaves a whiteout, a 0:0 character
# device, at the old name: a device node in a host directory although mknod is refused.
# RENAME_NOREPLACE and RENAME_EXCHANGE stay allowed.
RENAME_WHITEOUT = 4
RENAME_FLAGS_ARG = 4

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
# Socket families. socket(2) may open unix, IPv4 and IPv6 sockets, and netlink sockets of
# the protocol NETLINK_ROUTE only: glibc's getifaddrs() and if_nameindex() need it, and
# with them getaddrinfo(AI_ADDRCONFIG), Node's os.networkInterfaces(), Python's
# socket.if_nameindex() and `ip addr`; what it shows is the sandbox's own network
# namespace. Every other family answers EAFNOSUPPORT, as on a kernel built without it
# (programs handle that): AF_VSOCK above all, which no network namespace scopes (a sandbox
# with no network could listen on the host VM's vsock ports and reach the hypervisor's
# services), and AF_PACKET, AF_ALG, AF_BLUETOOTH, AF_XDP, AF_KEY, ... Other netlink
# protocols answer EPROTONOSUPPORT: the host's device uevents, audit, netfilter (nf_tables
# holds much of the user-namespace exploit record), xfrm, generic netlink. socketpair(2)
# makes unix sockets only. Compared on all 64 bits: a family or protocol with garbage in
# the high half (the kernel reads an int) is refused.
# ---------------------------------------------------------------------------------------
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
NETLINK_ROUTE = 0


# ---------------------------------------------------------------------------------------
# Tables -> rules.
# ---------------------------------------------------------------------------------------
class Cond(Record):
    """One argument comparison on the full 64 bits: `(arg & mask) == value` (op
    "masked_eq"), `arg > value` ("gt"), `arg == value` ("eq") or `arg != value` ("ne")."""
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


def _blocks(lo: int, hi: int) -> list[tuple[int, int]]:
    """[lo, hi] as aligned blocks (value, mask): x is in the block iff x & mask == value,
    on all 64 bits."""
    out = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << 64
        while size > hi - lo + 1:
            size >>= 1
        out.append((lo, ((1 << 64) - 1) & ~(size - 1)))
        lo += size
    return out


def outside(name: str, arg: int, allowed: tuple[int, ...], errno: int,
            extra: tuple[Cond, ...] = ()) -> list[Rule]:
    """Refuse `name` with `errno` unless argument `arg` (all 64 bits) is one of `allowed`:
    aligned blocks for each gap below the largest, and one rule for anything above it."""
    out, prev = [], -1
    for v in sorted(allowed) + [None]:
        if v is None:
            out.append(Rule(name, errno, (Cond(arg, "gt", prev), *extra)))
            break
        for value, mask in _blocks(prev + 1, v - 1):
            cond = Cond(arg, "eq", value) if mask == (1 << 64) - 1 else \
                Cond(arg, "masked_eq", value, mask)
            out.append(Rule(name, errno, (cond, *extra)))
        prev = v
    return out


def socket_rules() -> list[Rule]:
    """socket(2) and socketpair(2) families (see SOCKET_FAMILIES)."""
    out = outside("socket", 0, SOCKET_FAMILIES, EAFNOSUPPORT)
    out.append(Rule("socket", EPROTONOSUPPORT,
                    (Cond(0, "eq", AF_NETLINK), Cond(2, "ne", NETLINK_ROUTE))))
    out.append(Rule("socketpair", EAFNOSUPPORT, (Cond(0, "ne", AF_UNIX),)))
    return out


def rules() -> tuple[Rule, ...]:
    """The refusals as a flat tuple of rules (pure; no libseccomp needed)."""
    out = [Rule(s, EPERM) for s in DENY_EPERM]
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
    out.append(Rule("renameat2", EPERM, (_bit(RENAME_FLAGS_ARG, RENAME_WHITEOUT),)))
    out += [Rule("clone", EPERM, (_bit(0, f),)) for _, f in CLONE_NEW]
    out += [Rule("ioctl", EPERM, (Cond(1, "masked_eq", r, 0xFFFFFFFF),))
            for _, r in IOCTL_DENY]
    out += _personality_rules()
    out += socket_rules()
    return tuple(out)


def allowed() -> tuple[str | int, ...]:
    """Every syscall on the allow list (pure), in table order."""
    return tuple(name for _, names in ALLOWED for name in names)


def passed(refusals: tuple[Rule, ...]) -> tuple[str | int, ...]:
    """What the first part of the program lets through to the refusals: the allow list and
    every syscall a refusal names, so that it answers its own errno, not ENOSYS."""
    return tuple(dict.fromkeys(allowed() + tuple(r.syscall for r in refusals)))


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
    """The namespace tier's program: build(rules(), passed(rules()))."""
    refusals = rules()
    return build(refusals, passed(refusals))


# classic BPF, as the kernel's seccomp runs it (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGT_K, _JGE_K, _RET_K = 0x20, 0x15, 0x25, 0x35, 0x06
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_RET_KILL_PROCESS, _RET_ERRNO = 0x80000000, 0x00050000


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    if not (0 <= jt < 256 and 0 <= jf < 256):
        raise SandboxSetupError("the allow list has too many ranges for classic BPF's "
                                "8-bit jumps", step="seccomp")
    return code.to_bytes(2, "little") + bytes((jt, jf)) + k.to_bytes(4, "little")


def ranges(numbers) -> list[tuple[int, int]]:
    """Sorted syscall numbers merged into runs (lo, hi)."""
    out: list[list[int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return [(lo, hi) for lo, hi in out]


def allow_list_bpf(numbers) -> bytes:
    """The first part of the program: the architecture must be x86_64 and the number not
    an x32 one (else kill the process), and the number in one of the runs (else ENOSYS).
    A number in a run falls off the end of this part into the next one.

        ld arch; jeq X86_64 else KILL; ld nr; jge X32_BIT then KILL
        per run lo..hi:  jge lo else NOSYS;  jgt hi then next run else PASS
        NOSYS: ret ERRNO(ENOSYS);  KILL: ret KILL_PROCESS;  PASS: (the next part)
    """
    runs = ranges(numbers)
    body = len(runs) * 2
    out = [_insn(_LD_W_ABS, 4), _insn(_JEQ_K, _AUDIT_ARCH_X86_64, 0, body + 3),
           _insn(_LD_W_ABS, 0), _insn(_JGE_K, _X32_SYSCALL_BIT, body + 1, 0)]
    for i, (lo, hi) in enumerate(runs):
        to_nosys = body - 2 * i - 1       # from the instruction after this jge
        out.append(_insn(_JGE_K, lo, 0, to_nosys))
        out.append(_insn(_JGT_K, hi, 0, to_nosys + 1))  # to PASS, past NOSYS and KILL
    out += [_insn(_RET_K, _RET_ERRNO | ENOSYS), _insn(_RET_K, _RET_KILL_PROCESS)]
    return b"".join(out)


def resolve(name: str | int) -> int:
    """A syscall's x86_64 number; raises SandboxSetupError for a name libseccomp does not
    know (it would ignore such a rule; we refuse to)."""
    if isinstance(name, int):
        return name
    seccomp = _libseccomp()
    nr = seccomp.resolve_syscall(seccomp.Arch.X86_64, name)
    if nr < 0:
        raise SandboxSetupError(f"libseccomp does not know syscall {name!r}", step="seccomp")
    return nr


def build(refusals: tuple[Rule, ...], passing: tuple[str | int, ...]) -> bytes:
    """The whole program as classic BPF: allow_list_bpf(passing), then libseccomp's
    filter of `refusals` (default ALLOW, native arch only, bad arch kills). Raises
    BackendUnavailable without libseccomp and SandboxSetupError if a rule cannot be
    compiled: a rule is never silently dropped."""
    _require_x86_64()
    seccomp = _libseccomp()
    ops = {"masked_eq": seccomp.MASKED_EQ, "gt": seccomp.GT, "ne": seccomp.NE,
           "eq": seccomp.EQ}
    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    flt.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    for rule in refusals:
        args = [seccomp.Arg(c.arg, ops[c.op], c.mask, c.value) if c.op == "masked_eq"
                else seccomp.Arg(c.arg, ops[c.op], c.value) for c in rule.when]
        try:
            flt.add_rule(seccomp.ERRNO(rule.errno), resolve(rule.syscall), *args)
        except (RuntimeError, ValueError) as e:
            raise SandboxSetupError(f"libseccomp refused {rule}: {e}", step="seccomp") from e
    with os.fdopen(os.memfd_create("corral-seccomp-export", os.MFD_CLOEXEC), "w+b") as f:
        flt.export_bpf(f)
        f.seek(0)
        data = f.read()
    if not _refuses_x32(data):
        raise SandboxSetupError("this libseccomp does not refuse x32 syscall numbers in an "
                                "x86_64 filter; the profile would leak", step="seccomp")
    return allow_list_bpf(resolve(name) for name in passing) + data


def _refuses_x32(bpf: bytes) -> bool:
    """Does the program test `nr >= 0x40000000` (libseccomp's x32 guard)?"""
    jge_k = 0x35  # BPF_JMP | BPF_JGE | BPF_K
    return any(int.from_bytes(bpf[i:i + 2], "little") == jge_k
               and int.from_bytes(bpf[i + 4:i + 8], "little") == 0x40000000
               for i in range(0, len(bpf), 8))
