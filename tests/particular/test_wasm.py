"""The wasm tier with real wasmtime: CPython for WASI in wasmtime, wasmtime's own process
in a namespace-tier sandbox (backends/wasm.py).

The module's first compile costs ~7 s of CPU: the compiled module is kept across test runs
in CORRAL_TEST_CACHE (like tests/fixtures/imagefix.py keeps its image), as corral's own
state directory for these tests."""

import json
import os
import shutil

import pytest

import corral
from corral.errors import SandboxSetupError, UnsupportedRule

MB = 1 << 20


#: corral's state directory for this module (tests/fixtures/wasmfix.py): the cached
#: compiled module survives
pytestmark = pytest.mark.usefixtures("wasm_state")


def run(code, extra=None, **kw):
    return argv(["python3", "-c", code], extra, **kw)


def argv(args, extra=None, **kw):
    r = corral.run(args, {**(extra or {}), "isolation": "wasm"}, **kw)
    assert r.isolation == "wasm"
    return r


def limits(**kw):
    return {"limits": kw}


def kinds(r, limit):
    return [e for e in r.events if e.get("kind") == "limit" and e.get("limit") == limit]


# -- running Python: the argv forms, output and exit codes ----------------------------------

def test_print_and_exit_codes():
    r = run("print('hello from wasm')")
    assert (r.verdict, r.exit_code, r.stdout) == ("ok", 0, "hello from wasm\n")
    r = run("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)")
    assert (r.verdict, r.exit_code, r.stdout, r.stderr) == ("error", 3, "out\n", "err\n")
    r = run("raise ValueError('boom')")
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr


def test_it_is_wasi_python_not_the_hosts():
    r = run("import sys, os; print(sys.platform, sys.version.split()[0], os.name)")
    assert r.stdout.split() == ["wasi", "3.12.0", "posix"], r


def test_script_and_stdin_forms(tmp_path):
    (tmp_path / "s.py").write_text("import sys; print('script', sys.argv[1:])\n")
    ws = {"filesystem": {"workspace": {"path": str(tmp_path), "mode": "ro"}}}
    r = argv(["python3", "/workspace/s.py", "a", "b"], ws)
    assert r.stdout == "script ['a', 'b']\n", r
    r = argv(["python3", "-", "x"], stdin=b"import sys; print('stdin', sys.argv[1:])\n")
    assert r.stdout == "stdin ['x']\n", r
    r = argv(["/usr/bin/python3"], stdin=b"print(6 * 7)\n")
    assert r.stdout == "42\n", r
    r = argv(["python3", "-m", "json.tool"], stdin=b'{"a":1}')
    assert r.stdout == '{\n    "a": 1\n}\n', r


def test_other_commands_are_refused_in_one_line():
    for cmd in (["/bin/sh", "-c", "echo hi"], ["bash"], ["node", "-e", "1"],
                ["python3", "-X", "dev", "-c", "1"], ["python3", "-c"]):
        with pytest.raises(UnsupportedRule) as e:
            argv(cmd)
        assert "\n" not in str(e.value)
    with pytest.raises(UnsupportedRule, match="runs Python code only; use namespace for shell"):
        argv(["/bin/sh", "-c", "echo hi"])


def test_env_is_only_the_policys():
    os.environ["CORRAL_WASM_LEAK"] = "leaked"
    try:
        r = run("import os, json; print(json.dumps(dict(os.environ)))",
                {"env": {"set": {"GREETING": "hi"}}})
    finally:
        del os.environ["CORRAL_WASM_LEAK"]
    env = json.loads(r.stdout)
    assert env["GREETING"] == "hi" and "CORRAL_WASM_LEAK" not in env, env


# -- limits: CPU, wall clock, memory, output, scratch --------------------------------------

