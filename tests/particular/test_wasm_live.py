"""The wasm tier's live-sandbox API with real wasmtime (backends/wasm_live.py): Sandbox.create
with isolation = "wasm", sb.files on /scratch and the workspace, run_code's state,
commands in the Python argv forms, the refusals, nothing left behind.

The compiled module is kept in CORRAL_TEST_CACHE/wasm-state (as tests/particular/test_wasm.py
does)."""

import os
import time

import pytest

import corral
from corral.errors import UnsupportedRule
from corral.runtime.files import FilesError

WASM = {"isolation": "wasm", "limits": {"memory": "256M", "timeout": "20s"}}


#: corral's state directory for this module (tests/fixtures/wasmfix.py): the cached
#: compiled module survives
pytestmark = pytest.mark.usefixtures("wasm_state")


@pytest.fixture
def sb():
    s = corral.Sandbox.create(WASM, timeout=120)
    yield s
    s.kill()


def test_files_round_trip_between_host_and_guest(sb):
    sb.files.write("/scratch/in.txt", "from the host\n")
    r = sb.commands.run(["python3", "-c", "d = open('/scratch/in.txt').read(); "
                         "open('/scratch/out.txt', 'w').write(d.upper())"])
    assert (r.verdict, r.isolation) == ("ok", "wasm"), r
    assert sb.files.read("/scratch/out.txt") == "FROM THE HOST\n"
    names = {e.name for e in sb.files.list("/scratch")}
    assert {"in.txt", "out.txt"} <= names
    sb.files.write("/scratch/job.py", "import sys; print('job', sys.argv[1:])\n")
    assert sb.commands.run(["python3", "/scratch/job.py", "a"]).stdout == "job ['a']\n"


def test_the_workspace_is_reached_as_the_policy_grants(tmp_path):
    (tmp_path / "data.csv").write_text("1,2\n")
    pol = {**WASM, "filesystem": {"workspace": {"path": str(tmp_path), "mode": "rw"}}}
    with corral.Sandbox.create(pol, timeout=60) as s:
        assert s.files.read("/workspace/data.csv") == "1,2\n"
        r = s.commands.run(["python3", "-c", "open('/workspace/sum', 'w').write("
                            "str(sum(map(int, open('/workspace/data.csv').read().split(',')))))"])
        assert r.verdict == "ok", r
        assert s.files.read("/workspace/sum") == "3"
    assert (tmp_path / "sum").read_text() == "3"


def test_a_link_the_guest_plants_toward_etc_shadow_is_refused_by_files(sb):
    code = ("import os\n"
            "try:\n    os.symlink('/etc/shadow', '/scratch/abs')\n"
            "except OSError as e:\n    print('abs', e.errno)\n"
            "os.symlink('../../../../../../etc/shadow', '/scratch/rel')\n"
            "os.symlink('rel', '/scratch/hop')\n")
    r = sb.commands.run(["python3", "-c", code])
    assert r.verdict == "ok", r
    assert r.stdout.startswith("abs "), r   # wasmtime's WASI makes no absolute link
    shadow = _read("/etc/shadow")
    for name in ("rel", "hop"):
        with pytest.raises(FilesError):
            sb.files.read(f"/scratch/{name}")
        with pytest.raises(FilesError):
            sb.files.read(f"/scratch/{name}", format="bytes")
    # what only a wasmtime escape could leave: an absolute link, planted here directly
    os.symlink("/etc/shadow", os.path.join(sb._live.scratch, "home", "planted"))
    with pytest.raises(FilesError):
        sb.files.read("/scratch/planted")
    # a write replaces the link itself, never what it points at
    sb.files.write("/scratch/planted", "x")
    assert sb.files.info("/scratch/planted").type == "file"
    assert _read("/etc/shadow") == shadow


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_files_reach_only_what_the_guest_has(sb):
    # the host side's /tmp holds the status files; the rest is wasmtime's sandbox
    for path in ("/tmp/x", "/etc/passwd", "/usr/bin/python3", "/dev/shm/x"):
        with pytest.raises(FilesError):
            sb.files.read(path)
    with pytest.raises(FilesError):
        sb.files.write("/tmp/x", "no")


