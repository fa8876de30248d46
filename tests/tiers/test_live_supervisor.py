"""Live sandboxes' supervisor processes: a sandbox that outlives the process that made
it (connect from another process, the `corral sandbox` CLI), and what is left when a
supervisor is SIGKILLed, below a subreaper or not (runtime/supervisor.py). Split from
test_live.py; real bwrap, real runsc, real cgroups."""

from __future__ import annotations

import os

import pytest
from conftest import procs_of_uid
from livefix import TIERS, available, describe, gone, mounts_below, reap_ours, running, wait_for

import corral
from corral.errors import SandboxClosed, UsageError


@pytest.fixture(params=TIERS)
def tier(request):
    return available(request.param)


def _cli(*args, input=None, timeout=120):
    import subprocess

    from conftest import CORRAL

    return subprocess.run([CORRAL, *args], check=False, capture_output=True, text=True, input=input,
                          timeout=timeout)


def test_connect_from_another_process_and_the_sandbox_outlives_its_creator(tier):
    import subprocess
    import sys

    make = ("import corral\n"
            f"sb = corral.Sandbox.create({{'isolation': {tier!r}}}, timeout=60, detached=True,"
            " metadata={'k': 'v'})\n"
            "sb.commands.run('echo from-creator > /scratch/note')\n"
            "sb.commands.run(['sleep', '302'], background=True)\n"
            "print(sb.id)\n")
    p = subprocess.run([sys.executable, "-c", make], check=False, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()             # its creator has exited
    sb = corral.Sandbox.connect(sid)
    try:
        assert sb.get_info().metadata == {"k": "v"} and sb.get_info().isolation == tier
        assert sb.commands.run("cat /scratch/note").stdout == "from-creator\n"
        assert any(c.cmd == ("sleep", "302") for c in sb.commands.list())
        got = []
        h = sb.commands.run("read x; echo \"[$x]\"; exit 4", background=True,
                            on_stdout=got.append)
        h.send_stdin("typed\n")
        r = h.wait(60)
        assert (r.exit_code, r.stdout, b"".join(got)) == (4, "[typed]\n", b"[typed]\n")
        r = sb.commands.run("sleep 30", timeout=0.5)
        assert r.verdict == "timeout"
        r = sb.commands.run(["no-such-command"])
        assert r.exit_code == 127 and "not found" in r.stderr, r
    finally:
        sb.kill()
    with pytest.raises(SandboxClosed):
        corral.Sandbox.connect(sid)
    with pytest.raises(UsageError):
        corral.Sandbox.connect("../../etc")


def test_cli_create_ls_exec_kill(tier):
    p = _cli("sandbox", "create", "--isolation", tier, "--timeout", "60", "--memory", "256M")
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    try:
        assert sid in _cli("sandbox", "ls").stdout
        p = _cli("sandbox", "exec", sid, "--", "sh", "-c",
                 "echo kept > /scratch/x; sleep 300 > /dev/null 2>&1 &")
        assert p.returncode == 0, p.stderr
        p = _cli("sandbox", "exec", sid, "--", "sh", "-c", "cat /scratch/x; ps -e -o args")
        assert p.stdout.startswith("kept\n") and "sleep 300" in p.stdout.splitlines(), p
        assert _cli("sandbox", "exec", sid, "--", "sh", "-c", "exit 7").returncode == 7
        p = _cli("sandbox", "exec", sid, "--stdin", "--", "cat", input="piped")
        assert p.stdout == "piped"
        p = _cli("sandbox", "exec", sid, "--timeout", "1s", "--", "sleep", "30")
        assert p.returncode == 124 and "timeout" in p.stderr
        info = corral.Sandbox.connect(sid).get_info()
        assert info.usage["commands"] == 5
    finally:
        assert _cli("sandbox", "kill", sid).returncode == 0
    assert sid not in _cli("sandbox", "ls").stdout
    p = _cli("sandbox", "exec", sid, "--", "true")
    assert p.returncode == 125 and "no live sandbox" in p.stderr
    assert _cli("sandbox", "exec", "not-an-id", "--", "true").returncode == 2


def test_a_sigkilled_supervisor_leaves_nothing_after_the_sweep(tier):
    _sigkill_the_supervisor(tier)


def test_a_sigkilled_supervisor_below_a_subreaper_that_never_reaps_leaves_nothing(tier):
    """This process is a child subreaper, as corral makes its caller while a one-shot run
    or a live sandbox of its own lives, and it reaps nothing it did not start: the
    supervisor it starts, and what that leaves when killed, must not depend on it (the
    commands' zombies would be this process's, and the sandbox's init would wait for them
    to be reaped, in the kernel, for as long as this process lives)."""
    from corral.linux import _sys

    _sys.subreaper_acquire()
    try:
        _sigkill_the_supervisor(tier)
    finally:
        _sys.subreaper_release()


def test_an_in_process_sandbox_sigkilled_below_a_subreaper_that_never_reaps(tier):
    """A live sandbox opened in a process of its own (no supervisor, no reaper of
    corral's above it), that process SIGKILLed while a command runs, below this process
    as a child subreaper that reaps nothing it did not start: the commands must not be
    the dead process's children (their zombies would be this process's, never reaped,
    and the sandbox's init would wait for them in the kernel, running, for as long as
    this process lives). The entrants' zygote reaps them (linux/enter.py)."""
    import signal
    import subprocess
    import sys

    from corral.linux import _sys, rundir

    make = ("import os, sys, time, corral\n"
            "from corral.linux import rundir\n"
            f"sb = corral.Sandbox.create({{'isolation': {tier!r}}}, timeout=120)\n"
            "sb.commands.run(['sleep', '304'], background=True)\n"
            "d = os.path.join(rundir.base_dir(), sb.id)\n"
            "print(sb.id, os.stat(os.path.join(d, 'scratch')).st_uid, flush=True)\n"
            "time.sleep(300)\n")
    before = set(_children())
    _sys.subreaper_acquire()
    try:
        p = subprocess.Popen([sys.executable, "-c", make], stdout=subprocess.PIPE, text=True)
        try:
            sid, uid = p.stdout.readline().split()
        except ValueError:
            p.kill()
            p.wait()
            raise AssertionError("the creator did not start its sandbox") from None
        uid = int(uid)
        run_dir = os.path.join(rundir.base_dir(), sid)
        try:   # (gvisor's commands are inside its sentry: not host processes)
            assert tier == "gvisor" or "sleep 304" in " ".join(describe(procs_of_uid(uid)))
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            p.stdout.close()
        try:
            wait_for(lambda: not running(procs_of_uid(uid) + gone(sid)),
                      "the sandbox's init and every process inside to end")
        except AssertionError:
            raise AssertionError("still running: " + "; ".join(
                describe(running(procs_of_uid(uid) + gone(sid))))) from None
        # what the creator left came to this process (its zygote, bwrap): once they
        # have ended, reaped here, so no zombie of ours outlives the test
        wait_for(lambda: not running(list(set(_children()) - before)),
                  "the creator's zygote to end")
        reap_ours(list(set(_children()) - before))
    finally:
        _sys.subreaper_release()
    rundir.sweep_stale(rundir.base_dir())
    assert not os.path.exists(run_dir) and mounts_below(run_dir) == []


def _children() -> list[int]:
    """This process's children (every thread's)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _sigkill_the_supervisor(tier) -> None:
    import signal

    from corral.linux import rundir
    from corral.runtime import registry

    p = _cli("sandbox", "create", "--isolation", tier, "--timeout", "120")
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    entry = registry.read_entry(sid)
    parent = _parent(entry["pid"])   # (the supervisor's reaper: ours if we are a subreaper)
    ours = parent != os.getpid() and _parent(parent) == os.getpid()
    base = rundir.base_dir()
    run_dir = os.path.join(base, sid)
    uid = os.stat(os.path.join(run_dir, "scratch")).st_uid
    with open(os.path.join(run_dir, "cgroups")) as f:
        cgroups = [line.split()[3] for line in f if line.strip()]
    corral.Sandbox.connect(sid).commands.run(["sleep", "303"], background=True)
    assert procs_of_uid(uid) and cgroups and mounts_below(run_dir)
    os.kill(entry["pid"], signal.SIGKILL)
    # dead means exited: a zombie counts (while this process is a child subreaper, e.g.
    # a run_code interpreter of an earlier test still ending, orphans come to it), and
    # those that are ours are reaped after
    wait_for(lambda: not running([entry["pid"]]), "the supervisor's end")
    try:
        wait_for(lambda: not running(procs_of_uid(uid) + gone(sid)),
                  "bwrap (or runsc) and every process inside to die")
    except AssertionError:
        raise AssertionError(f"still running: {describe(running(procs_of_uid(uid) + gone(sid)))}") from None
    reap_ours([entry["pid"]])
    if ours:
        wait_for(lambda: not running([parent]), "the supervisor's reaper to end")
        reap_ours([parent])
    # (another corral process on this host may sweep it first: either way it goes)
    rundir.sweep_stale(base)
    assert not os.path.exists(run_dir) and mounts_below(run_dir) == []
    assert not any(map(os.path.exists, cgroups))
    assert registry.read_entry(sid) is None
    assert not os.path.exists(os.path.join(base, rundir.REGISTRY, sid + ".json"))
    assert sid not in _cli("sandbox", "ls").stdout