def test_an_infinite_loop_stops_at_the_cpu_limit():
    r = run("while True: pass", limits(cpu_time="1s", timeout="60s"))
    assert r.verdict == "timeout", r
    assert kinds(r, "cpu_time") and not kinds(r, "timeout"), r.events
    # stopped by the epoch deadline inside wasmtime (the host process then exited by
    # itself), not by the namespace sandbox's backstop, which kills it (a signal)
    assert r.signal is None and "trapped" not in r.stderr, r


def test_a_sleeping_guest_stops_at_the_wall_clock():
    r = run("import time; time.sleep(100)", limits(timeout="1s"))
    assert r.verdict == "timeout", r
    assert kinds(r, "timeout") and r.signal is None, r


def test_a_1gib_allocation_stops_at_the_memory_limit():
    r = run("b = bytearray(1 << 30); print('allocated')", limits(memory="256M"))
    assert r.verdict == "oom", r
    assert "allocated" not in r.stdout
    (ev,) = kinds(r, "memory")
    assert str(256 * MB) in ev["message"], ev
    # a limit below what the interpreter itself needs: oom before any code runs
    r = run("print('started')", limits(memory="8M"))
    assert r.verdict == "oom" and not r.stdout and kinds(r, "memory"), r
    assert "needs more memory than 8388608 bytes to start" in r.stderr, r
    # under a limit that holds it, the same allocation succeeds (the limit is what stopped it)
    r = run("b = bytearray(1 << 30); print('allocated')", limits(memory="2G"))
    assert (r.verdict, r.stdout) == ("ok", "allocated\n"), r


def test_the_oom_verdict_comes_from_the_host_not_the_guests_stderr():
    # a guest that only says MemoryError, with no growth refused: not oom
    r = run("import sys; sys.stderr.write('MemoryError\\n'); sys.exit(1)", limits(memory="256M"))
    assert (r.verdict, r.exit_code) == ("error", 1) and not kinds(r, "memory"), r
    # a refusal the guest caught and got over: its own exit stands
    r = run("try:\n    b = bytearray(1 << 30)\nexcept MemoryError:\n    print('caught')",
            limits(memory="256M"))
    assert (r.verdict, r.stdout) == ("ok", "caught\n"), r
    # a refusal, then an exit of the guest's own that hides the MemoryError: still oom
    r = run("import os\ntry:\n    b = bytearray(1 << 30)\nexcept MemoryError:\n    os._exit(3)",
            limits(memory="256M"))
    assert (r.verdict, r.exit_code) == ("oom", 3) and kinds(r, "memory"), r


def test_output_is_capped():
    r = run("import sys; sys.stdout.write('x' * 100000)", limits(output="1K"))
    assert r.stdout_truncated and len(r.stdout) <= 1024
    assert kinds(r, "output")


def test_the_scratch_cap_gives_enospc_and_a_limit_event():
    code = ("import errno\n"
            "try:\n"
            "    with open('/scratch/big', 'wb') as f:\n"
            "        for _ in range(64): f.write(b'x' * (1 << 20)); f.flush()\n"
            "except OSError as e:\n"
            "    print('ERR', errno.errorcode.get(e.errno))\n")
    r = run(code, limits(scratch="4M"))
    assert "ERR ENOSPC" in r.stdout, r
    assert kinds(r, "scratch"), r.events


# -- capabilities: only the preopens -------------------------------------------------------

PROBE_OPEN = ("import sys\n"
              "for p in sys.argv[1:]:\n"
              "    try:\n"
              "        print(p, 'READ', open(p).read()[:40])\n"
              "    except OSError as e:\n"
              "        print(p, 'DENIED', type(e).__name__)\n")


def test_host_files_are_unreachable(tmp_path):
    home = os.path.expanduser("~")
    canary = tmp_path / "canary.txt"
    canary.write_text("CANARY-WASM-TOKEN")
    r = argv(["python3", "-c", PROBE_OPEN, "/etc/passwd", os.path.join(home, ".bashrc"),
              str(canary), "/proc/self/environ", "../../etc/passwd"])
    assert "CANARY-WASM-TOKEN" not in r.stdout and "root:" not in r.stdout, r
    lines = r.stdout.splitlines()
    assert len(lines) == 5 and all(" DENIED " in line for line in lines), r
    r = run("import os; print(os.listdir('/'))")
    assert r.verdict == "error" and "FileNotFoundError" in r.stderr, r


