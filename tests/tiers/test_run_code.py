"""run_code and code contexts (runtime.session, guest/runner.py, guest/runner.js) in real
sandboxes: state across cells, results, errors, streaming, interrupts, a hostile runner."""

from __future__ import annotations

import base64
import os
import shutil
import struct
import subprocess
import sys
import threading
import zlib

import pytest
from codechan import local_start
from conftest import ROOT, procs_of_uid, tier_unavailable

import corral
from corral.runtime.session import CodeSession, ContextError

#: "TIER-live": a live sandbox (Sandbox.create), whose contexts are stream commands
#: (runtime/channels.CommandChannel) rather than one long exec each
TIERS = ("namespace", "gvisor", "namespace-live", "gvisor-live")
POLICY = {"limits": {"cpu_time": "10m", "timeout": "60s"}}


def _has(tier: str, argv: list[str]) -> bool:
    with corral.Sandbox({"isolation": tier}) as sb:
        return sb.exec(argv).exit_code == 0


def open_box(kind: str, policy: dict):
    """A sandbox of `kind` (a tier, or TIER-live: Sandbox.create, whose contexts are stream
    commands of the running sandbox), or a skip naming why it cannot run here."""
    tier, _, kept = kind.partition("-")
    why = tier_unavailable(tier, {**policy, "isolation": tier})
    if why:
        pytest.skip(f"{kind}: {why}")
    if kept:
        return corral.Sandbox.create({**policy, "isolation": tier}, timeout=900)
    return corral.Sandbox({**policy, "isolation": tier})


@pytest.fixture(scope="module", params=TIERS)
def sb(request):
    with open_box(request.param, POLICY) as box:
        yield box


@pytest.fixture
def ctx(sb):
    c = sb.create_context("python")
    yield c
    sb.remove_context(c)


