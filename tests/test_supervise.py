"""supervise.spawn: the C fork+exec (CPython's own, as subprocess uses it) and the Python
fork it falls back to (or takes for a child_setup) must start the same child."""

import os

import pytest

from corral import supervise
from corral.errors import SandboxSetupError

UID = 1_500_000_123
PATHS = ["c", "python"] if supervise._fork_exec is not None else ["python"]


def start(path, argv, how, **kw):
    setup = (lambda: None) if how == "python" else None
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        return supervise.spawn(path, argv, {"PATH": "/usr/bin:/bin", "X": "y"},
                               stdin_fd=devnull, child_setup=setup, **kw)
    finally:
        os.close(devnull)


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
    kw = {"uid": UID, "gid": UID} if os.geteuid() == 0 else {}
    try:
        script = ("id -u; id -g; id -G; echo $X; ls /proc/self/fd | sort -n | tr '\\n' ' '; "
                  "echo; grep -E 'SigIgn|SigBlk' /proc/self/status; echo err >&2")
        code, out, err = finish(*start("/bin/sh", ["sh", "-c", script], how,
                                       pass_fds=(keep_w,), **kw))
    finally:
        for fd in (keep_r, keep_w, other_r, other_w):
            os.close(fd)
    lines = out.splitlines()
    assert code == 0 and err == "err\n"
    if kw:
        assert lines[:3] == [str(UID), str(UID), str(UID)]   # no supplementary groups left
    assert lines[3] == "y"
    fds = lines[4].split()
    assert str(keep_w) in fds and str(other_w) not in fds and str(other_r) not in fds
    assert "SigIgn:\t0000000000000000" in lines[5:]   # SIGPIPE, SIGXFSZ back to default


@pytest.mark.parametrize("how", PATHS)
def test_an_exec_failure_is_reported_with_its_errno(how):
    with pytest.raises(SandboxSetupError) as e:
        start("/nonexistent/tool", ["tool"], how, pass_fds=())
    assert e.value.errno == 2 and "No such file or directory" in str(e.value)
    assert e.value.step == "exec"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching ids needs root")
def test_real_ids_change_this_threads_real_ids_only():
    import threading

    from corral._sys import real_ids

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
