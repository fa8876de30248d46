"""supervise.spawn: the vfork with this thread's ids switched (_sys.child_ids), the C
fork+exec (CPython's own, as subprocess uses it) and the Python fork it falls back to (or
takes for a child_setup) must start the same child."""

import os

import pytest

from corral.errors import SandboxSetupError
from corral.linux import _sys, supervise

UID = 1_500_000_123
GID = UID + 1      # not the uid: a swapped pair would show
PATHS = (["vfork"] if os.geteuid() == 0 and _sys.child_ids.usable() else []) + (
    ["c", "python"] if supervise._fork_exec is not None else ["python"])


@pytest.fixture(autouse=True, params=["csys", "ctypes"])
def sys_calls(request, monkeypatch):
    """Every test twice: with _sys's calls from its C module and from ctypes (the
    fallback where it was not built; tests/linux/test_sys_calls.py)."""
    if request.param == "ctypes":
        from corral.linux import _sys_ctypes

        for name in ("mount", "umount2", "prctl", "prlimit", "syscall", "get_errno"):
            monkeypatch.setattr(_sys, f"_{name}", getattr(_sys_ctypes, name))
    return request.param


def start(path, argv, how, **kw):
    setup = (lambda: None) if how == "python" else None
    devnull = os.open(os.devnull, os.O_RDONLY)
    was = _sys._child_ids_ok
    if how != "vfork":
        _sys._child_ids_ok = False
    try:
        return supervise.spawn(path, argv, {"PATH": "/usr/bin:/bin", "X": "y"},
                               stdin_fd=devnull, child_setup=setup, **kw)
    finally:
        _sys._child_ids_ok = was
        os.close(devnull)