def png_bytes(w: int = 2, h: int = 2) -> bytes:
    """A real w x h RGB PNG, built by hand."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\0" + bytes([255, 0, 0]) * w for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def assert_valid_png(data: bytes) -> None:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, kinds = 8, []
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        (crc,) = struct.unpack(">I", data[at + 8 + n:at + 12 + n])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, kind
        kinds.append(kind)
        at += 12 + n
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds


# --- python ------------------------------------------------------------------------------

def test_variables_imports_and_cwd_survive_between_cells(sb, ctx):
    assert sb.run_code("import json\nx = 41\nimport os; os.chdir('/tmp')", context=ctx).error is None
    ex = sb.run_code("x + 1, json.dumps([1]), os.getcwd()", context=ctx)
    assert ex.error is None
    assert ex.text == "(42, '[1]', '/tmp')"
    assert ex.execution_count == 2


def test_the_last_expression_comes_back_as_text_and_print_as_stdout(sb, ctx):
    ex = sb.run_code("print('hello')\n21 * 2", context=ctx)
    assert ex.logs.stdout == ["hello\n"] and ex.logs.stderr == []
    assert [r.is_main_result for r in ex.results] == [True]
    assert ex.results[0].text == "42" and ex.text == "42"
    assert sb.run_code("x = 1", context=ctx).results == []          # a statement: no value
    assert sb.run_code("1 + 1;", context=ctx).results == []         # ; hides it, as Jupyter
    assert sb.run_code("None", context=ctx).results == []


def test_an_exception_gives_name_value_and_traceback(sb, ctx):
    ex = sb.run_code("def f():\n    return 1 / 0\nf()", context=ctx)
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    tb = ex.error.traceback
    assert tb.startswith("Traceback (most recent call last):")
    assert "return 1 / 0" in tb and "in f" in tb            # the cell's source lines
    assert "corral-runner" not in tb                         # none of the runner's frames
    assert ex.error.traceback_lines[-1] == "ZeroDivisionError: division by zero\n"
    syn = sb.run_code("def (:", context=ctx)
    assert syn.error.name == "SyntaxError" and "Traceback" not in syn.error.traceback
    assert sb.run_code("1", context=ctx).text == "1"                # the context lives on


def test_stdout_and_stderr_stream_through_callbacks_before_the_cell_ends(sb, ctx):
    # The cell prints, then waits for a file that only the stdout callback creates (by an
    # exec in the same sandbox): it can end only if the callback ran while it was running.
    seen = []

    def on_stdout(text):
        seen.append(("stdout", text))
        if "first" in text:
            threading.Thread(target=sb.exec, args=(["touch", "/scratch/go"],)).start()

    code = ("import os, sys, time\nprint('first')\nsys.stderr.write('warn\\n')\n"
            "while not os.path.exists('/scratch/go'):\n    time.sleep(0.01)\n"
            "print('second')\n'done'")
    ex = sb.run_code(code, context=ctx, timeout=120, on_stdout=on_stdout,
                     on_stderr=lambda t: seen.append(("stderr", t)),
                     on_result=lambda r: seen.append(("result", r.text)))
    assert ex.error is None, ex.error
    assert seen.index(("stdout", "first\n")) < seen.index(("result", "'done'"))
    assert ("stderr", "warn\n") in seen
    assert "".join(ex.logs.stdout) == "first\nsecond\n"
    sb.exec(["rm", "/scratch/go"])


def test_fd_level_and_subprocess_output_is_the_cells_output(sb, ctx):
    ex = sb.run_code("import os, subprocess\nos.write(1, b'raw\\xff\\n')\n"
                     "subprocess.run(['sh', '-c', 'echo child; echo oops >&2'])\n"
                     "os.write(2, b'e2\\n')\nNone", context=ctx)
    assert ex.error is None
    assert "".join(ex.logs.stdout) == "raw\ufffd\nchild\n"
    assert "".join(ex.logs.stderr) == "oops\ne2\n"


def test_a_timeout_interrupts_the_cell_and_the_context_survives(sb, ctx):
    sb.run_code("x = 'kept'", context=ctx)
    ex = sb.run_code("while True: pass", context=ctx, timeout=1)
    assert ex.error.name == "TimeoutError" and "timeout of 1s" in ex.error.value
    assert "while True: pass" in ex.error.traceback
    ex = sb.run_code("import time\ntime.sleep(1000)", context=ctx, timeout=1)  # in a syscall
    assert ex.error.name == "TimeoutError"
    assert sb.run_code("x", context=ctx).text == "'kept'"


def test_a_cell_that_swallows_the_interrupt_is_killed_and_the_context_dead(sb):
    c = sb.create_context()
    sb._code.interrupt_grace = 1.0
    try:
        ex = sb.run_code("while True:\n    try:\n        while True: pass\n"
                         "    except BaseException: pass", context=c, timeout=1)
    finally:
        sb._code.interrupt_grace = 5.0
    assert ex.error.name == "ContextDied" and "did not stop" in ex.error.value
    with pytest.raises(ContextError, match="is dead"):
        sb.run_code("1", context=c)
    sb.restart_context(c)                                  # a fresh interpreter, same id
    assert sb.run_code("2", context=c).text == "2"
    sb.remove_context(c)


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


HOSTILE = {
    # bytes written to every fd the cell can find: the frame stream is one of them
    "garbage": (b"\xff" * 100000, "over the"),
    "huge length": (struct.pack(">I", 0x7FFFFFF0), "claims 2147483632 bytes"),
    "not json": (_frame(b"hello"), "not UTF-8 JSON"),
    "unknown type": (_frame(b'{"type":"bogus"}'), "unknown message type"),
    "extra field": (_frame(b'{"type":"stdout","text":"x","pid":1}'), "has the fields"),
    "wrong cell": (_frame(b'{"type":"end","id":99999,"count":1}'), "for cell 99999"),
}


def test_a_lone_surrogate_in_an_error_is_shown_not_fatal(sb):
    # found by tests/fuzz/test_fuzz_frames.py: the runner framed it as bytes the host's
    # strict UTF-8 reader refused, and the context died with "broke the protocol"
    c = sb.create_context()
    sb.run_code("kept = 7", context=c)
    ex = sb.run_code("raise ValueError('bad ' + chr(0xd800))", context=c)
    assert ex.error.name == "ValueError" and ex.error.value == "bad ?"
    assert sb.run_code("kept", context=c).text == "7"


@pytest.mark.parametrize("what", list(HOSTILE))
def test_a_hostile_runner_closes_its_context_with_a_clear_error(sb, what):
    data, message = HOSTILE[what]
    c = sb.create_context()
    sb.run_code("secret = 1", context=c)
    code = (f"import os\nfor fd in range(3, 64):\n    try: os.write(fd, {data!r})\n"
            f"    except OSError: pass\nimport time; time.sleep(60)")
    ex = sb.run_code(code, context=c, timeout=30)
    assert ex.error.name == "ContextDied"
    assert "broke the protocol" in ex.error.value and message in ex.error.value
    with pytest.raises(ContextError, match="is dead"):
        sb.run_code("secret", context=c)
    other = sb.run_code("'fine'")                      # the sandbox and session go on
    assert other.text == "'fine'"
    sb.remove_context(c)


@pytest.mark.parametrize("tier", ["namespace", "gvisor"])
def test_closing_a_one_shot_sandbox_ends_an_interpreter_that_outlived_its_context(tier):
    """A runner that no longer reads the stdin whose close would end it (here: it stopped
    itself, SIGSTOP; sandboxed code may take the runner over in other ways) outlives its
    context's death: its exec, in the channel's thread, goes on. Closing the sandbox ends
    it, and with it corral's hold on this process's child-subreaper flag (kept, orphans
    from anywhere below this process would come here and never be reaped: a live
    sandbox's init waits in the kernel for such zombies of its commands)."""
    from corral.linux import _sys

    why = tier_unavailable(tier, {**POLICY, "isolation": tier})
    if why:
        pytest.skip(f"{tier}: {why}")
    before = _sys._subreaper_users
    sb = corral.Sandbox({**POLICY, "isolation": tier})
    try:
        c = sb.create_context()
        sb._code.interrupt_grace = 1.0
        ex = sb.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)",
                         context=c, timeout=1)
        assert ex.error.name == "ContextDied" and "did not stop" in ex.error.value
        channel = sb._code._get(c).channel
        uid = sb._live.uid
        assert channel.thread.is_alive() and procs_of_uid(uid), "the runner outlived its context"
        assert _sys._subreaper_users == before + 1
    finally:
        sb.close()
    assert procs_of_uid(uid) == []
    channel.thread.join(30)
    assert not channel.thread.is_alive()
    assert _sys._subreaper_users == before


