"""corral.linux.seccomp against the real kernel and real bubblewrap. No mocks.

tests/fixtures/syscall_probe.py makes every call the profile has an opinion on, with
arguments that succeed (or fail past seccomp, e.g. EINVAL on bad magic) for root, and prints
{case: errno or 0}. It runs in three bwraps, each with a fresh workdir:

  control        root with all capabilities in the initial user namespace, fresh mount,
                 UTS, IPC, PID, net and cgroup namespaces (so mounts and hostnames stay
                 private), no filter;
  filtered_root  the same plus `--seccomp FD`: the only difference from control is the
                 filter, so every errno that differs is the filter's doing, even for calls
                 the kernel would also refuse an unprivileged caller;
  sandbox        `bwrap --unshare-all ... --seccomp FD`, the shape the tier uses.

Per case: control != the deny errno, and both filtered runs == the expected errno.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT

from corral.linux import seccomp

PROBE = Path(FIXTURES) / "syscall_probe.py"
PYTHON = "/usr/bin/python3"
BWRAP_BASE = ["--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
PRIVILEGED = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
              "--unshare-cgroup", "--cap-add", "ALL"]
UNSHARE_ALL = ["--unshare-all"]
SIGSYS_EXIT = 128 + signal.SIGSYS  # how bwrap reports a child killed by SIGSYS

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="the unfiltered control runs need root")

EPERM, ENOSYS, EOPNOTSUPP = errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP
EAFNOSUPPORT, EPROTONOSUPPORT = errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT

# Probe case -> errno the filter must give. Grouped as in seccomp.py.
DENIED = {
    # tracing
    "ptrace": EPERM, "process_vm_readv": EPERM, "process_vm_writev": EPERM,
    "pidfd_getfd": EPERM, "kcmp": EPERM,
    # mounts
    "mount": EPERM, "umount2": EPERM, "pivot_root": EPERM, "chroot": EPERM,
    "open_tree": EPERM, "open_tree_attr": EPERM, "fsopen": EPERM, "fsconfig": EPERM,
    "fsmount": EPERM, "move_mount": EPERM, "fspick": EPERM, "mount_setattr": EPERM,
    # namespaces
    "unshare_newuser": EPERM, "unshare_nothing": EPERM, "setns": EPERM,
    "clone_newns": EPERM, "clone_newuts": EPERM, "clone_newipc": EPERM,
    "clone_newuser": EPERM, "clone_newpid": EPERM, "clone_newnet": EPERM,
    "clone_newcgroup": EPERM,
    # keyring, attack surface, kernel code, file handles
    "keyctl": EPERM, "add_key": EPERM, "request_key": EPERM,
    "bpf": EPERM, "perf_event_open": EPERM, "userfaultfd": EPERM, "fanotify_init": EPERM,
    "io_uring_setup": EPERM, "io_uring_enter": EPERM, "io_uring_register": EPERM,
    "kexec_load": EPERM, "kexec_file_load": EPERM, "init_module": EPERM,
    "finit_module": EPERM, "delete_module": EPERM, "create_module": EPERM,
    "get_kernel_syms": EPERM, "query_module": EPERM,
    "open_by_handle_at": EPERM, "name_to_handle_at": EPERM,
    # host-wide state and obsolete calls
    "acct": EPERM, "swapon": EPERM, "swapoff": EPERM, "reboot": EPERM,
    "settimeofday": EPERM, "clock_settime": EPERM, "clock_adjtime": EPERM,
    "adjtimex": EPERM, "sethostname": EPERM, "setdomainname": EPERM, "syslog": EPERM,
    "quotactl": EPERM, "quotactl_fd": EPERM, "iopl": EPERM, "ioperm": EPERM,
    "vhangup": EPERM, "lookup_dcookie": EPERM, "nfsservctl": EPERM, "uselib": EPERM,
    "ustat": EPERM, "sysfs": EPERM, "_sysctl": EPERM,
    # personality: only the query and PER_LINUX pass
    "personality_no_aslr": EPERM, "personality_linux32": EPERM,
    "personality_high_garbage": EPERM, "personality_all_but_one": EPERM,
    # terminals
    "ioctl_tiocsti": EPERM, "ioctl_tiocsti_high_bits": EPERM, "ioctl_tioclinux": EPERM,
    # ENOSYS so libc falls back to calls whose arguments the filter can see
    "clone3": ENOSYS, "openat2": ENOSYS, "fchmodat2": ENOSYS, "setxattrat": ENOSYS,
    "removexattrat": ENOSYS,
    # set-id modes and device nodes in a writable directory
    "chmod_suid": EPERM, "chmod_sgid": EPERM, "chmod_suid_high_bits": EPERM,
    "fchmod_suid": EPERM, "fchmodat_sgid": EPERM,
    "open_creat_suid": EPERM, "openat_creat_sgid": EPERM, "creat_suid": EPERM,
    "open_tmpfile_suid": EPERM, "openat_tmpfile_sgid": EPERM,
    "mknod_chr": EPERM, "mknodat_blk": EPERM, "mknod_reg_suid": EPERM,
    "mknodat_reg_sgid": EPERM,
    # writing extended attributes (security.capability among them)
    "setxattr": EOPNOTSUPP, "lsetxattr": EOPNOTSUPP, "fsetxattr": EOPNOTSUPP,
    "removexattr": EOPNOTSUPP, "lremovexattr": EOPNOTSUPP, "fremovexattr": EOPNOTSUPP,
    "setxattr_capability": EOPNOTSUPP,
    # a whiteout is a 0:0 character device; the kernel reads only the low 32 flag bits
    "renameat2_whiteout": EPERM, "renameat2_whiteout_high_bits": EPERM,
    # not on the allow list
    "modify_ldt": ENOSYS, "mbind": ENOSYS, "set_mempolicy": ENOSYS, "get_mempolicy": ENOSYS,
    "migrate_pages": ENOSYS, "move_pages": ENOSYS, "fanotify_mark": ENOSYS,
    "process_madvise": ENOSYS, "memfd_secret": ENOSYS, "process_mrelease": ENOSYS,
    "set_mempolicy_home_node": ENOSYS, "cachestat": ENOSYS, "statmount": ENOSYS,
    "listmount": ENOSYS, "lsm_get_self_attr": ENOSYS, "lsm_set_self_attr": ENOSYS,
    "lsm_list_modules": ENOSYS, "mseal": ENOSYS, "getxattrat": ENOSYS, "listxattrat": ENOSYS,
    "file_getattr": ENOSYS, "file_setattr": ENOSYS,
}

# Socket families on the namespace tier: unix, inet, inet6 and NETLINK_ROUTE only. Kept
# apart from DENIED and ALLOWED, which tests/particular/test_process_tier.py expects to
# hold there too: the process tier has socket rules of its own (process_seccomp.py, all
# EPERM).
SOCKET_DENIED = {
    "socket_vsock": EAFNOSUPPORT, "socket_vsock_high_bits": EAFNOSUPPORT,
    "socket_packet": EAFNOSUPPORT, "socket_netlink_uevent": EPROTONOSUPPORT,
    "socketpair_inet": EAFNOSUPPORT,
}
SOCKET_ALLOWED = ("socket_unix", "socket_inet", "socket_inet6", "socket_netlink_route",
                  "socketpair_unix")

# Cases whose unfiltered control gives the filter's errno on a host without the feature
# (no vsock transport, no NUMA, a kernel older than the call, memfd_secret off): there the
# filtered run proves nothing, and test_denied says so instead of passing.
HOST_DEPENDENT = {"socket_vsock", "socket_vsock_high_bits", "socket_packet",
                  "socket_netlink_uevent"} | {c for c, e in DENIED.items() if e == ENOSYS}

# Near misses of the rules above that must keep working.
ALLOWED = (
    "fork", "thread", "subprocess", "clone_plain", "personality_query", "personality_linux",
    "ioctl_tiocgwinsz", "chmod_plain", "fchmod_plain", "fchmodat_plain", "creat_plain",
    "openat_creat_plain", "open_existing_suid_mode", "mknod_fifo", "mknodat_reg_plain",
    "mkdir_sgid", "listxattr", "renameat2_noreplace",
)

#: what the namespace tier's profile gives
NS_DENIED = {**DENIED, **SOCKET_DENIED}
NS_ALLOWED = ALLOWED + SOCKET_ALLOWED


def bwrap(ns: list[str], work: Path, fd: int | None, argv: list[str],
          **kw) -> subprocess.CompletedProcess:
    filt = []
    if fd is not None:
        os.lseek(fd, 0, os.SEEK_SET)
        filt = ["--seccomp", str(fd)]
    cmd = ["bwrap", *ns, *BWRAP_BASE, "--bind", str(work), str(work), *filt, *argv]
    return subprocess.run(cmd, pass_fds=() if fd is None else (fd,), capture_output=True,
                          text=True, timeout=60, check=False, **kw)


def probe(ns: list[str], work: Path, fd: int | None, *extra: str) -> subprocess.CompletedProcess:
    return bwrap(ns, work, fd, [PYTHON, str(PROBE), str(work), *extra])


@pytest.fixture(scope="module")
def bpf(tmp_path_factory) -> bytes:
    return seccomp.bpf_bytes(str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def filter_fd(bpf):
    fd = seccomp.bpf_fd(bpf)
    yield fd
    os.close(fd)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, filter_fd) -> dict[str, dict]:
    out = {}
    for name, ns, fd in (("control", PRIVILEGED, None),
                         ("filtered_root", PRIVILEGED, filter_fd),
                         ("sandbox", UNSHARE_ALL, filter_fd)):
        r = probe(ns, tmp_path_factory.mktemp(name), fd)
        assert r.returncode == 0, f"{name}: probe failed: {r.stderr[-2000:]}"
        out[name] = json.loads(r.stdout)
    return out


@pytest.mark.parametrize("case", sorted(NS_DENIED))
def test_denied(runs, case):
    want = NS_DENIED[case]
    control = runs["control"][case]
    if control == want and case in HOST_DEPENDENT:
        pytest.skip(f"{case}: unfiltered, this host's kernel already answers "
                    f"{errno.errorcode[want]} (it lacks the call or the feature), so the "
                    "filtered run would prove nothing here")
    assert isinstance(control, int) and control != want, (
        f"{case}: unfiltered control gave {control!r}, so the filtered errno would prove "
        "nothing")
    assert runs["filtered_root"][case] == want, f"{case}: filtered root run"
    assert runs["sandbox"][case] == want, f"{case}: --unshare-all sandbox"


@pytest.mark.parametrize("case", NS_ALLOWED)
def test_allowed(runs, case):
    assert [runs[r][case] for r in ("control", "filtered_root", "sandbox")] == [0, 0, 0]


def test_probe_cases_match_the_tables(runs):
    for name, result in runs.items():
        assert set(result) == set(NS_DENIED) | set(NS_ALLOWED), name


def test_every_rule_is_probed():
    """Every syscall in the profile has at least one probe case with the right errno."""
    sys.path.insert(0, str(PROBE.parent))
    try:
        import syscall_probe
    finally:
        sys.path.pop(0)
    by_number = {nr: name for name, nr in syscall_probe.NR.items()}
    for rule in seccomp.rules():
        name = rule.syscall if isinstance(rule.syscall, str) else by_number[rule.syscall]
        cases = [c for c, e in NS_DENIED.items()
                 if e == rule.errno and (c == name or c.startswith(name + "_"))]
        assert cases, f"no probe case for {rule}"


def test_probe_numbers_match_libseccomp():
    import seccomp as libseccomp

    sys.path.insert(0, str(PROBE.parent))
    try:
        import syscall_probe
    finally:
        sys.path.pop(0)
    newer = {"setxattrat": seccomp.SETXATTRAT, "removexattrat": seccomp.REMOVEXATTRAT,
             "open_tree_attr": seccomp.OPEN_TREE_ATTR, "statmount": 457, "listmount": 458,
             "lsm_get_self_attr": 459, "lsm_set_self_attr": 460, "lsm_list_modules": 461,
             "mseal": 462, "getxattrat": 464, "listxattrat": 465, "file_getattr": 468,
             "file_setattr": 469}
    for name, nr in syscall_probe.NR.items():
        known = libseccomp.resolve_syscall(libseccomp.Arch.X86_64, name)
        assert known == nr or (known < 0 and newer.get(name) == nr), name


DOCKER_DEFAULT_DENIED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
    "delete_module", "finit_module", "get_kernel_syms", "init_module", "ioperm", "iopl",
    "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mount",
    "name_to_handle_at", "nfsservctl", "open_by_handle_at", "perf_event_open", "pivot_root",
    "process_vm_readv", "process_vm_writev", "ptrace", "query_module", "quotactl", "reboot",
    "request_key", "setns", "settimeofday", "swapon", "swapoff", "sysfs", "_sysctl",
    "umount2", "unshare", "uselib", "userfaultfd", "ustat",
)


def test_covers_docker_default_denials():
    always = {r.syscall for r in seccomp.rules() if not r.when}
    assert set(DOCKER_DEFAULT_DENIED) <= always
    conditional = {r.syscall for r in seccomp.rules() if r.when}
    assert {"clone", "personality"} <= conditional


def _personality_refused(x: int) -> bool:
    """Evaluate the personality rules in Python, as the BPF program does."""
    for r in seccomp.rules():
        if r.syscall != "personality":
            continue
        if all((x & c.mask) == c.value if c.op == "masked_eq" else x > c.value
               for c in r.when):
            return True
    return False


def test_personality_rules_table():
    assert not _personality_refused(0)
    assert not _personality_refused(0xFFFFFFFF)
    near = [1, 0x8, 0x20000, 0x40000, 0x0400000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE,
            0xFFFF_FFFF_FFFF_FFFF, 1 << 32, (1 << 32) | 0xFFFFFFFF]
    near += [1 << i for i in range(32)] + [0xFFFFFFFF ^ (1 << i) for i in range(32)]
    assert [x for x in near if not _personality_refused(x)] == []


# -- whole entry points that kill the process ---------------------------------------------

@pytest.mark.parametrize("case", ["x32", "int80"])
def test_foreign_syscall_entry_kills(tmp_path, filter_fd, case):
    control = probe(PRIVILEGED, tmp_path, None, "--case", case)
    assert control.returncode == 0, control.stderr
    result = json.loads(control.stdout)[case]
    # unfiltered, int 0x80 getpid works; x32 is ENOSYS on kernels without the x32 ABI
    assert result == 0 or (case == "x32" and result == ENOSYS)
    for ns in (PRIVILEGED, UNSHARE_ALL):
        r = probe(ns, tmp_path, filter_fd, "--case", case)
        assert (r.returncode, r.stdout) == (SIGSYS_EXIT, ""), r.stderr


def test_filter_has_the_x32_guard(bpf):
    assert seccomp._refuses_x32(bpf)
    assert not seccomp._refuses_x32(bpf[:8])


# -- what a shell in the workspace can leave behind -------------------------------------

SCRIPT = """
cd "$1"
cp /bin/true t1; chmod u+s t1
cp /bin/true t2; chmod 2755 t2
install -m 4755 /bin/true t3
cp -a seed t4
mknod c1 c 1 3
mknod b1 b 7 250
/usr/bin/python3 -c 'import os; os.close(os.open("t5", os.O_CREAT | os.O_WRONLY, 0o4755))'
cp /bin/true t6; /usr/sbin/setcap cap_net_raw+ep t6
cp -a src copy; echo $? > cp-status
mkfifo fifo
echo x > w0; /usr/bin/python3 -c 'import ctypes; ctypes.CDLL(None).renameat2(-100, b"w0", -100, b"w1", 4)'
exit 0
"""


def _planted(work: Path) -> list[str]:
    """Set-id files, device nodes and file capabilities in work (seed is ours)."""
    found = []
    for p in work.iterdir():
        st = p.lstat()
        if p.name != "seed" and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            found.append(f"{p.name}: set-id")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            found.append(f"{p.name}: device")
        if stat.S_ISREG(st.st_mode) and "security.capability" in os.listxattr(p):
            found.append(f"{p.name}: capability")
    return sorted(found)


def _workspace(path: Path) -> Path:
    (path / "script.sh").write_text(SCRIPT)
    (path / "src").write_text("data\n")
    os.setxattr(path / "src", "user.corral", b"1")
    seed = path / "seed"
    seed.write_bytes(Path("/bin/true").read_bytes())
    seed.chmod(0o4755)
    return path


def test_shell_cannot_plant_privilege_in_workspace(tmp_path, filter_fd):
    dirs = {}
    for name, ns, fd in (("control", PRIVILEGED, None), ("filtered_root", PRIVILEGED, filter_fd),
                         ("sandbox", UNSHARE_ALL, filter_fd)):
        work = tmp_path / name
        work.mkdir()
        _workspace(work)
        r = bwrap(ns, work, fd, ["/bin/sh", str(work / "script.sh"), str(work)])
        assert r.returncode == 0, r.stderr
        dirs[name] = work
    try:
        assert _planted(dirs["control"]) == [
            "b1: device", "c1: device", "t1: set-id", "t2: set-id", "t3: set-id",
            "t4: set-id", "t5: set-id", "t6: capability", "w0: device"]
        for name in ("filtered_root", "sandbox"):
            work = dirs[name]
            assert _planted(work) == [], name
            # cp -a carries on when xattrs cannot be copied; FIFOs still work
            assert (work / "cp-status").read_text() == "0\n", name
            assert (work / "copy").read_text() == "data\n"
            assert stat.S_ISFIFO((work / "fifo").lstat().st_mode)
            assert (work / "w0").read_text() == "x\n"  # the rename was refused
    finally:
        for work in dirs.values():  # leave no set-id file or device node on the host
            for p in work.iterdir():
                p.unlink()


# -- compiling, the cache, the fd -------------------------------------------------------

def _venv_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_cache_hit_returns_same_program_without_libseccomp(tmp_path):
    cache = tmp_path / "cache"
    first = seccomp.bpf_bytes(str(cache))
    assert first == seccomp.compile_bpf()
    [f] = cache.iterdir()
    assert f.name == f"seccomp-{seccomp.PROFILE_VERSION}-{seccomp.cache_key()}.bpf"
    assert f.read_bytes()[:-32] == first      # then its digest
    assert f.stat().st_mode & 0o777 == 0o600
    assert cache.stat().st_mode & 0o777 == 0o700
    r = _venv_python(
        "import sys; from corral.linux import seccomp as s\n"
        "data = s.bpf_bytes(sys.argv[1])\n"
        "print(len(data), 'seccomp' in sys.modules)", str(cache))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(len(first)), "False"]


def test_cache_key_follows_the_profile_source(tmp_path, monkeypatch):
    """The key follows seccomp.py's identity (and the cache module's): an edit of a rule (or
    of anything in the file) gives another file name, so a program built from other rules is
    never read."""
    from corral.linux import seccomp_cache

    key = seccomp.cache_key()
    assert len(key) == 32 and key == seccomp.cache_key()
    assert seccomp_cache.PROFILE_SOURCE == seccomp.__file__
    src = tmp_path / "seccomp.py"
    src.write_bytes(Path(seccomp.__file__).read_bytes().replace(
        b'"kexec_load"', b'"kexec_load "', 1))
    with monkeypatch.context() as m:
        m.setattr(seccomp_cache, "PROFILE_SOURCE", str(src))
        assert seccomp.cache_key() != key
    assert seccomp.cache_key() == key


def _key_with_source(monkeypatch, path) -> str:
    from corral.linux import seccomp_cache

    with monkeypatch.context() as m:
        m.setattr(seccomp_cache, "PROFILE_SOURCE", str(path))
        return seccomp.cache_key()


def test_cache_key_changes_with_any_edit_of_an_input(tmp_path, monkeypatch):
    """The key is made of the inputs' file identities, not their bytes; each way a file can
    change changes it: a write in place of the same size with the mtime set back (the
    change time moves), a new file renamed over it (another inode), a touch."""
    src = tmp_path / "seccomp.py"
    src.write_bytes(Path(seccomp.__file__).read_bytes())
    key = _key_with_source(monkeypatch, src)
    assert _key_with_source(monkeypatch, src) == key          # stable while nothing moves
    st = src.stat()
    data = src.read_bytes()
    edited = data.replace(b'"kexec_load"', b'"kexec_loaX"', 1)
    assert edited != data and len(edited) == len(data)
    with open(src, "r+b") as f:                              # in place, same size...
        f.write(edited)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))       # ...and the old mtime
    assert (src.stat().st_size, src.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    key2 = _key_with_source(monkeypatch, src)
    assert key2 != key
    new = tmp_path / "seccomp.py.new"                         # the same bytes, renamed in
    new.write_bytes(src.read_bytes())
    os.replace(new, src)
    key3 = _key_with_source(monkeypatch, src)
    assert key3 not in (key, key2)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1))   # a touch
    assert _key_with_source(monkeypatch, src) not in (key, key2, key3)


def test_cache_key_follows_the_binding(tmp_path, monkeypatch):
    """libseccomp's binding is found where `import seccomp` loads it (the first sys.path
    entry holding the extension), and another binding gives another key."""
    from corral.linux import seccomp_cache

    found = seccomp_cache._binding_file()
    r = _venv_python("import seccomp; print(seccomp.__file__)")
    assert r.returncode == 0, r.stderr
    assert found is not None and os.path.samefile(found, r.stdout.strip())
    key = seccomp.cache_key()
    other = tmp_path / "lib"
    other.mkdir()
    shutil.copy2(found, other / os.path.basename(found))     # same bytes, same mtime
    monkeypatch.setattr(sys, "path", [str(other), *sys.path])
    assert seccomp_cache._binding_file() == str(other / os.path.basename(found))
    assert seccomp.cache_key() != key


def test_an_edited_profile_is_not_read_from_the_cache(tmp_path, monkeypatch):
    """End to end: a program cached under the old key is left alone once the source
    changes (same size, mtime set back); bpf_bytes() compiles and stores it anew."""
    from corral.linux import seccomp_cache

    cache = tmp_path / "cache"
    src = tmp_path / "seccomp.py"
    src.write_bytes(Path(seccomp.__file__).read_bytes())
    monkeypatch.setattr(seccomp_cache, "PROFILE_SOURCE", str(src))
    good = from_disk(cache)
    [old] = cache.iterdir()
    evil = _allow_everything()                    # a stale entry: a validly made file...
    old.write_bytes(evil + seccomp._file_digest(str(old), evil))
    assert from_disk(cache) == evil               # (read while the key is unchanged)
    st = src.stat()
    with open(src, "r+b") as f:                   # ...then the profile is edited
        f.write(b"#")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert from_disk(cache) == good
    assert len(list(cache.iterdir())) == 2


def from_disk(cache):
    """bpf_bytes() as a new process would see it: without this process's own copy."""
    seccomp._built.clear()
    return seccomp.bpf_bytes(str(cache))