def thread_state() -> dict:
    """What child_ids changes and must put back, for the calling thread."""
    import ctypes

    with open("/proc/thread-self/status") as f:
        status = {k: v.split() for k, v in (line.split(":", 1) for line in f)}
    sig = ctypes.c_int(0)
    _sys._libc.prctl(_sys.PR_GET_PDEATHSIG, ctypes.addressof(sig), 0, 0, 0)
    return {"ids": (status["Uid"], status["Gid"], status["Groups"]),
            "caps": [status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")],
            "dumpable": _sys._libc.prctl(_sys.PR_GET_DUMPABLE, 0, 0, 0, 0),
            "keepcaps": _sys._libc.prctl(7, 0, 0, 0, 0),   # PR_GET_KEEPCAPS
            "pdeathsig": sig.value}


def finish(pid, out_r, err_r):
    out = b"".join(iter(lambda: os.read(out_r, 65536), b""))
    err = b"".join(iter(lambda: os.read(err_r, 65536), b""))
    os.close(out_r)
    os.close(err_r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(), err.decode()


@pytest.mark.parametrize("how", PATHS)
def test_the_child_gets_its_ids_fds_signals_and_environment(how):
    keep_r, keep_w = os.pipe()
    other_r, other_w = os.pipe()
    kw = {"uid": UID, "gid": GID} if os.geteuid() == 0 else {}
    if how == "vfork":
        assert kw, "the vfork path is for root only"
    try:
        script = ("id -u; id -g; id -G; echo $X; ls /proc/self/fd | sort -n | tr '\\n' ' '; "
                  "echo; grep -E 'SigIgn|SigBlk|Uid|Gid|Cap(Inh|Prm|Eff|Amb)' /proc/self/status;"
                  " echo err >&2")
        code, out, err = finish(*start("/bin/sh", ["sh", "-c", script], how,
                                       pass_fds=(keep_w,), **kw))
    finally:
        for fd in (keep_r, keep_w, other_r, other_w):
            os.close(fd)
    lines = out.splitlines()
    assert code == 0 and err == "err\n"
    if kw:
        assert lines[:3] == [str(UID), str(GID), str(GID)]   # no supplementary groups left
        status = {k: v.split() for k, v in (line.split(":", 1) for line in lines[5:])}
        assert status["Uid"] == [str(UID)] * 4 and status["Gid"] == [str(GID)] * 4
        for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert status[cap] == ["0000000000000000"], cap   # no capability at all
    assert lines[3] == "y"
    fds = lines[4].split()
    assert str(keep_w) in fds and str(other_w) not in fds and str(other_r) not in fds
    assert "SigIgn:\t0000000000000000" in lines[5:]   # SIGPIPE, SIGXFSZ back to default


@pytest.mark.parametrize("how", PATHS)
def test_an_exec_failure_is_reported_with_its_errno(how):
    kw = {"uid": UID, "gid": GID} if how == "vfork" else {}
    before = thread_state()
    with pytest.raises(SandboxSetupError) as e:
        start("/nonexistent/tool", ["tool"], how, pass_fds=(), **kw)
    assert thread_state() == before
    assert e.value.errno == 2 and "No such file or directory" in str(e.value)
    assert e.value.step == "exec"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching ids needs root")
def test_real_ids_change_this_threads_real_ids_only():
    import threading

    from corral.linux._sys import real_ids

    seen = {}
    go, done = threading.Event(), threading.Event()

    def other():            # started before the switch (a new thread copies its creator's)
        go.wait(10)
        seen["other"] = (os.getuid(), os.geteuid())
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with real_ids(UID, UID):
        seen["inside"] = (os.getuid(), os.getgid(), os.geteuid(), os.getegid())
        go.set()
        done.wait(10)
        with open("/proc/thread-self/status") as f:
            caps = [line for line in f if line.startswith("CapEff")]
    t.join()
    assert seen["inside"] == (UID, UID, 0, 0)         # real ids switched, effective kept
    assert seen["other"] == (0, 0)                     # another thread: untouched
    assert caps and caps[0].split()[1] != "0000000000000000"   # still privileged
    assert (os.getuid(), os.getgid()) == (0, 0)        # and back


@pytest.mark.skipif(os.geteuid() != 0 or not _sys.child_ids.usable(),
                    reason="child_ids is for a plain root process")
def test_child_ids_switch_this_thread_only_and_put_everything_back():
    """Inside: this thread is uid:gid through and through, without groups or effective
    capabilities; another thread is untouched. After: ids, groups, capabilities, the
    dumpable flag, keepcaps and the parent-death signal are exactly as before."""
    import threading

    seen = {}
    go, done = threading.Event(), threading.Event()

    def other():
        go.wait(10)
        seen["other"] = (os.getresuid(), os.getresgid(), os.getgroups())
        done.set()

    t = threading.Thread(target=other)
    t.start()
    groups = os.getgroups()
    os.setgroups([4, 5])       # a root with supplementary groups: they must not pass on
    _sys.set_pdeathsig(10)     # SIGUSR1: cleared by the kernel when euid changes
    try:
        before = thread_state()
        assert before["pdeathsig"] == 10 and before["keepcaps"] == 0
        with _sys.child_ids(UID, GID):
            inside = thread_state()
            go.set()
            done.wait(10)
        after = thread_state()
    finally:
        _sys.set_pdeathsig(0)
        os.setgroups(groups)
    t.join()
    assert inside["ids"] == ([str(UID)] * 4, [str(GID)] * 4, [])
    assert inside["caps"][2] == ["0000000000000000"]           # nothing effective
    assert seen["other"] == ((0, 0, 0), (0, 0, 0), [4, 5])
    assert after == before


SETUP = {
    "another uid": "os.setresuid(65534, 65534, 65534)",
    "an ambient capability": (   # CAP_NET_BIND_SERVICE into inheritable, then ambient
        "import ctypes; libc = ctypes.CDLL(None); hdr = (ctypes.c_uint32 * 2)(0x20080522, 0); "
        "caps = (ctypes.c_uint32 * 6)(); assert libc.syscall(125, hdr, caps) == 0; "
        "caps[2] |= 1 << 10; assert libc.syscall(126, hdr, caps) == 0; "
        "assert libc.prctl(47, 2, 10, 0, 0) == 0"),
}


@pytest.mark.skipif(os.geteuid() != 0 or os.uname().machine != "x86_64",
                    reason="sets up root processes with x86_64 syscall numbers")
@pytest.mark.parametrize("state", SETUP)
def test_child_ids_is_not_used_by_a_process_that_is_not_plain_root(state):
    """Such a process forks and lets the child setuid instead (a vfork child would keep
    an ambient capability across its exec)."""
    import subprocess
    import sys

    # corral imported first: the checkout may not be readable by another uid
    code = (f"import os\nfrom corral.linux import _sys\n{SETUP[state]}\n"
            "print(_sys.child_ids.usable())")
    control = subprocess.run([sys.executable, "-c", code.replace(SETUP[state], "pass")],
                             capture_output=True, text=True, check=True).stdout
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert (control, out) == ("True\n", "False\n")


@pytest.mark.skipif(os.geteuid() != 0 or not _sys.child_ids.usable(),
                    reason="child_ids is for a plain root process")
def test_a_child_forked_while_another_thread_is_inside_child_ids_can_use_it():
    """os.fork() copies only the forking thread: the lock that another thread held in the
    parent must be a fresh one in the child, or its first sandbox would wait forever."""
    import threading
    import time

    inside, leave = threading.Event(), threading.Event()

    def hold():
        with _sys.child_ids(UID, GID):
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with _sys.child_ids(UID, GID):
                    code = 0 if os.getresuid() == (UID, UID, UID) else 2
            finally:
                os._exit(code)
    finally:
        leave.set()
        t.join()
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited for a lock its parent's thread held")
    assert os.waitstatus_to_exitcode(done[1]) == 0


@pytest.mark.parametrize("how", PATHS)
def test_the_callers_ignored_and_blocked_signals_do_not_pass_on(how):
    """exec keeps SIG_IGN and the signal mask: a caller under nohup (SIGHUP, SIGINT
    ignored) with signals blocked in its thread must not hand them to the child, whatever
    path spawn takes; the caller's own dispositions and mask stay as they were."""
    import signal

    kw = {"uid": UID, "gid": GID} if how == "vfork" else {}
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP)}
    for s in saved:
        signal.signal(s, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
    try:
        code, out, _ = finish(*start("/bin/grep", ["grep", "-E", "^Sig(Ign|Blk):",
                                                    "/proc/self/status"], how, pass_fds=(),
                                     **kw))
        after = (signal.getsignal(signal.SIGINT),
                 signal.pthread_sigmask(signal.SIG_BLOCK, []))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, h in saved.items():
            signal.signal(s, h)
    assert code == 0
    assert out.split() == ["SigBlk:", "0" * 16, "SigIgn:", "0" * 16]
    assert after[0] == signal.SIG_IGN and {signal.SIGTERM, signal.SIGUSR1} <= after[1]