def test_a_runner_that_exits_closes_its_context(sb):
    c = sb.create_context()
    ex = sb.run_code("import os; os._exit(3)", context=c)
    assert ex.error.name == "ContextDied" and "exited with status 3" in ex.error.value
    assert c in sb.list_contexts()
    sb.remove_context(c)
    assert c not in sb.list_contexts()
    with pytest.raises(ContextError, match="no code context"):
        sb.run_code("1", context=c)


def test_rich_display_html_png_and_display_calls(sb, ctx):
    png = png_bytes()
    code = (f"class H:\n    def _repr_html_(self): return '<b>hi</b>'\n"
            f"    def __repr__(self): return 'H()'\n"
            f"class P:\n    def _repr_png_(self): return {png!r}\n"
            f"display(P())\nprint('between')\nH()")
    ex = sb.run_code(code, context=ctx)
    assert ex.error is None
    first, main = ex.results
    assert not first.is_main_result and main.is_main_result
    assert base64.b64decode(first.png) == png and "png" in first.formats()
    assert_valid_png(base64.b64decode(first.png))
    assert main.html == "<b>hi</b>" and main.text == "H()" and main.formats() == ["html"]
    ex = sb.run_code("class J:\n    def _repr_json_(self): return {'a': [1, 2]}\n"
                     "    def _repr_markdown_(self): return '# t'\nJ()", context=ctx)
    assert ex.results[0].json == {"a": [1, 2]} and ex.results[0].markdown == "# t"


