"""Fault injection on the microvm tier (issue 23), with a real QEMU guest (TCG here): a guest
that hangs is killed at its command's deadline, and nothing of it is left.

Two hangs, one boot each (slow: cold boots under TCG take tens of seconds):

  resists   the command ignores SIGTERM and leaves a setsid daemon that ignores it too:
            the agent's kill at the deadline must still end them all (kill(-1) as the
            command's uid), and the sandbox goes on working
  starved   the guest stops making progress while QEMU stays alive and signalable: QEMU's
            run cgroup throttled to 0.1% of a CPU (the guest kernel, the agent and the
            command all freeze, as in a hung kernel); the agent cannot answer the kill, so
            the host kills QEMU a grace period (KILL_GRACE) after the deadline
"""

import os
import time

import pytest
from vmfix import qemus

import corral

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_command_that_resists_is_killed_at_its_deadline(vm_image):
    from corral.backends.microvm import KILL_GRACE

    with corral.Sandbox({"isolation": "microvm", "image": vm_image,
                         "limits": {"timeout": "120s"}}) as sb:
        assert sb.exec(["true"]).verdict == "ok"
        t0 = time.monotonic()
        r = sb.exec(["sh", "-c", "trap '' TERM HUP; (setsid sh -c \"trap '' TERM HUP; "
                     "sleep 3001\" &); sleep 3002"], timeout=3)
        took = time.monotonic() - t0
        assert r.verdict == "timeout", r
        assert took < 3 + KILL_GRACE + 5, took
        left = sb.exec(["sh", "-c", "ps -eo args | grep -c '^sleep 300[12]' || true"])
        assert left.verdict == "ok" and left.stdout.strip() == "0", left


def test_a_hung_guest_is_killed_at_its_deadline_and_leaves_nothing(vm_image):
    from corral.backends.microvm import KILL_GRACE
    from corral.errors import SandboxSetupError

    with corral.Sandbox({"isolation": "microvm", "image": vm_image,
                         "limits": {"timeout": "120s"}}) as sb:
        assert sb.exec(["true"]).verdict == "ok"
        (qemu,) = qemus()
        cpu_dirs = [d for h, d in sb._live.cg._dirs.items() if h in ("cpu", "cgroup2")]
        assert cpu_dirs, sb._live.cg._dirs
        for d in cpu_dirs:               # the guest hangs: QEMU runs 1 ms a second
            if os.path.exists(os.path.join(d, "cpu.max")):
                with open(os.path.join(d, "cpu.max"), "w") as f:
                    f.write("1000 1000000")
            else:
                with open(os.path.join(d, "cpu.cfs_period_us"), "w") as f:
                    f.write("1000000")
                with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
                    f.write("1000")
        t0 = time.monotonic()
        r = sb.exec(["sleep", "30"], timeout=2)
        took = time.monotonic() - t0
        assert r.verdict == "timeout", r
        assert took < 2 + KILL_GRACE + 5, took
        deadline = time.monotonic() + 10
        while _alive(qemu) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(qemu), "QEMU outlived the deadline of its hung guest"
        with pytest.raises(SandboxSetupError, match="gone"):
            sb.exec(["true"])
        run_dir = sb._live.dir.path
    assert not os.path.exists(run_dir)
    assert qemus() == []
