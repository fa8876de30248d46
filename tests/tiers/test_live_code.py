"""run_code on a live sandbox: each context's interpreter is a stream command of the
sandbox (runtime/channels.CommandChannel over sb.commands.stream), so its limits are per
cell, not over its life; a killed interpreter ends its context clearly and restart works.
(test_run_code.py runs its whole suite on a live sandbox too: its "live" parameter.)"""

from __future__ import annotations

import pytest
from conftest import tier_unavailable

import corral
from corral.runtime.session import ContextError

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace: {tier_unavailable('namespace')}")

CAP = 64 * 1024


@pytest.fixture(scope="module")
def sb():
    with corral.Sandbox.create({"limits": {"output": "64K", "timeout": "60s",
                                           "cpu_time": "3s"}}, timeout=900) as box:
        yield box


def test_output_past_the_old_lifetime_cap_across_many_cells(sb):
    """limits.output bounds each cell's logs; the interpreter's stream goes on (over one
    exec it ended the context at 64 KiB in all)."""
    c = sb.create_context("python")
    sb.run_code("n = 0", context=c)
    for i in range(12):                  # 12 x 48 KiB: 9 times the cap, every cell whole
        ex = sb.run_code("n += 1\nprint('y' * (48 * 1024 - 1))", context=c)
        assert ex.error is None, ex.error
        assert sum(len(t) for t in ex.logs.stdout) == 48 * 1024 and not ex.stdout_truncated
    ex = sb.run_code("print('z' * 100_000)\nn", context=c)       # one cell past the cap
    assert ex.error is None and ex.stdout_truncated
    assert sum(len(t) for t in ex.logs.stdout) == CAP
    assert ex.text == "12" and ex.execution_count == 14
    sb.remove_context(c)


def test_cpu_time_is_per_cell_and_a_cell_past_it_is_interrupted(sb):
    c = sb.create_context("python")
    sb.run_code("import time\nkept = 'yes'\n"
                "def burn(s):\n    t = time.process_time()\n"
                "    while time.process_time() - t < s: pass", context=c)
    for _ in range(3):                   # 3 x 1.2 s: past 3 s over the interpreter's life
        ex = sb.run_code("burn(1.2)", context=c)
        assert ex.error is None, ex.error
    ex = sb.run_code("while True: pass", context=c)
    assert ex.error.name == "TimeoutError", ex.error
    assert "limits.cpu_time" in ex.error.value
    assert sb.run_code("kept", context=c).text == "'yes'"      # interrupted, not killed
    sb.remove_context(c)


def test_a_runner_killed_from_inside_ends_its_context_and_restart_gives_a_fresh_one(sb):
    c = sb.create_context("python")
    sb.run_code("import subprocess\nv = 1\n"
                "left = subprocess.Popen(['sleep', '1000'])", context=c)
    assert sb.commands.run("pgrep -f 'slee[p] 1000'").stdout.strip()
    ex = sb.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", context=c)
    assert ex.error.name == "ContextDied"
    assert "SIGKILL" in ex.error.value and "from inside" in ex.error.value
    assert "restart_context" in ex.error.value
    with pytest.raises(ContextError, match="is dead"):
        sb.run_code("v", context=c)
    sb.restart_context(c)
    assert sb.run_code("v", context=c).error.name == "NameError"      # fresh
    assert sb.run_code("21 * 2", context=c).text == "42"
    # the sleep the dead interpreter left went with its cgroup at the restart
    assert sb.commands.run("pgrep -f 'slee[p] 1000'").stdout.strip() == ""
    sb.remove_context(c)


def test_a_timeout_interrupts_with_a_real_sigint_and_keeps_variables(sb):
    c = sb.create_context("python")
    sb.run_code("import signal, time\nx = 'kept'\nhits = []\n"
                "signal.signal(signal.SIGINT, lambda s, f: hits.append(s) or "
                "(_ for _ in ()).throw(KeyboardInterrupt))", context=c)
    ex = sb.run_code("time.sleep(100)", context=c, timeout=1)
    assert ex.error.name == "TimeoutError", ex.error
    # the cell's own SIGINT handler ran: a signal, from the host, not an in-band frame
    assert sb.run_code("hits, x", context=c).text == "([2], 'kept')"
    sb.remove_context(c)


def test_output_between_cells_is_dropped_and_the_context_goes_on(sb):
    c = sb.create_context("python")
    sb.run_code("import threading, sys, time\nstop = False\n"
                "def spam():\n    while not stop:\n        print('x' * 1000)\n"
                "threading.Thread(target=spam, daemon=True).start()", context=c)
    sb.commands.run("sleep 1")           # between cells: megabytes, dropped
    ex = sb.run_code("stop = True\ntime.sleep(0.2)\n'done'", context=c)
    assert ex.text == "'done'" and ex.error is None
    assert sum(len(t) for t in ex.logs.stdout) <= CAP
    assert sb.run_code("1 + 1", context=c).logs.stdout == []
    sb.remove_context(c)


def test_contexts_are_named_in_commands_list_without_their_source(sb):
    c = sb.create_context("bash")
    infos = [i for i in sb.commands.list() if i.cmd[:1] == ("bash",)]
    assert infos and all(len(a) <= 80 for i in infos for a in i.cmd)
    assert sb.run_code("echo $((6 * 7))", context=c).logs.stdout == ["42\n"]
    sb.remove_context(c)
    assert not [i for i in sb.commands.list() if i.cmd[:1] == ("bash",) and not i.detached]


def test_contexts_end_with_the_sandbox():
    box = corral.Sandbox.create(timeout=120)
    c = box.create_context("python")
    assert box.run_code("1", context=c).text == "1"
    box.kill()
    with pytest.raises(corral.SandboxClosed):
        box.run_code("1")