BENCH_SITE = os.path.join(ROOT,
                          "bench", ".venv", "lib", "python3.11", "site-packages")


def _matplotlib_in_sandbox() -> tuple[dict, str] | None:
    """(policy, path setup) for a sandbox python that can import matplotlib: the image's
    own, else bench/.venv's site-packages bound read-only as the workspace."""
    if subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"],
                      check=False, capture_output=True).returncode == 0:
        return {}, ""
    if os.path.isdir(os.path.join(BENCH_SITE, "matplotlib")) and sys.version_info[:2] == (3, 11):
        return ({"filesystem": {"workspace": {"path": BENCH_SITE, "mode": "ro"}}},
                "import sys; sys.path.append('/workspace')\n")
    return None


@pytest.mark.parametrize("tier", TIERS)
def test_a_matplotlib_plot_comes_back_as_png_once(tier):
    found = _matplotlib_in_sandbox()
    assert found, ("matplotlib is neither installed for /usr/bin/python3 nor in bench/.venv: "
                   "scripts/setup.sh builds it")
    extra, setup = found
    with open_box(tier, {**POLICY, **extra}) as sb:
        ex = sb.run_code(setup + "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\n"
                         "plt.show()", timeout=120)
        assert ex.error is None, ex.error
        assert [r.formats() for r in ex.results] == [["png"]]    # show() sent it, once
        assert_valid_png(base64.b64decode(ex.results[0].png))
        ex = sb.run_code("fig, ax = plt.subplots(); ax.bar([1], [2]); None")   # no show()
        assert [r.formats() for r in ex.results] == [["png"]]
        assert_valid_png(base64.b64decode(ex.results[0].png))
        ex = sb.run_code("fig = plt.figure(); plt.plot([3, 1]); fig")   # the value: once
        assert [(r.formats(), r.is_main_result) for r in ex.results] == [(["png"], True)]
        assert sb.run_code("len(plt.get_fignums())").text == "0"         # all closed


def test_logs_past_the_cap_are_dropped_and_flagged_but_callbacks_see_all():
    with corral.Sandbox({"limits": {"output": "4M"}, "isolation": "namespace"}) as sb:
        sb.run_code("1")
        sb._code.max_log = 64 * 1024
        seen = []
        ex = sb.run_code("for i in range(20000): print('x' * 50)", on_stdout=seen.append)
        assert ex.error is None and ex.stdout_truncated
        assert sum(len(t) for t in ex.logs.stdout) == 64 * 1024
        assert sum(len(t) for t in seen) == 20000 * 51


def test_a_context_past_the_exec_output_cap_ends_with_a_clear_error():
    # the current transport (one Sandbox.exec) streams only limits.output bytes over the
    # context's life: past it the context must end clearly, not hang
    with corral.Sandbox({"limits": {"output": "64K"}, "isolation": "namespace"}) as sb:
        ex = sb.run_code("for i in range(20000): print('x' * 50)", timeout=120)
        assert ex.error.name == "ContextDied" and "limits.output" in ex.error.value
        assert sb.run_code("'again'").text == "'again'"      # the default context is remade


# --- contexts --------------------------------------------------------------------------

def test_contexts_are_separate_and_restart_clears_state(sb):
    a, b = sb.create_context(), sb.create_context(cwd="/tmp")
    assert {a, b} <= set(sb.list_contexts())
    sb.run_code("v = 'a'", context=a)
    assert sb.run_code("v", context=b).error.name == "NameError"
    assert sb.run_code("import os; os.getcwd()", context=b).text == "'/tmp'"
    sb.restart_context(a)
    assert sb.run_code("v", context=a).error.name == "NameError"
    assert sb.run_code("1", context=a).execution_count == 2
    for c in (a, b):
        sb.remove_context(c)
    with pytest.raises(ContextError, match="unknown language"):
        sb.create_context("cobol")


