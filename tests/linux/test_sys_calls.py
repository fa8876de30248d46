"""corral.linux._sys's libc calls come from _csys (corral's C module, built by
scripts/setup.sh) or, where it was not built, from _sys_ctypes: the two must take the same
arguments, make the same calls and report errno alike. Each test runs on both; the whole
run path with the fallback is checked by one `corral run` under CORRAL_SYS_CTYPES=1."""

import errno
import json
import os
import resource
import subprocess
import sys
import threading

import pytest

from corral.linux import _sys, _sys_ctypes

try:
    from corral.linux import _csys
except ImportError:   # scripts/setup.sh builds it; the suite runs after setup.sh
    _csys = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALLS = {"csys": _csys, "ctypes": _sys_ctypes}
PR_GET_DUMPABLE, PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 3, 1, 2
NR_GETPID, NR_CAPGET = 39, 125   # x86_64


@pytest.fixture(params=list(CALLS))
def calls(request):
    if CALLS[request.param] is None:
        pytest.fail("corral.linux._csys is not built: run scripts/setup.sh")
    return CALLS[request.param]


def test_setup_built_the_c_module_and_sys_uses_it():
    assert _csys is not None, "scripts/setup.sh builds src/corral/linux/_csys*.so"
    assert _sys._calls is _csys and _sys._prctl is _csys.prctl


def test_prctl_takes_words_and_a_buffer_for_a_pointer(calls):
    assert calls.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) in (0, 1)
    assert calls.prctl(PR_GET_DUMPABLE) in (0, 1)          # missing words are 0
    box = bytearray(4)

    def in_a_thread():   # the parent-death signal is this thread's: a thread of its own
        assert calls.prctl(PR_SET_PDEATHSIG, 10, 0, 0, 0) == 0
        assert calls.prctl(PR_GET_PDEATHSIG, box, 0, 0, 0) == 0

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()
    assert int.from_bytes(box, sys.byteorder) == 10        # written through the pointer
    assert calls.prctl(-5, 0, 0, 0, 0) == -1 and calls.get_errno() == errno.EINVAL


def test_prlimit_sets_a_childs_limits_and_reports_a_refusal(calls):
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert calls.prlimit(p.pid, resource.RLIMIT_NOFILE, 64, 128) == 0
        assert resource.prlimit(p.pid, resource.RLIMIT_NOFILE) == (64, 128)
        big = 2 ** 64 - 1   # RLIM_INFINITY
        assert calls.prlimit(p.pid, resource.RLIMIT_CORE, 0, big) == 0
        assert resource.prlimit(p.pid, resource.RLIMIT_CORE) == (0, resource.RLIM_INFINITY)
        assert calls.prlimit(p.pid, resource.RLIMIT_NOFILE, 200, 100) == -1   # soft > hard
        assert calls.get_errno() == errno.EINVAL
        assert resource.prlimit(p.pid, resource.RLIMIT_NOFILE) == (64, 128)   # unchanged
    finally:
        p.kill()
        p.wait()
    with pytest.raises(OverflowError):
        calls.prlimit(0, resource.RLIMIT_NOFILE, -1, 10)


def test_syscall_passes_ints_none_and_buffers(calls):
    assert calls.syscall(NR_GETPID) == os.getpid()
    header = bytearray((0x20080522).to_bytes(4, sys.byteorder) + bytes(4))
    sets = bytearray(24)
    assert calls.syscall(NR_CAPGET, header, sets) == 0
    with open("/proc/self/status") as f:
        prm = next(int(ln.split()[1], 16) for ln in f if ln.startswith("CapPrm:"))
    got = int.from_bytes(sets[4:8], sys.byteorder) | int.from_bytes(sets[16:20],
                                                                      sys.byteorder) << 32
    assert got == prm                                   # the kernel wrote into the buffer
    assert calls.syscall(NR_CAPGET, header, None) == 0   # NULL: the version probe
    assert calls.syscall(NR_CAPGET, None, None) == -1 and calls.get_errno() == errno.EFAULT