def test_run_code_keeps_state_across_calls(sb):
    assert sb.run_code("import math\nx = 40").error is None
    ex = sb.run_code("x + 2 + int(math.sqrt(0))")
    assert ex.error is None and ex.text == "42", ex
    ex = sb.run_code("print('side', x)\nopen('/scratch/cell', 'w').write(str(x))")
    assert ex.logs.stdout == ["side 40\n"]
    assert sb.files.read("/scratch/cell") == "40"
    assert sb.commands.run(["python3", "-c", "print(open('/scratch/cell').read())"]
                           ).stdout == "40\n"


def test_commands_are_the_python_argv_forms(sb):
    assert sb.commands.run("python3 -c 'print(6 * 7)'").stdout == "42\n"
    r = sb.commands.run(["python3", "-"], stdin=b"import sys; print(sys.argv)\n")
    assert r.stdout == "['-']\n", r
    r = sb.commands.run(["python3", "-c", "import os; print(os.environ['K'])"],
                        env={"K": "v"})
    assert r.stdout == "v\n", r
    for line in ("echo hi", "ls /", "python3 -c 'print(1)' > /scratch/x",
                 "python3 -c 'print(1)'; id", "python3 -c \"$(id)\""):
        with pytest.raises(UnsupportedRule, match="the wasm tier runs Python code only"):
            sb.commands.run(line)
    with pytest.raises(UnsupportedRule, match="runs Python code only"):
        sb.commands.run(["/bin/sh", "-c", "id"])
    with pytest.raises(UnsupportedRule, match="cwd="):
        sb.commands.run(["python3", "-c", "1"], cwd="/workspace")


def test_get_info_says_what_the_tier_offers_and_pty_is_refused(sb):
    info = sb.get_info()
    assert info.isolation == "wasm" and info.state == "running"
    assert info.offers["shell"] is False and info.offers["pty"] is False
    assert info.offers["run_code"].startswith("stateful")
    with pytest.raises(UnsupportedRule, match='isolation = "namespace"'):
        sb.pty.create(80, 24, cmd="python3")
    # the namespace tier's say the opposite
    with corral.Sandbox.create({"limits": {"memory": "256M"}}, timeout=60) as ns:
        assert ns.get_info().offers["shell"] is True


def test_timeouts_and_kills_leave_nothing_behind(sb):
    r = sb.commands.run(["python3", "-c", "while True: pass"], timeout=1.5)
    assert r.verdict == "timeout", r
    h = sb.commands.run(["python3", "-c", "import time; time.sleep(600)"], background=True)
    assert h.running
    pid = h.host_pid
    h.kill()
    assert h.wait(30).verdict == "killed"
    assert not os.path.exists(f"/proc/{pid}")
    assert sb.commands.list() == []
    r = sb.commands.run(["python3", "-c", "b = bytearray(1 << 30)"])
    assert r.verdict == "oom" and any(e.get("limit") == "memory" for e in r.events), r
    h = sb.commands.run(["python3", "-c", "while True: pass"], background=True)
    run_dir, pid = sb._live.dir.path, h.host_pid
    assert os.path.isdir(run_dir)
    files = sb.files
    files.write("/scratch/left", "x")
    sb.kill()
    with pytest.raises(FilesError, match="closed"):   # no fd of it keeps its scratch alive
        files.read("/scratch/left")
    assert h.wait(30).verdict == "killed"
    assert not os.path.exists(f"/proc/{pid}") and not os.path.exists(run_dir)
    assert sb.get_info().ended_by == "killed"


def test_the_per_exec_sandbox_has_files_on_wasm_too():
    with corral.Sandbox(WASM) as s:
        s.files.write("/scratch/a.py", "print('per exec')\n")
        assert s.exec(["python3", "/scratch/a.py"]).stdout == "per exec\n"
        s.exec(["python3", "-c", "open('/scratch/b', 'w').write('kept')"])
        assert s.files.read("/scratch/b") == "kept"
        with pytest.raises(FilesError):
            s.files.read("/tmp/.corral-wasm-status")


def test_a_run_code_cell_past_its_timeout_is_killed_with_nothing_left(sb):
    sb._code_session().interrupt_grace = 0.5   # WASI has no signals: the grace, then a kill
    assert sb.run_code("x = 1").error is None
    ex = sb.run_code("while True: pass", timeout=1)
    assert ex.error is not None and ex.error.name == "ContextDied", ex
    for _ in range(200):   # the guest's wasmtime process goes once it sees stdin closed
        if not sb.commands.list():
            break
        time.sleep(0.05)
    assert sb.commands.list() == []
    ex = sb.run_code("x")                      # a fresh interpreter, state lost
    assert ex.error is not None and ex.error.name == "NameError", ex