def test_the_default_context_is_made_lazily_and_kept(sb):
    sb.run_code("d = 5")
    assert sb.run_code("d").text == "5"
    assert sb.run_code("d", language="python").text == "5"


# --- bash ----------------------------------------------------------------------------

def test_bash_context_keeps_cwd_and_env(sb):
    c = sb.create_context("bash")
    ex = sb.run_code("cd /tmp\nexport GREETING=hi\nQUIET=1\necho \"$PWD\"; echo err >&2",
                     context=c)
    assert ex.error is None and ex.exit_code == 0
    assert ex.logs.stdout == ["/tmp\n"] and ex.logs.stderr == ["err\n"]
    ex = sb.run_code("echo \"$PWD $GREETING $QUIET\"; cat; false", context=c)
    assert "".join(ex.logs.stdout) == "/tmp hi 1\n"           # cat got /dev/null, not cells
    assert ex.exit_code == 1 and ex.error.name == "ExitStatus"
    assert ex.execution_count == 2
    sb.remove_context(c)


def test_bash_context_in_a_directory_whose_name_is_not_utf8(sb):
    """A name listed surrogate-escaped (files.list gives "\\udcff" for the byte 0xff) works
    as a bash context's cwd and in a cell: each such character is its byte again; a lone
    surrogate that stands for no byte is refused in one line."""
    # made by the sandbox's own bash (runsc's OCI spec, JSON, has no room for such argv)
    assert sb.run_code("mkdir -p $'/tmp/d\\xff\\xfe'", language="bash").exit_code == 0
    (name,) = [e.name for e in sb.files.list("/tmp") if e.name.startswith("d")]
    assert name == "d\udcff\udcfe"
    c = sb.create_context("bash", cwd="/tmp/" + name)
    ex = sb.run_code("pwd | od -An -c | tr -s ' '; echo /tmp/" + name, context=c)
    assert ex.error is None, ex.error
    pwd, echo = "".join(ex.logs.stdout).splitlines()
    assert pwd.split() == ["/", "t", "m", "p", "/", "d", "377", "376", "\\n"]
    assert echo == "/tmp/d\ufffd\ufffd"        # the cell's output: UTF-8, bytes replaced
    with pytest.raises(ValueError, match="surrogate"):
        sb.run_code("echo \ud800", context=c)
    sb.remove_context(c)


def test_bash_cell_past_its_timeout(sb):
    """On a live sandbox the cell is interrupted (SIGINT to the shell's process group, as
    ^C at a terminal) and the shell keeps its state; a one-shot Sandbox's context cannot
    be signalled and is killed."""
    c = sb.create_context("bash")
    sb.run_code("kept=yes; cd /tmp; (sleep 300 > /dev/null 2>&1 &)", context=c)
    ex = sb.run_code("echo before; sleep 1000; echo after", context=c, timeout=1)
    if not hasattr(sb, "commands"):
        assert ex.error.name == "TimeoutError" and "context was killed" in ex.error.value
        with pytest.raises(ContextError, match="is dead"):
            sb.run_code("true", context=c)
        sb.remove_context(c)
        return
    assert ex.error.name == "TimeoutError" and "interrupted" in ex.error.value, ex.error
    assert ex.exit_code == 130 and ex.logs.stdout == ["before\n"], ex
    # a loop of builtins (no child to signal) is interrupted too
    ex = sb.run_code("n=0; while :; do n=$((n+1)); done", context=c, timeout=1)
    assert ex.error.name == "TimeoutError" and ex.exit_code == 130, ex
    ex = sb.run_code('echo "$kept $PWD $((n > 0))"; echo "hi!"; jobs; '
                     "pgrep -x sleep > /dev/null && echo bg", context=c)
    assert ex.error is None and "".join(ex.logs.stdout) == "yes /tmp 1\nhi!\nbg\n", ex
    assert ex.execution_count == 4
    sb.remove_context(c)


