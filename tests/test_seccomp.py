"""corral.linux.seccomp against the real kernel and real bubblewrap. No mocks.

tests/syscall_probe.py makes every call the profile has an opinion on, with arguments that
succeed (or fail past seccomp, e.g. EINVAL on bad magic) for root, and prints
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
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from corral.linux import seccomp

PROBE = Path(__file__).with_name("syscall_probe.py")
PYTHON = "/usr/bin/python3"
BWRAP_BASE = ["--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
PRIVILEGED = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
              "--unshare-cgroup", "--cap-add", "ALL"]
UNSHARE_ALL = ["--unshare-all"]
SIGSYS_EXIT = 128 + signal.SIGSYS  # how bwrap reports a child killed by SIGSYS

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="the unfiltered control runs need root")

EPERM, ENOSYS, EOPNOTSUPP = errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP

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
}

# Near misses of the rules above that must keep working.
ALLOWED = (
    "fork", "thread", "subprocess", "clone_plain", "personality_query", "personality_linux",
    "ioctl_tiocgwinsz", "chmod_plain", "fchmod_plain", "fchmodat_plain", "creat_plain",
    "openat_creat_plain", "open_existing_suid_mode", "mknod_fifo", "mknodat_reg_plain",
    "mkdir_sgid", "listxattr",
)


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


@pytest.mark.parametrize("case", sorted(DENIED))
def test_denied(runs, case):
    want = DENIED[case]
    control = runs["control"][case]
    assert isinstance(control, int) and control != want, (
        f"{case}: unfiltered control gave {control!r}, so the filtered errno would prove "
        "nothing")
    assert runs["filtered_root"][case] == want, f"{case}: filtered root run"
    assert runs["sandbox"][case] == want, f"{case}: --unshare-all sandbox"


@pytest.mark.parametrize("case", ALLOWED)
def test_allowed(runs, case):
    assert [runs[r][case] for r in ("control", "filtered_root", "sandbox")] == [0, 0, 0]


def test_probe_cases_match_the_tables(runs):
    for name, result in runs.items():
        assert set(result) == set(DENIED) | set(ALLOWED), name


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
        cases = [c for c, e in DENIED.items()
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
             "open_tree_attr": seccomp.OPEN_TREE_ATTR}
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
            "t4: set-id", "t5: set-id", "t6: capability"]
        for name in ("filtered_root", "sandbox"):
            work = dirs[name]
            assert _planted(work) == [], name
            # cp -a carries on when xattrs cannot be copied; FIFOs still work
            assert (work / "cp-status").read_text() == "0\n", name
            assert (work / "copy").read_text() == "data\n"
            assert stat.S_ISFIFO((work / "fifo").lstat().st_mode)
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
    assert f.read_bytes() == first
    r = _venv_python(
        "import sys; from corral import seccomp as s\n"
        "data = s.bpf_bytes(sys.argv[1])\n"
        "print(len(data), 'seccomp' in sys.modules)", str(cache))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(len(first)), "False"]


def from_disk(cache):
    """bpf_bytes() as a new process would see it: without this process's own copy."""
    seccomp._built.clear()
    return seccomp.bpf_bytes(str(cache))


def test_cache_ignores_bad_files(tmp_path):
    cache = tmp_path / "cache"
    good = from_disk(cache)
    [f] = cache.iterdir()
    f.write_bytes(good[:-3])  # not a whole number of instructions
    assert from_disk(cache) == good
    assert f.read_bytes() == good  # rewritten
    f.write_bytes(b"\0" * 8)
    f.chmod(0o666)  # writable by others: not trusted
    assert from_disk(cache) == good
    f.write_bytes(b"\0" * 8)
    f.chmod(0o644)
    os.chown(f, 65534, 65534)  # not ours: not trusted
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
        "from corral import seccomp as s\n"
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
    wrong = {c: (got.get(c), want) for c, want in DENIED.items() if got.get(c) != want}
    assert not wrong, wrong
    assert [c for c in ALLOWED if got.get(c) != 0] == []