def test_bad_arguments_are_refused_before_the_call(calls):
    with pytest.raises(ValueError, match="embedded NUL"):
        calls.umount2(b"/tmp/x\0/y", 0)
    with pytest.raises(TypeError):
        calls.umount2("/tmp/x", 0)                      # a str, not bytes
    with pytest.raises(BufferError):
        calls.syscall(NR_CAPGET, b"\0" * 8, bytearray(24))   # read-only: the kernel writes
    with pytest.raises(TypeError):
        calls.syscall(NR_GETPID, 1.5)
    with pytest.raises(TypeError):
        calls.syscall(NR_GETPID, 1, 2, 3, 4, 5, 6, 7)    # seven words
    with pytest.raises(TypeError):
        calls.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0, 0)      # five words


def test_errno_is_kept_per_thread(calls):
    seen = {}
    failed, read = threading.Event(), threading.Event()

    def other():
        seen["r"] = calls.umount2(b"/nonexistent-corral-test", 0)
        failed.set()
        read.wait(10)
        seen["errno"] = calls.get_errno()

    t = threading.Thread(target=other)
    t.start()
    failed.wait(10)
    assert calls.umount2(b"/proc/self/fd", 0) == -1     # not a mount point: EINVAL
    mine = calls.get_errno()
    read.set()
    t.join()
    assert seen == {"r": -1, "errno": errno.ENOENT} and mine == errno.EINVAL


@pytest.mark.skipif(os.geteuid() != 0, reason="mount needs root")
def test_mount_and_umount_in_a_private_mount_namespace(calls):
    """In a child in a mount namespace of its own (unshare(1)): nothing reaches the host."""
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'src')!r})\n"
        f"from corral.linux import {calls.__name__.rsplit('.', 1)[1]} as c\n"
        "d = '/tmp'\n"
        "r = c.mount(b'tmpfs', d.encode(), b'tmpfs', 0x2 | 0x4, b'size=1m,mode=0700')\n"
        "st = os.statvfs(d)\n"
        "with open('/proc/self/mountinfo') as f:\n"
        "    line = [ln for ln in f if ln.split()[4] == d][-1]\n"
        "bad = c.mount(b'tmpfs', b'/nonexistent-corral-test', b'tmpfs', 0, b'')\n"
        "e = c.get_errno()\n"
        "u = c.umount2(d.encode(), 2)\n"
        "print(r, st.f_blocks * st.f_frsize, 'nosuid' in line and 'nodev' in line, bad, e, u)\n")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                          "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", str(1 << 20), "True", "-1", str(errno.ENOENT), "0"]


def test_corral_run_takes_the_ctypes_calls_when_asked(corral_bin):
    """CORRAL_SYS_CTYPES=1: the whole run path (the scratch mount, prlimit of the command,
    the vfork with the sandbox's ids, the subreaper) through ctypes, the same Result."""
    results = {}
    for which, env in (("csys", {}), ("ctypes", {"CORRAL_SYS_CTYPES": "1"})):
        p = subprocess.run(
            [corral_bin, "run", "--json", "--", "/bin/sh", "-c",
             "ulimit -n; ulimit -f; touch /tmp/x && echo wrote"],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout)
        results[which] = (r["verdict"], r["stdout"].split())
        probe = subprocess.run(
            [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
             "from corral.linux import _sys; print(_sys._calls.__name__)",
             os.path.join(ROOT, "src")], capture_output=True, text=True, timeout=60,
            env={**os.environ, **env})
        want = "corral.linux._csys" if which == "csys" else "corral.linux._sys_ctypes"
        assert probe.stdout.strip() == want
    assert results["csys"] == results["ctypes"]
    verdict, (nofile, fsize, wrote) = results["csys"]   # prlimit's, from outside
    assert verdict == "ok" and wrote == "wrote" and int(nofile) > 0 and fsize != "unlimited"
