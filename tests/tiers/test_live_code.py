"""run_code on a live sandbox: each context's interpreter is a stream command of the
sandbox (runtime/channels.CommandChannel over sb.commands.stream), so its limits are per
cell, not over its life; a killed interpreter ends its context clearly and restart works.
(test_run_code.py runs its whole suite on a live sandbox too: its "live" parameter.)"""

from __future__ import annotations

import base64
import json
import os
import subprocess

import pytest
from conftest import ROOT, tier_unavailable

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
    """What a context's thread prints after its cell ended is nobody's: dropped, not
    handed to the next cell (nor kept in the host's memory until then)."""
    c = sb.create_context("python")
    sb.run_code("import threading, time\n"
                "def later():\n    time.sleep(0.3)\n"
                "    for _ in range(2000): print('between-marker' * 50)\n"
                "threading.Thread(target=later, daemon=True).start()", context=c)
    sb.commands.run("sleep 1.5")         # the thread prints ~1.4 MB meanwhile
    ex = sb.run_code("'next'", context=c)
    assert ex.text == "'next'" and ex.error is None
    assert not any("between-marker" in t for t in ex.logs.stdout)
    sb.remove_context(c)


def test_a_runner_that_speaks_between_cells_is_killed_at_once(sb):
    """Between cells only output is taken (and dropped): a forged frame of another kind
    closes the context when it comes, not at the next cell."""
    c = sb.create_context("python")
    frame = b'{"type":"display","id":1,"data":{"text/plain":"forged"},"main":true}'
    data = len(frame).to_bytes(4, "big") + frame
    sb.run_code("import os, threading, time\n"
                "def later():\n    time.sleep(0.5)\n"
                "    for fd in range(3, 64):\n"
                f"        try: os.write(fd, {data!r})\n"
                "        except OSError: pass\n"
                "threading.Thread(target=later).start()", context=c)
    sb.commands.run("sleep 1.5")
    with pytest.raises(ContextError, match="between cells"):
        sb.run_code("1", context=c)
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


# --- an IPython kernel where the image's python has ipykernel ------------------------------

BENCH_VENV = os.path.join(ROOT, "bench", ".venv")


def _has_ipykernel() -> bool:
    py = os.path.join(BENCH_VENV, "bin", "python3")
    return os.access(py, os.X_OK) and subprocess.run(
        [py, "-c", "import ipykernel, jupyter_client, zmq, matplotlib"], check=False,
        capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def kb():
    """A live sandbox whose python3 is bench/.venv's (ipykernel, jupyter_client,
    matplotlib from requirements/bench.lock), mounted read-only at its own path: an image
    with ipykernel, as the datascience image will be."""
    assert _has_ipykernel(), ("bench/.venv with ipykernel is not built: scripts/setup.sh "
                              "builds it from requirements/bench.lock")
    policy = {"limits": {"timeout": "120s", "cpu_time": "10m"},
              "filesystem": {"workspace": {"path": BENCH_VENV, "mode": "ro",
                                           "mount_at": "same"}},
              "env": {"set": {"PATH": f"{BENCH_VENV}/bin:/usr/bin:/bin"}}}
    with corral.Sandbox.create(policy, timeout=900) as box:
        yield box


def test_ipykernel_is_used_where_the_image_has_it_and_state_survives(kb):
    c = kb.create_context("python")
    assert c.engine == "ipykernel"
    assert kb.run_code("import json\nx = 41", context=c).error is None
    ex = kb.run_code("print('out')\nx + 1", context=c)
    assert ex.error is None and ex.text == "42" and ex.logs.stdout == ["out\n"]
    assert ex.execution_count == 2
    ex = kb.run_code("!echo from-a-shell\n_ * 2", context=c)        # IPython's own syntax
    assert ex.text == "84" and "from-a-shell" in "".join(ex.logs.stdout)
    ex = kb.run_code("{}['missing']", context=c)
    assert ex.error.name == "KeyError" and ex.error.value == "'missing'"
    assert "\x1b" not in ex.error.traceback and "{}['missing']" in ex.error.traceback
    r = kb.create_context("python", engine="runner")                 # the stdlib runner
    assert r.engine == "runner" and kb.run_code("2 + 2", context=r).text == "4"
    for ctx in (c, r):
        kb.remove_context(ctx)


def test_ipykernel_matplotlib_figure_is_a_valid_png_without_show(kb):
    from test_run_code import assert_valid_png

    c = kb.create_context("python")
    ex = kb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]);", context=c,
                     timeout=120)
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1
    assert_valid_png(base64.b64decode(pngs[0]))
    kb.remove_context(c)


def test_ipykernel_interrupt_keeps_state_and_a_killed_kernel_ends_the_context(kb):
    c = kb.create_context("python")
    kb.run_code("kept = 'yes'", context=c)
    ex = kb.run_code("import time\ntime.sleep(100)", context=c, timeout=1)
    assert ex.error.name == "TimeoutError", ex.error
    assert kb.run_code("kept", context=c).text == "'yes'"
    ex = kb.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", context=c)
    assert ex.error.name == "ContextDied" and "IPython kernel" in ex.error.value
    kb.restart_context(c)
    assert c.engine == "ipykernel"
    assert kb.run_code("kept", context=c).error.name == "NameError"
    kb.remove_context(c)


def test_ipykernel_sockets_are_unix_sockets_inside_and_nothing_listens_on_the_host(kb):
    c = kb.create_context("python")
    ex = kb.run_code("import os\nprint(os.environ['JUPYTER_RUNTIME_DIR'])", context=c)
    where = "".join(ex.logs.stdout).strip()
    info = json.loads(kb.files.read(where + "/kernel.json"))
    assert info["transport"] == "ipc" and info["ip"] == where + "/k"      # unix sockets
    assert kb.files.info(where).mode & 0o777 == 0o700
    uid = kb.ids[0]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):   # the host's network namespace
        with open(table) as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
        assert not [r for r in rows if int(r[7]) == uid], table
    kb.remove_context(c)


def test_engine_ipykernel_is_refused_where_the_image_has_none(sb):
    with pytest.raises(ContextError, match="ipykernel"):
        sb.create_context("python", engine="ipykernel")
    with pytest.raises(ContextError, match="unknown engine"):
        sb.create_context("python", engine="jupyter")


def test_no_kernel_on_the_process_tier_auto_falls_back_to_the_runner():
    """The process tier refuses the kernel's unix sockets: "auto" gives corral's runner,
    "ipykernel" is refused with the kernel's own error."""
    assert _has_ipykernel(), "bench/.venv with ipykernel: scripts/setup.sh builds it"
    policy = {"isolation": "process", "limits": {"timeout": "60s"},
              "filesystem": {"workspace": {"path": BENCH_VENV, "mode": "ro",
                                           "mount_at": "same"}},
              "env": {"set": {"PATH": f"{BENCH_VENV}/bin:/usr/bin:/bin"}}}
    why = tier_unavailable("process", policy)
    if why:
        pytest.skip(f"process: {why}")
    with corral.Sandbox(policy) as box:
        c = box.create_context("python")
        assert c.engine == "runner" and box.run_code("6 * 7", context=c).text == "42"
        with pytest.raises(ContextError, match="IPython kernel"):
            box.create_context("python", engine="ipykernel")