def test_writes_outside_scratch_fail(tmp_path):
    code = ("import sys\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        open(p, 'w').write('w')\n"
            "        print(p, 'WROTE')\n"
            "    except OSError as e:\n"
            "        print(p, 'DENIED', type(e).__name__)\n")
    ws = {"filesystem": {"workspace": {"path": str(tmp_path), "mode": "ro"}}}
    r = argv(["python3", "-c", code, "/scratch/ok", "/tmp/x", "/x", "/workspace/x",
              str(tmp_path / "y")], ws)
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert out.pop("/scratch/ok") == "WROTE", r
    assert all(v.startswith("DENIED") for v in out.values()), r
    assert os.listdir(tmp_path) == []
    ws["filesystem"]["workspace"]["mode"] = "rw"
    r = argv(["python3", "-c", code, "/workspace/x"], ws)
    assert r.stdout == "/workspace/x WROTE\n", r
    assert (tmp_path / "x").read_text() == "w"


def test_no_sockets_and_no_network():
    r = run("import socket\n"
            "try:\n"
            "    socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(('127.0.0.1', 22))\n"
            "    print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('NO SOCKET', e.errno)\n")
    assert r.stdout.startswith("NO SOCKET"), r
    with pytest.raises(UnsupportedRule) as e:
        argv(["python3", "-c", "1"], {"network": {"mode": "allow", "allow": ["example.org"]}})
    assert e.value.field == "network.mode" and "namespace" in str(e.value)


def test_no_native_extensions():
    r = run("import ctypes")
    assert r.verdict == "error" and "ModuleNotFoundError" in r.stderr


# -- the compiled-module cache ---------------------------------------------------------------

def _cache(state):
    from corral.backends.wasm import MODULE_SHA256, WasmBackend
    from corral.backends.wasm_cache import ModuleCache

    module, wt = WasmBackend()._parts()
    return ModuleCache(os.path.join(state, "wasm")), module, MODULE_SHA256, wt


def test_the_compiled_module_is_reused(wasm_state):
    run("pass")   # the entry exists now, however the suite started
    cache, module, sha, wt = _cache(wasm_state)
    path = cache.lookup(sha, wt)
    assert path and path.startswith(os.path.join(wasm_state, "wasm") + "/")
    before = os.stat(path)
    assert cache.ensure(module, sha, wt) == path and not cache.compiled
    r = run("print('again')")
    assert r.stdout == "again\n"
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"


def test_a_cache_entry_for_another_module_hash_is_rejected(wasm_state, tmp_path):
    from corral.backends.wasm_cache import ModuleCache, format_record

    cache, module, sha, wt = _cache(wasm_state)
    src = cache.lookup(sha, wt)
    assert src
    mine = ModuleCache(str(tmp_path / "c"))
    cwasm, meta = mine.paths(mine.record(sha, wt))
    os.makedirs(mine.root)
    shutil.copy(src, cwasm)
    rec = dict(mine.record(sha, wt), size=str(os.path.getsize(cwasm)))

    def write(**over):
        with open(meta, "wb") as f:
            f.write(format_record({**rec, **over}))

    write()
    assert mine.lookup(sha, wt) == cwasm             # a whole, matching entry is used
    write(module_sha256="0" * 64)                    # recorded for another module
    assert mine.lookup(sha, wt) is None
    write(size=str(int(rec["size"]) - 1))            # the compiled file changed size
    assert mine.lookup(sha, wt) is None
    write(cpu="x86_64;another CPU;sse2")             # compiled for another CPU
    assert mine.lookup(sha, wt) is None
    write()
    os.chmod(cwasm, 0o666)                           # a file others may write
    assert mine.lookup(sha, wt) is None
    os.chmod(cwasm, 0o644)
    os.chmod(mine.root, 0o777)                       # a directory others may write
    assert mine.lookup(sha, wt) is None
    os.chmod(mine.root, 0o700)
    assert mine.lookup(sha, wt) == cwasm
    os.unlink(cwasm)
    os.symlink(src, cwasm)                           # a link in its place
    assert mine.lookup(sha, wt) is None