def test_cache_ignores_bad_files(tmp_path):
    cache = tmp_path / "cache"
    good = from_disk(cache)
    [f] = cache.iterdir()
    stored = f.read_bytes()
    f.write_bytes(stored[:-3])  # cut short
    assert from_disk(cache) == good
    assert f.read_bytes() == stored  # rewritten
    f.write_bytes(b"\0" * 8)   # a whole instruction, no digest
    assert from_disk(cache) == good
    f.write_bytes(stored)
    f.chmod(0o644)  # readable by others: not trusted
    assert from_disk(cache) == good
    assert f.stat().st_mode & 0o777 == 0o600
    f.write_bytes(stored)
    os.chown(f, 65534, 65534)  # not ours: not trusted
    assert from_disk(cache) == good
    assert f.stat().st_uid == os.geteuid()


def _allow_everything() -> bytes:
    """A program that allows every call (BPF_RET|BPF_K SECCOMP_RET_ALLOW)."""
    return (0x06).to_bytes(2, "little") + bytes(2) + (0x7FFF0000).to_bytes(4, "little")


def test_cache_refuses_a_tampered_program(tmp_path):
    """A program swapped in the cache file (allow everything, its old digest kept) is
    refused; so is one whose digest was recomputed but whose file is linked from
    elsewhere, or that sits in a directory others may write; each time the real program
    is compiled and the file written again."""
    cache = tmp_path / "cache"
    good = from_disk(cache)
    [f] = cache.iterdir()
    stored = f.read_bytes()
    evil = _allow_everything()
    f.write_bytes(evil + stored[-32:])              # the old digest: does not match
    assert from_disk(cache) == good
    assert f.read_bytes() == stored
    forged = evil + seccomp._file_digest(str(f), evil)
    f.write_bytes(forged)
    assert seccomp._read_cache(str(f)) == evil       # the digest alone is consistent...
    f.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(forged)
    elsewhere.chmod(0o600)
    os.link(elsewhere, f)                            # ...but a second link is refused
    assert from_disk(cache) == good
    f.unlink()
    f.symlink_to(elsewhere)                          # and so is a symbolic link
    assert from_disk(cache) == good
    assert not f.is_symlink() and f.read_bytes() == stored
    cache.chmod(0o770)                               # others may write the directory
    f.write_bytes(forged)
    assert seccomp._read_cache(str(f)) is None
    assert from_disk(cache) == good


