"""linux/enter.py: a live sandbox's command is reaped by the entrants' zygote, which sends
its wait status back. A status nobody took (the command's supervision ended early) must
never be taken for a later command's when the kernel gives that command the same pid:
the statuses are keyed by the zygote's request number, not by pid.

Pid reuse is made to happen, not waited for: the test runs in a pid namespace of its own
(unshare --pid), where nothing else takes pids, and sets ns_last_pid just before the
second command forks, so it gets the first one's pid."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT, tier_unavailable

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

SCRIPT = r"""
import json, os, select, sys
import corral

def wait_exit(pidfd):
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    assert p.poll(30_000), "the command did not exit"

sb = corral.Sandbox.create({"isolation": "namespace"}, timeout=120)
live = sb._live
env = {"PATH": "/usr/bin:/bin"}
out = {}
# the first command exits 3; its status is left unread on the zygote's socket
first = live.start(["/bin/sh", "-c", "exit 3"], env, cwd="/", stdin_fd=0)
wait_exit(first.pidfd)
first.before_wait()
out["first"] = first.pid
for _ in range(20):
    live.prepare()                    # the next entrant, forked ahead (it takes a pid)
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(first.pid - 1))
    second = live.start(["/bin/sh", "-c", "exit 5"], env, cwd="/", stdin_fd=0)
    wait_exit(second.pidfd)
    second.before_wait()
    status = second.exit_status(second.pid)
    if second.pid == first.pid:
        out["second"], out["status"] = second.pid, status
        break
    out.setdefault("missed", []).append(second.pid)
sb.kill()
print(json.dumps(out))
"""


def test_a_status_nobody_took_is_not_a_later_command_s_with_the_same_pid():
    if os.geteuid() != 0:
        pytest.skip("needs root: a pid namespace of its own and its ns_last_pid")
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                        SCRIPT], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got.get("second") == got["first"], f"the pid was not used again: {got}"
    assert os.WIFEXITED(got["status"]) and os.WEXITSTATUS(got["status"]) == 5, got


def test_statuses_nobody_took_are_let_go():
    """A command whose supervision ended early (its on_stdout raised) never takes its
    status: the zygote's reader keeps it for nobody. Keyed by request number, such
    statuses are never overwritten, so each is let go of with its entrant."""
    import gc

    import corral
    from corral.linux import enter

    def boom(_data):
        raise RuntimeError("the caller's callback failed")

    s = corral.Sandbox.create({"isolation": "namespace"}, timeout=300)
    try:
        for _ in range(30):
            with pytest.raises(RuntimeError):
                s.commands.run(["/bin/sh", "-c", "echo x; exec sleep 0.05"], on_stdout=boom,
                               timeout=60)
        import time

        time.sleep(0.5)              # they have all exited: their statuses are sent
        assert s.exec(["/bin/echo", "still"]).stdout == "still\n"   # reads them in
        (z,) = enter._zygote_now
        # let go of once their entrants are (the audit thread holds the last commands'
        # handles a moment, until it has recorded them)
        for _ in range(300):
            gc.collect()
            if not z._statuses:
                break
            time.sleep(0.1)
        assert z._statuses == {}, z._statuses
        assert len(z._forgotten) <= 30
    finally:
        s.kill()


FORGET = r"""
import gc, weakref
from corral.linux import enter

z = enter._Zygote()                   # a real zygote, this process's own


class Command:                        # a command's entrant, in a reference cycle
    pass


c = Command()
c.me = c
weakref.finalize(c, z.forget, 7)      # as Entrant.start registers it
del c
with z._cond:                         # inside status_of's locked section, the GC runs
    gc.collect()