def test_a_module_whose_hash_differs_is_never_compiled(tmp_path):
    from corral.backends.wasm import WasmBackend

    module, _ = WasmBackend()._parts()
    bad = tmp_path / "python.wasm"
    with open(module, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 1                        # one bit of the pinned module flipped
    bad.write_bytes(bytes(data))
    backend = WasmBackend(module=str(bad), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(SandboxSetupError, match="not the pinned"):
        with corral.Sandbox({"isolation": "wasm"}, backend=backend) as sb:
            sb.exec(["python3", "-c", "1"])
    assert not os.path.exists(tmp_path / "cache")   # nothing compiled, nothing written


# -- explain -----------------------------------------------------------------------------------

def test_explain_says_what_the_guest_can_reach(tmp_path):
    from corral.policy import policy_from_dict
    from corral.runtime.explain import explain, render

    d = explain(policy_from_dict({"isolation": "wasm", "filesystem": {
        "workspace": {"path": str(tmp_path), "mode": "ro"}}}))
    assert d["tier"] == "wasm" and d["own_kernel"] is False and d["runs"]
    assert "WASI" in d["kernel_note"]
    assert d["guest"]["preopens"] == [{"path": "/scratch", "mode": "rw"},
                                      {"path": "/workspace", "mode": "ro"}]
    assert d["network"]["default_closed"] and d["network"]["reachable"] == []
    assert d["properties"]["stateful_sessions"] is True
    text = render(d)
    assert "native extensions: none" in text and "run_code sessions: stateful" in text
    assert "live sandboxes: Sandbox.create" in text and "sb.pty refused" in text
    d = explain(policy_from_dict({"isolation": "wasm", "network": {
        "mode": "allow", "allow": ["example.org"]}}))
    assert not d["runs"] and d["refused"]["field"] == "network.mode"


def test_run_code_keeps_an_interpreter_alive():
    with corral.Sandbox({"isolation": "wasm"}) as sb:
        assert sb.run_code("import math, sys; x = 2").error is None
        ex = sb.run_code("math.sqrt(x)")
        assert ex.text == "1.4142135623730951" and ex.error is None
        ex = sb.run_code("print(x, sys.platform); print('e', file=sys.stderr); 1/0")
        assert ex.logs.stdout == ["2 wasi\n"] and ex.logs.stderr == ["e\n"], ex.logs
        assert ex.error.name == "ZeroDivisionError"
        assert sb.run_code("x += 1; x").text == "3"      # state survived the error


# -- the probe on wasm -------------------------------------------------------------------------

def test_the_probe_runs_on_wasm_and_says_what_does_not_apply():
    import subprocess

    from conftest import CORRAL

    cases = ["fs.ssh-key", "info.etc-passwd", "net.direct-tcp", "res.fork-bomb",
             "supply.setup-py", "term.escape-sequences"]
    p = subprocess.run([CORRAL, "probe", "--isolation", "wasm", "--json",
                        *(a for c in cases for a in ("--case", c))],
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    cells = {c["id"]: c for c in json.loads(p.stdout)["cases"]}
    assert set(cells) == set(cases)
    for cid in ("fs.ssh-key", "info.etc-passwd", "net.direct-tcp"):
        assert cells[cid]["status"] == "contained" and cells[cid]["expected"], cells[cid]
    for cid, why in (("res.fork-bomb", "fork"), ("supply.setup-py", "subprocess"),
                     ("term.escape-sequences", "terminal")):
        c = cells[cid]
        assert c["status"] == "unsupported" and c["contained"] is None, c
        assert c["reason"].startswith("not applicable on wasm:") and why in c["reason"], c


def test_the_status_line_is_read_strictly(tmp_path):
    """What the host side wrote in the sandbox's /tmp is hostile once wasmtime is escaped:
    read without following a link, bounded, one strict line, or ignored."""
    from corral.backends.wasm import STATUS_NAME, read_status

    f = tmp_path / STATUS_NAME
    for good, want in ((b"exit 3\n" + b" " * 50, {"end": "exit", "code": 3}),
                       (b"cpu_time 1\n", {"end": "cpu_time", "code": 1})):
        f.write_bytes(good)
        assert read_status(str(tmp_path)) == want
    for bad in (b"exit 3", b"oom 1\n", b"exit 300\n", b"exit -1\n", b"exit 1 x\n",
                b"exit 1\nexit 2\n", b"exit \xff\n", b"exit 1\n" + b" " * 5000):
        f.write_bytes(bad)
        assert read_status(str(tmp_path)) is None, bad
    f.unlink()
    (tmp_path / "real").write_bytes(b"timeout 1\n")
    f.symlink_to(tmp_path / "real")
    assert read_status(str(tmp_path)) is None          # a link is not followed
    f.unlink()
    os.mkfifo(f)
    assert read_status(str(tmp_path)) is None          # nor a FIFO read (or waited on)


def test_wasmtime_runs_in_a_namespace_sandbox_of_its_own():
    """Defence in depth: the process that runs wasmtime has its own unprivileged uid, a
    seccomp filter, and network and mount namespaces that are not the host's; the guest's
    environment reaches it without showing on its command line."""
    import threading
    import time

    got = {}

    def watch():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not got:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().split(b"\0")
                    if len(cmd) < 4 or not cmd[3].endswith(b"wasm_host.py"):
                        continue
                    with open(f"/proc/{pid}/status") as f:
                        status = dict(line.split(":\t", 1) for line in f if ":\t" in line)
                    got.update(cmdline=b" ".join(cmd),
                               uid=status["Uid"].split(), seccomp=status["Seccomp"].strip(),
                               caps=status["CapEff"].strip(),
                               net=os.readlink(f"/proc/{pid}/ns/net"),
                               mnt=os.readlink(f"/proc/{pid}/ns/mnt"))
                except (OSError, KeyError):
                    continue
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    r = run("import os, time; time.sleep(3); print(os.environ['WASM_SECRET'])",
            {"env": {"set": {"WASM_SECRET": "s3cr3t-value"}}})
    t.join()
    assert r.stdout == "s3cr3t-value\n", r
    assert got, "no wasm_host.py process was seen"
    assert b"s3cr3t-value" not in got["cmdline"]   # the guest's env is never on a command line
    assert got["uid"][0] != "0" and got["uid"][1] != "0", got   # not root on the host
    assert got["seccomp"] == "2" and int(got["caps"], 16) == 0, got   # seccomp, no caps
    assert got["net"] != os.readlink("/proc/self/ns/net"), got
    assert got["mnt"] != os.readlink("/proc/self/ns/mnt"), got


def test_a_trap_is_one_line_with_wasmtimes_reason():
    r = run("raise SystemExit(130)")   # WASI exit statuses stop at 125
    assert (r.verdict, r.exit_code) == ("error", 1), r
    assert r.stderr.splitlines()[-1] == ("corral: the wasm guest trapped: exit with invalid "
                                         "exit status outside of [0..126)"), r


def test_what_the_guest_cannot_have_is_refused_naming_a_tier_that_could(tmp_path):
    for extra, field in (({"filesystem": {"workspace": {"path": str(tmp_path),
                                                        "mode": "review"}}},
                          "filesystem.workspace"),
                         ({"network": {"mode": "allow", "allow": ["example.org"]}},
                          "network.mode")):
        with pytest.raises(UnsupportedRule) as e:
            argv(["python3", "-c", "1"], extra)
        assert e.value.field == field and 'isolation = "namespace" could' in str(e.value)
    with pytest.raises(corral.BackendUnavailable, match="terminal"):
        with corral.Sandbox({"isolation": "wasm"}) as sb:
            sb.exec(["python3", "-c", "1"], tty=True)


def test_stale_cache_entries_are_swept_when_an_entry_is_written(tmp_path):
    """A compile (here of a tiny module, with the real wasmtime) removes the entries this
    corral would never use once unused for STALE_S, temporaries and records-less compiled
    files of dead compiles, and links (never what they point at); it keeps the rest."""
    import hashlib
    import time

    from corral.backends.wasm import MODULE_SHA256, _find
    from corral.backends.wasm_cache import STALE_S, ModuleCache, format_record

    wt = _find("wasmtime")
    import wasmtime

    tiny = wasmtime.wat2wasm('(module (func (export "_start")))')
    module = tmp_path / "tiny.wasm"
    module.write_bytes(tiny)
    sha = hashlib.sha256(tiny).hexdigest()
    cache = ModuleCache(str(tmp_path / "cache"))
    os.makedirs(cache.root, 0o700)
    now = time.time()
    old = now - STALE_S - 3600
    here = cache.record(sha, wt)

    def entry(key, age, **over):
        rec = {**here, "size": "3", **over}
        for suffix, data in ((".cwasm", b"abc"), (".rec", format_record(rec))):
            p = os.path.join(cache.root, key + suffix)
            with open(p, "wb") as f:
                f.write(data)
            os.utime(p, (age, age))

    def plain(name, age, data=b"x"):
        p = os.path.join(cache.root, name)
        with open(p, "wb") as f:
            f.write(data)
        os.utime(p, (age, age))

    entry("v49", old, wasmtime="49.0.0")                        # another wasmtime
    entry("othercpu", old, cpu="x86_64;another;sse2")           # another CPU
    entry("othermod", old, module_sha256="1" * 64)              # another module
    entry("othermod-fresh", now, module_sha256="2" * 64)        # in use lately: kept
    entry("pinned", old, module_sha256=MODULE_SHA256)           # the pinned module: kept
    plain("garbage.rec", old, b"not a record")                  # unreadable record
    plain("garbage.cwasm", old)
    plain("orphan.cwasm", old)                                  # its record never came
    plain("young-orphan.cwasm", now)                            # a compile under way
    plain("k.cwasm.123.abcd.tmp", old)                          # a compile that died
    plain("notes.txt", old)                                     # not the cache's: kept
    target = tmp_path / "target"
    target.write_bytes(b"keep me")
    os.symlink(target, os.path.join(cache.root, "evil.rec"))
    os.symlink(target, os.path.join(cache.root, "evil.cwasm"))

    path = cache.ensure(str(module), sha, wt)
    assert cache.compiled and cache.lookup(sha, wt) == path
    left = sorted(os.listdir(cache.root))
    key = os.path.basename(path)[:-len(".cwasm")]
    assert left == sorted([key + ".cwasm", key + ".rec", "othermod-fresh.cwasm",
                           "othermod-fresh.rec", "pinned.cwasm", "pinned.rec",
                           "young-orphan.cwasm", "notes.txt"]), left
    assert target.read_bytes() == b"keep me"

    # an entry in use is refreshed by its lookups and survives a later sweep
    meta = os.path.join(cache.root, key + ".rec")
    os.utime(meta, (old, old))
    assert cache.lookup(sha, wt) == path
    assert os.stat(meta).st_mtime > now - 60
    assert cache.sweep((MODULE_SHA256,), wt, now=now + 60) == []
    # not a hash to keep any more and unused past STALE_S: it goes, its record last
    gone = cache.sweep((MODULE_SHA256,), wt, now=now + STALE_S + 7200)
    assert {key + ".cwasm", key + ".rec", "othermod-fresh.rec"} <= set(gone), gone
    assert not {"pinned.rec", "pinned.cwasm", "notes.txt"} & set(gone), gone
    assert cache.lookup(sha, wt) is None