def test_unusable_cache_dir_still_compiles(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert from_disk(blocker / "cache") == seccomp.compile_bpf()
    seccomp._built.clear()
    assert seccomp.bpf_bytes(None) == seccomp.compile_bpf()
    assert seccomp._built[None] == seccomp.compile_bpf()  # and kept for the next sandbox


def test_bpf_fd(bpf):
    fd = seccomp.bpf_fd(bpf)
    try:
        assert os.get_inheritable(fd)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert os.read(fd, len(bpf) + 1) == bpf
        os.lseek(fd, 0, os.SEEK_SET)
        with pytest.raises(PermissionError):  # sealed
            os.write(fd, b"x")
    finally:
        os.close(fd)


def test_missing_binding_names_the_fix(tmp_path):
    r = _venv_python(
        "import sys; sys.modules['seccomp'] = None\n"
        "from corral.linux import seccomp as s\n"
        "from corral.errors import BackendUnavailable\n"
        "for call in (s.compile_bpf, lambda: s.bpf_bytes(sys.argv[1])):\n"
        "    try:\n"
        "        call()\n"
        "    except BackendUnavailable as e:\n"
        "        print(e)\n", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all("python3-seccomp" in line for line in lines), lines


def test_the_same_errnos_through_corral_run(runs):
    """The profile as corral itself loads it, in a real corral sandbox: every denied call
    gives its errno (the control run above shows each succeeds unfiltered)."""
    import corral

    # the probe's source on stdin: a bind of tests/ would be refused for a checkout under
    # /tmp (a path corral builds itself)
    r = corral.run(["/bin/sh", "-c", f"mkdir -p /scratch/w && exec {PYTHON} - /scratch/w"],
                   stdin=PROBE.read_bytes())
    assert r.exit_code == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    wrong = {c: (got.get(c), want) for c, want in NS_DENIED.items() if got.get(c) != want}
    assert not wrong, wrong
    assert [c for c in NS_ALLOWED if got.get(c) != 0] == []



def test_not_allowed_calls_are_probed():
    sys.path.insert(0, str(PROBE.parent))
    try:
        import syscall_probe
    finally:
        sys.path.pop(0)
    by_number = {nr: name for name, nr in syscall_probe.NR.items()}
    for _, group in seccomp.NOT_ALLOWED:
        for call in group:
            name = by_number[call] if isinstance(call, int) else call
            assert DENIED.get(name) == ENOSYS or name in ("epoll_ctl_old", "epoll_wait_old",
                                                         "remap_file_pages"), name


def test_programs_stay_small():
    """The namespace program goes to bwrap in one pipe write of at most PIPE_BUF (4096
    bytes, 512 instructions: backends/namespace.py); the allow-list part is a few dozen."""
    ns = seccomp.compile_bpf()
    assert len(ns) <= 4096, len(ns) // 8
    passing = [seccomp.resolve(n) for n in seccomp.passed(seccomp.rules())]
    assert len(seccomp.allow_list_bpf(passing)) // 8 <= 48
    from corral.linux import process_seccomp

    assert len(process_seccomp.compile_bpf(1, "allow")) // 8 <= 600


# -- every tier, through corral ------------------------------------------------------------

def _tier(name: str) -> str:
    from conftest import tier_unavailable

    why = tier_unavailable(name)
    if why:
        pytest.skip(f"the {name} tier is not available here: {why}")
    return name


@pytest.fixture(params=("namespace", "gvisor", "process"))
def tier(request):
    return _tier(request.param)


def _host_vsock_port() -> int:
    """A vsock port this host can bind (VMADDR_CID_ANY), or skip: no vsock here at all."""
    import socket

    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError as e:
        pytest.skip(f"this host has no vsock at all (socket(AF_VSOCK): "
                    f"{errno.errorcode.get(e.errno, e)}; /dev/vsock "
                    f"{'exists' if os.path.exists('/dev/vsock') else 'is absent'})")
    with s:
        s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        return s.getsockname()[1]


VSOCK_BIND = """
import errno, socket, sys
port = int(sys.argv[1])
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
except OSError as e:
    print("socket", errno.errorcode[e.errno]); sys.exit(0)
try:
    s.bind((socket.VMADDR_CID_ANY, port)); s.listen()
    print("bound", port)
except OSError as e:
    print("bind", errno.errorcode[e.errno])
"""


def test_vsock_is_refused_on_every_tier(tier):
    """Shown on the old namespace tier: the sandbox bound a host vsock port (the host's
    own bind of it then failed with EADDRINUSE). Now socket(AF_VSOCK) is refused, and the
    host can bind the port the sandbox asked for."""
    import socket

    import corral

    port = _host_vsock_port()
    r = corral.run(["/usr/bin/python3", "-c", VSOCK_BIND, str(port)], {"isolation": tier})
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split() == ["socket", "EPERM" if tier == "process" else "EAFNOSUPPORT"]
    with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as s:
        s.bind((socket.VMADDR_CID_ANY, port))  # not taken by the sandbox


WHITEOUT = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
ws = os.environ.get("WS", os.environ["HOME"]).encode()
with open(ws + b"/old", "w") as f:
    f.write("x")
r = libc.renameat2(-100, ws + b"/old", -100, ws + b"/new", 4)  # RENAME_WHITEOUT
print("renamed" if r == 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_whiteout_plants_no_device_in_a_rw_workspace(tier, tmp_path):
    """renameat2(RENAME_WHITEOUT) made a 0:0 character device at the old name in a rw
    host workspace although mknod is filtered. The process tier, which refuses a rw
    workspace when corral is root, is tried in its HOME, a host directory (in scratch) too."""
    import corral

    ws = tmp_path / "ws"
    ws.mkdir()
    policy = {"isolation": tier, "env": {"set": {"WS": "/workspace"}},
              "filesystem": {"workspace": {"path": str(ws), "mode": "rw"}}}
    if tier == "process" and os.geteuid() == 0:
        policy = {"isolation": tier}  # HOME: <run dir>/scratch/home
    with corral.Sandbox(policy) as sb:
        r = sb.exec(["/usr/bin/python3", "-c", WHITEOUT])
        if "workspace" not in policy.get("filesystem", {}):
            ws = Path(sb._live.home)
        assert r.exit_code == 0, r.stderr
        assert r.stdout.split()[0] in ("EPERM", "EINVAL"), r.stdout
        for p in ws.iterdir():
            mode = p.lstat().st_mode
            assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)), f"{p.name}: a device node"
        assert (ws / "old").read_text() == "x" and not (ws / "new").exists()


UNLISTED = """
import ctypes, json, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
page = mmap.mmap(-1, mmap.PAGESIZE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()
print(json.dumps({"mbind": call(237, addr, mmap.PAGESIZE, 0, 0, 0, 0),
                  "set_mempolicy": call(238, 0, 0, 0), "nr_600": call(600),
                  "getpid": call(39)}))
"""


@pytest.mark.parametrize("name", ["namespace", "process"])
def test_calls_off_the_list_answer_enosys(name):
    import corral

    host = subprocess.run([PYTHON, "-c", UNLISTED], capture_output=True, text=True,
                          check=True, timeout=60)
    if json.loads(host.stdout)["mbind"] != 0:
        pytest.skip("mbind fails on this host without a filter (no NUMA)")
    r = corral.run([PYTHON, "-c", UNLISTED], {"isolation": _tier(name)})
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout) == {"mbind": ENOSYS, "set_mempolicy": ENOSYS,
                                    "nr_600": ENOSYS, "getpid": 0}


