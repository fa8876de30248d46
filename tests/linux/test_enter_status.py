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