z.sock.close()
z.status_sock.close()
print("done")
"""


def test_forgetting_a_status_never_waits_for_the_zygotes_lock():
    """Entrant's finalizer (zygote.forget) runs wherever the cyclic GC runs, which may be a
    thread inside status_of holding the zygote's lock (not reentrant): it must not take
    that lock, or the thread deadlocks on itself."""
    p = subprocess.run([sys.executable, "-c", FORGET], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 0 and p.stdout == "done\n", p.stderr[-2000:]


# -- a failure after the command started (the handover) -------------------------------------
# The entrant (A) runs under the sandbox's seccomp program from its ready on, so a program
# that refuses pidfd_open (434 on every architecture) makes the kernel fail A's handover of
# a command that has already been exec'd: the real failure, no mock.

def _refusing_pidfd_open(action: int) -> bytes:
    import struct

    def insn(code, k, jt=0, jf=0):
        return struct.pack("<HBBI", code, jt, jf, k)

    return (insn(0x20, 0)                      # A = seccomp_data.nr
            + insn(0x15, 434, 0, 1)            # pidfd_open?
            + insn(0x06, action)               # then `action`
            + insn(0x06, 0x7FFF0000))          # else SECCOMP_RET_ALLOW


ERRNO_EPERM = 0x00050000 | 1
KILL_PROCESS = 0x80000000


def _with_cmdline(argv: list[str]) -> list[int]:
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if f.read() == want:
                        found.append(int(d))
            except OSError:
                pass
    return found


def _zombie_sleeps_of_zygote() -> list[int]:
    """The zygote's children that are zombie `sleep`s: a command killed but not reaped."""
    from corral.linux import enter

    z = enter._zygote_now[0].pid
    with open(f"/proc/{z}/task/{z}/children") as f:
        kids = f.read().split()
    out = []
    for k in kids:
        try:
            with open(f"/proc/{k}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if comm == "sleep" and state == "Z":
            out.append(int(k))
    return out


@pytest.fixture
def live_sb():
    import corral

    sb = corral.Sandbox.create({"isolation": "namespace"}, timeout=300)
    yield sb
    sb.kill()


def _use_program(sb, bpf: bytes):
    from corral.linux import enter

    live = sb._live
    with sb._lock:                   # the watchdog prepares entrants under it
        old, live.program = live.program, enter.Program(bpf)
        live.drop_entrant()          # one prepared with the old program
    return old


@pytest.mark.parametrize("action", [ERRNO_EPERM, KILL_PROCESS], ids=["refused", "A-killed"])
def test_a_command_not_handed_over_is_killed_and_said_so(live_sb, action):
    """The handover fails after exec: refused (A reports it) or A killed by the kernel
    (it says nothing). Either way the caller gets step "handover", not "enter" (which
    means nothing ran), and nothing of the command is left, running or unreaped."""
    from corral.errors import SandboxSetupError

    argv = ["/bin/sleep", "3599.25"]
    old = _use_program(live_sb, _refusing_pidfd_open(action))
    with pytest.raises(SandboxSetupError) as ei:
        live_sb.commands.run(argv, timeout=60)
    assert ei.value.step == "handover", ei.value
    assert ei.value.to_dict()["step"] == "handover"
    if action == ERRNO_EPERM:
        assert ei.value.errno == 1 and "killed" in str(ei.value), ei.value
    assert _with_cmdline(argv) == [], "the command outlived its failed handover"
    import time

    time.sleep(0.2)   # (A-killed: the zygote reaps what the cgroup's kill ended)
    assert _zombie_sleeps_of_zygote() == []
    _use_program(live_sb, old.bpf)
    r = live_sb.commands.run(["/bin/echo", "still"])     # the sandbox serves on
    assert r.exit_code == 0 and r.stdout == "still\n"


def test_the_entrant_itself_kills_and_reaps_a_command_it_could_not_hand_over(live_sb):
    """Without the sandbox's cgroup kill behind it (Entrant used alone): A kills the
    command it started, and start() returns only once the zygote has reaped it."""
    from corral.errors import SandboxSetupError
    from corral.linux import enter

    live = live_sb._live
    argv = ["/bin/sleep", "3599.75"]
    with live_sb._lock:
        cg = live._cgroup()
        attach = cg.attach_fds()
        try:
            entrant = enter.Entrant(live.target, attach,
                                    enter.Program(_refusing_pidfd_open(ERRNO_EPERM)))
        finally:
            for fd in attach:
                os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            with pytest.raises(SandboxSetupError) as ei:
                entrant.start(argv, {"PATH": "/usr/bin:/bin"}, cwd="/", stdin_fd=devnull,
                              rlimits=live.rlimits)
        finally:
            os.close(devnull)
        assert ei.value.step == "handover" and ei.value.errno == 1, ei.value
        # at once: no kill of ours came first, no wait
        assert _with_cmdline(argv) == [], "the entrant left its command running"
        assert _zombie_sleeps_of_zygote() == [], "the command was not reaped"
        assert cg.pids() == []
        assert entrant.seq not in entrant.zygote._statuses
        live.release(cg)



RETIRE = r"""
import json, os, select, sys, time
from corral.linux import enter, enter_inside

enter_inside.UNSENT_MAX = 8                  # read by the zygote as it is forked: below
enter_inside.RETIRED_FLUSH_S = 2.0
import corral


def wait_exit(pidfd, ms=30_000):
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(ms))


def start(sb, argv, stdin_fd):
    with sb._lock:                    # the watchdog prepares entrants under it
        return sb._live.start(argv, {"PATH": "/usr/bin:/bin"}, cwd="/", stdin_fd=stdin_fd)


def done(sb, s):
    assert wait_exit(s.pidfd), "a command did not exit"
    s.before_wait()
    for fd in (s.pidfd, s.out_r, s.err_r):
        os.close(fd)
    s.cgroup.kill_all()
    with sb._lock:
        sb._live.release(s.cgroup)


sb = corral.Sandbox.create({"isolation": "namespace"}, timeout=300)
devnull = os.open(os.devnull, os.O_RDONLY)
enter.warm()
first = enter._zygote_now[0]
out = {"first": first.pid}
# running across the retirement: its status must still come back right, from the old
# zygote (it exits 7 once its stdin ends)
r, w = os.pipe()
long = start(sb, ["/bin/sh", "-c", "read x; exit 7"], r)
os.close(r)
n = 0
while enter._zygote_now[0] is first and n < 4000:
    # its status nobody takes: it ends only when its stdin does, after start() has
    # looked (a command that ended before start() read its pid inside gets its status
    # read there, as a loaded machine made /bin/true's: then nothing piled up)
    r2, w2 = os.pipe()
    s = start(sb, ["/bin/cat"], r2)
    os.close(r2)
    os.close(w2)
    done(sb, s)
    n += 1
out["commands"] = n
out["replaced"] = enter._zygote_now[0] is not first
with open(f"/proc/{first.pid}/stat") as f:
    out["old_state"] = f.read().rsplit(")", 1)[1].split()[0]   # retired, not gone yet
old_fd = os.pidfd_open(first.pid)
s = start(sb, ["/bin/sh", "-c", "exit 5"], devnull)    # on the new zygote: its own status
assert wait_exit(s.pidfd)
s.before_wait()
out["new_status"] = s.exit_status(s.pid)
out["new_zygote"] = enter._zygote_now[0].pid
done(sb, s)
os.close(w)                          # the long one ends; the old zygote reaps it
assert wait_exit(long.pidfd)
long.before_wait()
out["long_status"] = long.exit_status(long.pid)
done(sb, long)
# with none of its commands left, the old zygote sends what it holds (or gives up
# after RETIRED_FLUSH_S) and exits; the next use reaps it
out["old_exited"] = wait_exit(old_fd, 10_000)
s = start(sb, ["/bin/true"], devnull)
done(sb, s)
try:
    os.waitpid(first.pid, os.WNOHANG)
    out["old_reaped"] = False
except ChildProcessError:
    out["old_reaped"] = True
out["retired_left"] = len(enter._zygote_retired)
sb.kill()
print(json.dumps(out))
"""


def test_a_zygote_whose_statuses_nobody_reads_retires_and_is_replaced():
    """The entrants' zygote keeps at most UNSENT_MAX statuses its supervisor has not read
    (beyond what the socket holds): then it retires instead of growing. The next command
    gets a new zygote; a command the old one started still gets its own status from it;
    the old one exits once its commands are reaped and is reaped itself."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a live namespace sandbox")
    p = subprocess.run([sys.executable, "-c", RETIRE], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["replaced"], f"no retirement after {got['commands']} unread statuses: {got}"
    assert got["old_state"] != "Z" and got["new_zygote"] != got["first"], got
    assert os.WEXITSTATUS(got["new_status"]) == 5 and os.WIFEXITED(got["new_status"]), got
    assert os.WIFEXITED(got["long_status"]) and os.WEXITSTATUS(got["long_status"]) == 7, got
    assert got["old_exited"] and got["old_reaped"] and got["retired_left"] == 0, got