# A real workload on the allow list: pip building and installing a local package, pytest,
# git, gcc (a threaded C program), node, and CPython threads in C extensions.
WORKLOAD = r"""
set -e
mkdir -p "$WORK" && cd "$WORK"
export HOME="$WORK/home" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p home pkg/tinypkg
printf 'from setuptools import setup\nsetup(name="tinypkg", version="1.0", packages=["tinypkg"])\n' > pkg/setup.py
echo 'VALUE = 41' > pkg/tinypkg/__init__.py
/usr/bin/python3 -m pip wheel -q --no-deps --no-build-isolation -w dist ./pkg
/usr/bin/python3 -m pip install -q --no-deps --target site dist/tinypkg-1.0-py3-none-any.whl
PYTHONPATH=site /usr/bin/python3 -c 'import tinypkg; print("pip", tinypkg.VALUE + 1)'
printf 'def test_one():\n    assert 1 + 1 == 2\n' > test_tiny.py
"$VENV/bin/python" -m pytest -q -p no:cacheprovider test_tiny.py | tail -1
git init -q repo && cd repo
git -c user.name=t -c user.email=t@example.invalid commit -q --allow-empty -m first
echo "git $(git log --oneline | wc -l)"
cd ..
cat > t.c <<'EOF'
#include <pthread.h>
#include <stdio.h>
static long sum[4];
static void *work(void *p) { long i = (long)p; for (long k = 0; k < 100000; k++) sum[i] += k % 7; return 0; }
int main(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, work, (void *)i);
    long total = 0;
    for (int i = 0; i < 4; i++) { pthread_join(t[i], 0); total += sum[i]; }
    printf("gcc %ld\n", total);
    return 0;
}
EOF
gcc -O1 -pthread -o t t.c && ./t
node -e 'console.log("node", [1, 2, 3].map(x => x * 2).join(","))'
/usr/bin/python3 - <<'EOF'
import hashlib, sqlite3, zlib
from concurrent.futures import ThreadPoolExecutor
blob = bytes(range(256)) * 4096
def work(i):  # hashlib and zlib drop the GIL in C
    return hashlib.sha256(zlib.compress(blob + bytes([i]))).hexdigest()[:4]
with ThreadPoolExecutor(4) as ex:
    digests = list(ex.map(work, range(8)))
db = sqlite3.connect(":memory:")
db.execute("create table t (x)")
db.executemany("insert into t values (?)", [(i,) for i in range(100)])
print("threads", len(set(digests)), db.execute("select sum(x) from t").fetchone()[0])
EOF
"""


# ~10-15 s a tier: the process tier's run goes with the slow group (CI runs it too)
@pytest.mark.parametrize("name", ["namespace", pytest.param("process", marks=pytest.mark.slow)])
def test_a_real_workload_runs(name):
    import corral

    for tool in ("gcc", "git", "node"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed on this host")
    venv = Path(ROOT) / ".venv"
    r = corral.run(["/bin/sh", "-c", WORKLOAD],
                   {"isolation": _tier(name), "limits": {"timeout": "300s"},
                    "filesystem": {"ro_binds": [str(venv)]},
                    "env": {"set": {"WORK": "/scratch/w", "VENV": str(venv)}}})
    assert r.exit_code == 0, (r.stdout[-2000:], r.stderr[-3000:])
    lines = r.stdout.split("\n")
    assert "pip 42" in lines and "1 passed" in r.stdout and "git 1" in lines, r.stdout
    assert f"gcc {4 * sum(k % 7 for k in range(100000))}" in lines, r.stdout
    assert "node 2,4,6" in lines and "threads 8 4950" in lines, r.stdout
