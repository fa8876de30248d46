"""Make every syscall corral's seccomp profile has an opinion on; print {case: errno or 0}.

    /usr/bin/python3 tests/syscall_probe.py WORKDIR            all cases, one JSON object
    /usr/bin/python3 tests/syscall_probe.py WORKDIR --case x32  one case that may kill us

Standard library and ctypes only, raw syscall numbers (x86_64), so that no libc fallback
hides what the kernel answered. Each case's arguments succeed (0) for root with all
capabilities and no filter, or at least get past seccomp and fail with a different errno
(EINVAL from bad magic, ENOENT from a missing path, ENOSYS from a kernel built without
the call). Nothing here changes the host: state-changing calls act on WORKDIR, on this
process or a forked child, on the current value (sethostname), or fail validation before
they do anything (reboot, settimeofday). Run it as root inside fresh mount, UTS, IPC, PID
and network namespaces (the test does, with bwrap) so even the mounts stay private.

A case returns 0 on success, the errno on failure, "signal N" if a child it needed died,
or "exception: ..." for a bug in the probe.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import threading

NR = {
    "read": 0, "open": 2, "close": 3, "ioctl": 16, "getpid": 39, "clone": 56, "creat": 85,
    "mkdir": 83, "chmod": 90, "fchmod": 91, "ptrace": 101, "syslog": 103, "mknod": 133,
    "uselib": 134, "personality": 135, "ustat": 136, "sysfs": 139, "vhangup": 153,
    "pivot_root": 155, "_sysctl": 156, "adjtimex": 159, "chroot": 161, "acct": 163,
    "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
    "create_module": 174, "init_module": 175, "delete_module": 176, "get_kernel_syms": 177,
    "query_module": 178, "quotactl": 179, "nfsservctl": 180, "setxattr": 188,
    "lsetxattr": 189, "fsetxattr": 190, "listxattr": 194, "removexattr": 197,
    "lremovexattr": 198, "fremovexattr": 199, "lookup_dcookie": 212, "clock_settime": 227,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "openat": 257,
    "mkdirat": 258, "mknodat": 259, "fchmodat": 268, "unshare": 272, "perf_event_open": 298,
    "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
    "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435,
    "openat2": 437, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
    "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466, "open_tree_attr": 467,
    # sockets and rename flags
    "socket": 41, "socketpair": 53, "renameat2": 316,
    # not on the allow list: ENOSYS
    "modify_ldt": 154, "mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239,
    "migrate_pages": 256, "move_pages": 279, "fanotify_mark": 301, "process_madvise": 440,
    "memfd_secret": 447, "process_mrelease": 448, "set_mempolicy_home_node": 450,
    "cachestat": 451, "statmount": 457, "listmount": 458, "lsm_get_self_attr": 459,
    "lsm_set_self_attr": 460, "lsm_list_modules": 461, "mseal": 462, "getxattrat": 464,
    "listxattrat": 465, "file_getattr": 468, "file_setattr": 469,
}
AT_FDCWD = -100
O_RDONLY, O_WRONLY, O_CREAT, O_DIRECTORY, O_CLOEXEC = 0, 1, 0o100, 0o200000, 0o2000000
O_TMPFILE = 0o20000000 | O_DIRECTORY
S_IFCHR, S_IFBLK, S_IFIFO, S_IFREG = 0o020000, 0o060000, 0o010000, 0o100000
SIGCHLD = 17
CLONE_NEW = {"newns": 0x20000, "newcgroup": 0x2000000, "newuts": 0x4000000,
             "newipc": 0x8000000, "newuser": 0x10000000, "newpid": 0x20000000,
             "newnet": 0x40000000}
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
RENAME_NOREPLACE, RENAME_WHITEOUT = 1, 4
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK = 1, 2, 10, 16, 17, 40
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_CLOEXEC = 1, 2, 3, 0o2000000
NETLINK_ROUTE, NETLINK_KOBJECT_UEVENT = 0, 15
X32_SYSCALL_BIT = 0x40000000

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _arg(a: object) -> object:
    if a is None:
        return ctypes.c_void_p(None)
    if isinstance(a, int):
        return ctypes.c_ulong(a % (1 << 64))
    if isinstance(a, str):
        return ctypes.c_char_p(a.encode())
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    return ctypes.c_void_p(ctypes.addressof(a))  # a ctypes object: pass its address


def raw(name: str | int, *args: object) -> tuple[int, int]:
    """(return value, errno) of a raw syscall; errno is 0 on success."""
    nr = NR[name] if isinstance(name, str) else name
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return (r, ctypes.get_errno()) if r == -1 else (r, 0)


def err(name: str | int, *args: object) -> int:
    """Errno of a syscall (0 on success); a returned fd is closed."""
    r, e = raw(name, *args)
    if e == 0 and name in FD_RETURNING and r >= 0:
        os.close(r)
    return e


FD_RETURNING = {"open", "openat", "creat", "openat2", "open_tree", "open_tree_attr", "fsopen",
                "fsmount", "fspick", "perf_event_open", "userfaultfd", "io_uring_setup",
                "fanotify_init", "bpf", "open_by_handle_at", "pidfd_getfd", "pidfd_open",
                "socket", "memfd_secret"}


def in_child(fn) -> int | str:
    """Run fn() in a forked child; its return value (an errno) is the exit status."""
    pid = os.fork()
    if pid == 0:
        code = 255  # if fn raises
        try:
            code = fn()
        finally:
            os._exit(code & 0xFF)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return os.WEXITSTATUS(status)


def clone_and_reap(nr_name: str, *args: object) -> int:
    """clone/clone3 with no new stack: the child returns here like fork and exits."""
    r, e = raw(nr_name, *args)
    if e:
        return e
    if r == 0:
        os._exit(0)
    os.waitpid(r, 0)
    return 0


class Probe:
    def __init__(self, work: str) -> None:
        self.w = work
        self.cases: dict[str, object] = {}

    def path(self, name: str) -> str:
        return os.path.join(self.w, name)

    def fresh(self, name: str) -> str:
        """A path in WORKDIR with nothing at it."""
        p = self.path(name)
        if os.path.lexists(p):
            os.rmdir(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        return p

    def plain_file(self, name: str) -> str:
        p = self.fresh(name)
        with open(p, "w") as f:
            f.write("probe\n")
        return p

    def run(self, only: str | None = None) -> dict[str, object]:
        for name in dir(self):
            if not name.startswith("case_"):
                continue
            case = name[len("case_"):]
            if (only is None) == (case in SEPARATE) or (only and only != case):
                continue
            try:
                result = getattr(self, name)()
            except Exception as e:  # noqa: BLE001 - a probe bug, reported in the JSON
                result = f"exception: {type(e).__name__}: {e}"
            if isinstance(result, dict):
                self.cases.update(result)
            else:
                self.cases[case] = result
        return self.cases

    # -- tracing -----------------------------------------------------------------------
    def case_ptrace(self):
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(0)
        try:
            return err("ptrace", 0x4206, pid, 0, 0)  # PTRACE_SEIZE
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

    def _vm_iov(self):
        src = ctypes.create_string_buffer(b"probe", 8)
        dst = ctypes.create_string_buffer(8)
        iov = (ctypes.c_void_p * 2)
        return src, dst, iov(ctypes.addressof(dst), 8), iov(ctypes.addressof(src), 8)

    def case_process_vm_readv(self):
        _src, _dst, local, remote = self._vm_iov()  # the buffers must stay alive
        return err("process_vm_readv", os.getpid(), local, 1, remote, 1, 0)

    def case_process_vm_writev(self):
        _src, _dst, local, remote = self._vm_iov()
        return err("process_vm_writev", os.getpid(), remote, 1, local, 1, 0)

    def case_pidfd_getfd(self):
        pidfd, e = raw("pidfd_open", os.getpid(), 0)
        if e:
            return f"setup: pidfd_open errno {e}"
        try:
            return err("pidfd_getfd", pidfd, pidfd, 0)
        finally:
            os.close(pidfd)

    def case_kcmp(self):
        fd = os.open(self.w, os.O_RDONLY)
        try:
            return err("kcmp", os.getpid(), os.getpid(), 0, fd, fd)  # KCMP_FILE
        finally:
            os.close(fd)

    # -- mounts --------------------------------------------------------------------------
    def case_mount_and_umount2(self):
        d = self.fresh("mnt")
        os.mkdir(d)
        out = {"mount": err("mount", "probe", d, "tmpfs", 0, "size=64k")}
        out["umount2"] = err("umount2", d, 0)
        return out

    def case_pivot_root(self):
        a, b = self.fresh("pivot-a"), self.fresh("pivot-b")
        os.mkdir(a)
        os.mkdir(b)
        return err("pivot_root", a, b)  # not a mount point: EINVAL once past seccomp

    def case_chroot(self):
        return in_child(lambda: err("chroot", self.w))

    def case_open_tree(self):
        return err("open_tree", AT_FDCWD, self.w, O_CLOEXEC)  # a plain O_PATH-like fd

    def case_open_tree_attr(self):
        return err("open_tree_attr", AT_FDCWD, self.w, O_CLOEXEC, None, 0)

    def case_new_mount_api(self):
        """fsopen -> fsconfig(CREATE) -> fsmount -> move_mount onto WORKDIR/mnt2."""
        d = self.fresh("mnt2")
        os.mkdir(d)
        out = {}
        fs, out["fsopen"] = raw("fsopen", "tmpfs", 1)  # FSOPEN_CLOEXEC
        out["fsconfig"] = err("fsconfig", fs, 6, None, None, 0)  # FSCONFIG_CMD_CREATE
        m, out["fsmount"] = raw("fsmount", fs, 1, 0)  # FSMOUNT_CLOEXEC
        out["move_mount"] = err("move_mount", m, "", AT_FDCWD, d, 4)  # F_EMPTY_PATH
        out["fspick"] = err("fspick", AT_FDCWD, d, 1)  # FSPICK_CLOEXEC; no reconfigure
        attr = (ctypes.c_uint64 * 4)()  # struct mount_attr, all zero: a no-op
        out["mount_setattr"] = err("mount_setattr", AT_FDCWD, d, 0, attr, 32)
        raw("umount2", d, 2)  # MNT_DETACH
        for fd in (fs, m):
            if fd >= 0:
                os.close(fd)
        return out

    # -- namespaces ----------------------------------------------------------------------
    def case_unshare(self):
        return {"unshare_newuser": in_child(lambda: err("unshare", 0x10000000)),
                "unshare_nothing": err("unshare", 0)}

    def case_setns(self):
        fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
        try:
            return err("setns", fd, 0x4000000)  # rejoin our own UTS namespace
        finally:
            os.close(fd)

    def case_clone_new(self):
        return {f"clone_{n}": in_child(lambda f=f: clone_and_reap("clone", f | SIGCHLD,
                                                                   0, 0, 0, 0))
                for n, f in CLONE_NEW.items()}

    def case_clone3(self):
        args = (ctypes.c_uint64 * 11)()
        args[4] = SIGCHLD  # exit_signal
        return in_child(lambda: clone_and_reap("clone3", args, ctypes.sizeof(args)))

    # -- what must keep working --------------------------------------------------------
    def case_fork(self):
        return in_child(lambda: 0)

    def case_clone_plain(self):
        return in_child(lambda: clone_and_reap("clone", SIGCHLD, 0, 0, 0, 0))

    def case_thread(self):
        ran = []
        t = threading.Thread(target=lambda: ran.append(1))
        t.start()
        t.join()
        return 0 if ran else "thread did not run"

    def case_subprocess(self):
        return subprocess.run(["/bin/true"], check=False).returncode

    # -- keyring and attack surface ------------------------------------------------------
    def case_keyring(self):
        out = {"keyctl": err("keyctl", 0, -1, 1, 0, 0)}  # GET_KEYRING_ID(thread, create)
        _key, out["add_key"] = raw("add_key", "user", "corral-probe", b"x", 1, -1)
        out["request_key"] = err("request_key", "user", "corral-probe", None, -1)
        return out

    def case_bpf(self):
        attr = (ctypes.c_uint32 * 32)()
        attr[0:4] = [2, 4, 4, 1]  # BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
        return err("bpf", 0, attr, ctypes.sizeof(attr))  # BPF_MAP_CREATE

    def case_perf_event_open(self):
        attr = (ctypes.c_uint32 * 32)()
        attr[0], attr[1] = 1, 128  # PERF_TYPE_SOFTWARE, size
        attr[2] = 9  # config: PERF_COUNT_SW_DUMMY
        return err("perf_event_open", attr, 0, -1, -1, 8)  # PERF_FLAG_FD_CLOEXEC

    def case_userfaultfd(self):
        return err("userfaultfd", O_CLOEXEC)

    def case_fanotify_init(self):
        return err("fanotify_init", 0, O_RDONLY)  # FAN_CLASS_NOTIF

    def case_io_uring(self):
        params = (ctypes.c_uint8 * 120)()
        return {"io_uring_setup": err("io_uring_setup", 1, params),
                "io_uring_enter": err("io_uring_enter", -1, 0, 0, 0, None, 0),   # EBADF
                "io_uring_register": err("io_uring_register", -1, 0, None, 0)}  # EBADF

    # -- kernel code -----------------------------------------------------------------
    def case_kernel_code(self):
        junk = self.plain_file("not-a-module")
        fd = os.open(junk, os.O_RDONLY)
        try:
            return {
                "kexec_load": err("kexec_load", 0, 0, None, 0xDEAD0000),      # bad flags
                "kexec_file_load": err("kexec_file_load", -1, -1, 0, None, 0xDEAD0000),
                "init_module": err("init_module", b"not an ELF module", 17, ""),
                "finit_module": err("finit_module", fd, "", 0),
                "delete_module": err("delete_module", "corral_probe_absent", 0o4000),
                "create_module": err("create_module", "x", 0),
                "get_kernel_syms": err("get_kernel_syms", None),
                "query_module": err("query_module", "x", 0, None, 0, None),
            }
        finally:
            os.close(fd)

    def case_file_handles(self):
        handle = (ctypes.c_uint8 * 136)()
        ctypes.c_uint32.from_buffer(handle).value = 128  # handle_bytes
        mount_id = ctypes.c_int()
        out = {"name_to_handle_at": err("name_to_handle_at", AT_FDCWD, self.w, handle,
                                        mount_id, 0)}
        fd = os.open(self.w, os.O_RDONLY)
        try:
            out["open_by_handle_at"] = err("open_by_handle_at", fd, handle,
                                           O_RDONLY | O_DIRECTORY)
        finally:
            os.close(fd)
        return out

    # -- host-wide state (every argument set is harmless) ------------------------------
    def case_host_state(self):
        bad_tv = (ctypes.c_long * 2)(0, 2_000_000)      # tv_usec out of range: EINVAL
        ts = (ctypes.c_long * 2)(0, 0)
        timex = (ctypes.c_uint8 * 256)()                # modes = 0: read only
        host = os.uname().nodename.encode()
        with open("/proc/sys/kernel/domainname", "rb") as f:
            dom = f.read().strip()
        sysv = (ctypes.c_uint8 * 64)()
        return {
            "acct": err("acct", "/nonexistent/corral-acct"),                  # ENOENT
            "swapon": err("swapon", "/nonexistent/corral-swap", 0),          # ENOENT
            "swapoff": err("swapoff", "/nonexistent/corral-swap"),           # ENOENT
            "reboot": err("reboot", 0xDEAD, 0xBEEF, 0, None),                # bad magic
            "settimeofday": err("settimeofday", bad_tv, None),
            "clock_settime": err("clock_settime", 1, ts),  # CLOCK_MONOTONIC: EINVAL
            "clock_adjtime": err("clock_adjtime", 0, timex),
            "adjtimex": err("adjtimex", timex),
            "sethostname": err("sethostname", host, len(host)),              # unchanged
            "setdomainname": err("setdomainname", dom, len(dom)),            # unchanged
            "syslog": err("syslog", 10, None, 0),                  # SYSLOG_ACTION_SIZE_BUFFER
            "quotactl": err("quotactl", 0x80000100, None, 0, None),          # Q_SYNC all
            "quotactl_fd": self._quotactl_fd(),
            "iopl": err("iopl", 0),
            "ioperm": err("ioperm", 0x80, 1, 0),                             # turn off
            "vhangup": in_child(self._vhangup_without_tty),
            "lookup_dcookie": err("lookup_dcookie", 0, None, 0),
            "nfsservctl": err("nfsservctl", 0, None, None),
            "uselib": err("uselib", "/nonexistent/corral-lib"),
            "ustat": err("ustat", os.stat(self.w).st_dev, sysv),
            "sysfs": err("sysfs", 3),                                        # count fs types
            "_sysctl": err("_sysctl", None),
        }

    @staticmethod
    def _vhangup_without_tty():
        os.setsid()  # a new session has no controlling terminal to hang up
        return err("vhangup")

    def _quotactl_fd(self):
        fd = os.open(self.w, os.O_RDONLY)
        try:
            return err("quotactl_fd", fd, 0x80000100 >> 8, 0, None)  # Q_SYNC, USRQUOTA
        finally:
            os.close(fd)

    def case_personality(self):
        def set_and_report(p: int):
            return lambda: err("personality", p)
        return {
            "personality_query": err("personality", 0xFFFFFFFF),
            "personality_linux": err("personality", 0),
            "personality_no_aslr": in_child(set_and_report(0x0040000)),
            "personality_linux32": in_child(set_and_report(0x0008)),
            "personality_high_garbage": in_child(set_and_report(0x1_0000_0008)),
            "personality_all_but_one": in_child(set_and_report(0xFFFFFFFE)),
        }

    # -- terminals ---------------------------------------------------------------------
    def case_ioctl(self):
        master, slave = os.openpty()
        c = ctypes.c_char(b"x")
        shift = ctypes.c_char(bytes([6]))  # TIOCL_GETSHIFTSTATE: a read
        winsize = (ctypes.c_ushort * 4)()
        try:
            return {
                "ioctl_tiocsti": err("ioctl", slave, TIOCSTI, c),
                "ioctl_tiocsti_high_bits": err("ioctl", slave, 0xDEAD_0000_0000 | TIOCSTI, c),
                "ioctl_tioclinux": err("ioctl", slave, TIOCLINUX, shift),
                "ioctl_tiocgwinsz": err("ioctl", slave, 0x5413, winsize),  # allowed
            }
        finally:
            os.close(master)
            os.close(slave)

    # -- set-id bits, device nodes, xattrs in a writable directory -----------------------
    def case_modes(self):
        f = self.plain_file("file")
        fd = os.open(f, os.O_RDONLY)
        try:
            out = {
                "chmod_suid": err("chmod", f, 0o4644),
                "chmod_sgid": err("chmod", f, 0o2644),
                "chmod_suid_high_bits": err("chmod", f, 0xFFFF0000 | 0o4644),
                "chmod_plain": err("chmod", f, 0o644),
                "fchmod_suid": err("fchmod", fd, 0o4644),
                "fchmod_plain": err("fchmod", fd, 0o600),
                "fchmodat_sgid": err("fchmodat", AT_FDCWD, f, 0o2644),
                "fchmodat_plain": err("fchmodat", AT_FDCWD, f, 0o640),
                "fchmodat2": err("fchmodat2", AT_FDCWD, f, 0o644, 0),
            }
        finally:
            os.close(fd)
        wo = O_WRONLY | O_CLOEXEC
        out.update({
            "open_creat_suid": err("open", self.fresh("o1"), wo | O_CREAT, 0o4644),
            "openat_creat_sgid": err("openat", AT_FDCWD, self.fresh("o2"), wo | O_CREAT, 0o2644),
            "creat_suid": err("creat", self.fresh("o3"), 0o4644),
            "creat_plain": err("creat", self.fresh("o4"), 0o644),
            "open_tmpfile_suid": err("open", self.w, wo | O_TMPFILE, 0o4644),
            "openat_tmpfile_sgid": err("openat", AT_FDCWD, self.w, wo | O_TMPFILE, 0o2644),
            "openat_creat_plain": err("openat", AT_FDCWD, self.fresh("o5"), wo | O_CREAT, 0o644),
            "open_existing_suid_mode": err("open", f, O_RDONLY | O_CLOEXEC, 0o4644),
            "openat2": self._openat2(f),
            "mknod_chr": err("mknod", self.fresh("n1"), S_IFCHR | 0o600, os.makedev(1, 3)),
            "mknodat_blk": err("mknodat", AT_FDCWD, self.fresh("n2"), S_IFBLK | 0o600,
                               os.makedev(7, 250)),
            "mknod_reg_suid": err("mknod", self.fresh("n3"), S_IFREG | 0o4644, 0),
            "mknodat_reg_sgid": err("mknodat", AT_FDCWD, self.fresh("n4"), S_IFREG | 0o2644, 0),
            "mknod_fifo": err("mknod", self.fresh("n5"), S_IFIFO | 0o644, 0),
            "mknodat_reg_plain": err("mknodat", AT_FDCWD, self.fresh("n6"), S_IFREG | 0o644, 0),
            "mkdir_sgid": err("mkdir", self.fresh("d1"), 0o2755),
        })
        for name in ("o1", "o2", "o3", "o4", "o5", "n1", "n2", "n3", "n4", "n5", "n6", "d1"):
            self.fresh(name)  # leave no set-id file or device node behind
        return out

    def _openat2(self, path: str):
        how = (ctypes.c_uint64 * 3)(O_RDONLY | O_CLOEXEC, 0, 0)
        return err("openat2", AT_FDCWD, path, how, ctypes.sizeof(how))

    def case_xattrs(self):
        f = self.plain_file("xfile")
        fd = os.open(f, os.O_RDONLY)
        # struct vfs_cap_data, revision 2, effective, permitted CAP_NET_BIND_SERVICE
        cap = (ctypes.c_uint32 * 5)(0x02000001, 1 << 10, 0, 0, 0)
        val = ctypes.create_string_buffer(b"v", 1)
        xargs = (ctypes.c_uint64 * 2)(ctypes.addressof(val), 1)  # struct xattr_args
        try:
            return {
                "setxattr": err("setxattr", f, "user.a", b"v", 1, 0),
                "removexattr": err("removexattr", f, "user.a"),
                "lsetxattr": err("lsetxattr", f, "user.b", b"v", 1, 0),
                "lremovexattr": err("lremovexattr", f, "user.b"),
                "fsetxattr": err("fsetxattr", fd, "user.c", b"v", 1, 0),
                "fremovexattr": err("fremovexattr", fd, "user.c"),
                "setxattr_capability": err("setxattr", f, "security.capability", cap,
                                           ctypes.sizeof(cap), 0),
                "setxattrat": err("setxattrat", AT_FDCWD, f, 0, "user.d", xargs, 16),
                "removexattrat": err("removexattrat", AT_FDCWD, f, 0, "user.d"),
                "listxattr": err("listxattr", f, None, 0),  # reading stays allowed
            }
        finally:
            os.close(fd)
            self.fresh("xfile")

    # -- renameat2: RENAME_WHITEOUT leaves a 0:0 character device at the old name ---------
    def case_renameat2(self):
        out = {}
        for case, flags in (("renameat2_whiteout", RENAME_WHITEOUT),
                            ("renameat2_whiteout_high_bits", 0xDEAD_0000_0000 | RENAME_WHITEOUT),
                            ("renameat2_noreplace", RENAME_NOREPLACE)):
            old, new = self.plain_file("r-old"), self.fresh("r-new")
            out[case] = err("renameat2", AT_FDCWD, old, AT_FDCWD, new, flags)
        for name in ("r-old", "r-new"):
            self.fresh(name)  # the whiteout, where the control made one
        return out

    # -- socket families ---------------------------------------------------------------
    def case_sockets(self):
        pair = (ctypes.c_int * 2)()

        def socketpair(family):
            e = err("socketpair", family, SOCK_STREAM | SOCK_CLOEXEC, 0, pair)
            if e == 0:
                os.close(pair[0])
                os.close(pair[1])
            return e

        s = SOCK_CLOEXEC
        return {
            "socket_unix": err("socket", AF_UNIX, SOCK_STREAM | s, 0),
            "socket_inet": err("socket", AF_INET, SOCK_DGRAM | s, 0),
            "socket_inet6": err("socket", AF_INET6, SOCK_STREAM | s, 0),
            "socket_netlink_route": err("socket", AF_NETLINK, SOCK_RAW | s, NETLINK_ROUTE),
            "socket_vsock": err("socket", AF_VSOCK, SOCK_STREAM | s, 0),
            "socket_vsock_high_bits": err("socket", (1 << 32) | AF_VSOCK, SOCK_STREAM | s, 0),
            "socket_packet": err("socket", AF_PACKET, SOCK_RAW | s, 0),
            "socket_netlink_uevent": err("socket", AF_NETLINK, SOCK_DGRAM | s,
                                         NETLINK_KOBJECT_UEVENT),
            "socketpair_unix": socketpair(AF_UNIX),
            "socketpair_inet": socketpair(AF_INET),   # EOPNOTSUPP from the kernel
        }

    # -- not on the allow list: ENOSYS (arguments that get past the kernel's own checks,
    # or fail them with another errno) ------------------------------------------------
    def case_not_allowed(self):
        page = mmap.mmap(-1, mmap.PAGESIZE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        fd = os.open(self.plain_file("cached"), os.O_RDONLY)
        rng = (ctypes.c_uint64 * 2)()
        cstat = (ctypes.c_uint64 * 5)()
        size = ctypes.c_uint64(0)
        try:
            return {
                "modify_ldt": err("modify_ldt", 0, None, 0),                       # read
                "mbind": err("mbind", addr, mmap.PAGESIZE, 0, None, 0, 0),       # DEFAULT
                "set_mempolicy": err("set_mempolicy", 0, None, 0),               # DEFAULT
                "get_mempolicy": err("get_mempolicy", None, None, 0, None, 0),
                "migrate_pages": err("migrate_pages", 0, 0, None, None),
                "move_pages": err("move_pages", 0, 0, None, None, None, 0),
                "fanotify_mark": err("fanotify_mark", -1, 0, 0, AT_FDCWD, None),  # EBADF
                "process_madvise": err("process_madvise", -1, None, 0, 0, 0),     # EBADF
                "memfd_secret": err("memfd_secret", O_CLOEXEC),
                "process_mrelease": err("process_mrelease", -1, 0),              # EBADF
                "set_mempolicy_home_node": err("set_mempolicy_home_node", addr,
                                               mmap.PAGESIZE, 0, 0),
                "cachestat": err("cachestat", fd, rng, cstat, 0),
                "statmount": err("statmount", None, None, 0, 0),                  # EFAULT
                "listmount": err("listmount", None, None, 0, 0),                  # EFAULT
                "lsm_get_self_attr": err("lsm_get_self_attr", 0, None, size, 0),  # EINVAL
                "lsm_set_self_attr": err("lsm_set_self_attr", 0, None, 0, 0),     # EINVAL
                "lsm_list_modules": err("lsm_list_modules", None, size, 0),
                "mseal": err("mseal", addr, mmap.PAGESIZE, 1),                    # EINVAL
                "getxattrat": err("getxattrat", AT_FDCWD, self.w, 0, "user.x", None, 0),
                "listxattrat": err("listxattrat", AT_FDCWD, self.w, 0, None, 0),
                "file_getattr": err("file_getattr", AT_FDCWD, self.w, None, 0, 0),
                "file_setattr": err("file_setattr", AT_FDCWD, self.w, None, 0, 0),
            }
        finally:
            os.close(fd)
            self.fresh("cached")

    # -- entry points that kill the process when refused (run one per process) ----------
    def case_x32(self):
        return err(X32_SYSCALL_BIT | NR["getpid"])

    def case_int80(self):
        """getpid through the 32-bit int 0x80 entry: mov eax, 20; int 0x80; ret."""
        code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
        buf = mmap.mmap(-1, mmap.PAGESIZE,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        pid = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
        return 0 if pid == os.getpid() else f"int 0x80 getpid returned {pid}"


SEPARATE = ("x32", "int80")


def main() -> None:
    work = sys.argv[1]
    only = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--case" else None
    print(json.dumps(Probe(work).run(only), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