def test_bash_forged_end_marker_without_the_nonce_is_just_output(sb):
    c = sb.create_context("bash")
    ex = sb.run_code("printf '\\ncorral-end-0000 0\\n'; echo after", context=c)
    assert ex.exit_code == 0 and "after" in "".join(ex.logs.stdout)
    sb.remove_context(c)


# --- javascript ---------------------------------------------------------------------------

@pytest.fixture
def js(sb):
    if not _has(sb.isolation, ["node", "-e", "0"]):
        pytest.skip("node is not in the sandbox")
    c = sb.create_context("javascript")
    yield c
    sb.remove_context(c)


def test_javascript_context_keeps_variables(sb, js):
    ex = sb.run_code("var a = 20; let b = 1; function f(x) { return x * 2 }\n"
                     "console.log('hi', {k: 1}); f(a) + b", context=js)
    assert ex.error is None, ex.error
    assert ex.text == "41" and ex.logs.stdout == ["hi { k: 1 }\n"]
    assert sb.run_code("a + b", context=js).text == "21"
    assert sb.run_code("Promise.resolve(a)", context=js).text == "20"
    err = sb.run_code("null.x", context=js).error
    assert err.name == "TypeError" and "<cell-" in err.traceback
    ex = sb.run_code("while (true) {}", context=js, timeout=1)
    assert ex.error.name == "TimeoutError"
    assert sb.run_code("a", context=js).text == "20"


# --- the runner itself, on interpreters the sandboxes here do not have -----------------

PY38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"
BENCH_PY = os.path.join(ROOT,
                        "bench", ".venv", "bin", "python")


@pytest.mark.skipif(not os.access(PY38, os.X_OK), reason="no python 3.8 at " + PY38)
def test_runner_works_on_python_3_8_and_a_real_sigint_interrupts():
    start = local_start(PY38)
    s = CodeSession(None, start=start, max_log=1 << 20, default_timeout=30)
    try:
        c = s.create_context()
        assert s.run_code("import sys; x = sys.version_info[:2]; x", context=c).text == "(3, 8)"
        ex = s.run_code("while True: pass", context=c, timeout=1)
        assert ex.error.name == "TimeoutError" and start.made[0].signals == 1
        assert s.run_code("x", context=c).text == "(3, 8)"
        err = s.run_code("1/0", context=c).error
        assert err.name == "ZeroDivisionError" and "1/0" in err.traceback
    finally:
        s.close()


def _has_matplotlib(py: str) -> bool:
    return os.access(py, os.X_OK) and subprocess.run(
        [py, "-c", "import matplotlib"], check=False, capture_output=True).returncode == 0


def test_runner_sends_matplotlib_figures_as_png():
    assert _has_matplotlib(BENCH_PY), "bench/.venv (matplotlib): scripts/setup.sh builds it"
    s = CodeSession(None, start=local_start(BENCH_PY), max_log=1 << 20, default_timeout=60)
    try:
        ex = s.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        assert ex.error is None, ex.error
        pngs = [r.png for r in ex.results if r.png]
        assert len(pngs) == 1                       # show() sent it; the cell's end did not
        assert_valid_png(base64.b64decode(pngs[0]))
        ex = s.run_code("fig, ax = plt.subplots(); ax.bar([1], [2]); None")   # no show()
        assert [bool(r.png) for r in ex.results] == [True]
        assert_valid_png(base64.b64decode(ex.results[0].png))
        assert s.run_code("len(plt.get_fignums())").text == "0"              # closed
    finally:
        s.close()


def test_node_is_on_this_host():
    # the javascript tests above skip without node in the sandbox; here it should be there
    if shutil.which("node") is None:
        pytest.skip("no node on this host")
    assert _has("namespace", ["node", "-e", "0"])
