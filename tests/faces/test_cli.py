"""The `corral` command: exit statuses, --json, one-line errors, policy show, doctor,
terminal safety. Real processes, real sandboxes."""

import json
import os
import pty
import select
import subprocess
import tomllib

import pytest
from conftest import CORRAL


def corral(*args, input=None, env=None):
    return subprocess.run([CORRAL, *args], capture_output=True, text=True, input=input,
                          env=env, timeout=60)


def test_version_and_help():
    assert corral("--version").stdout.startswith("corral ")
    for args in (["--help"], ["run", "--help"], ["policy", "--help"], ["doctor", "--help"]):
        r = corral(*args)
        assert r.returncode == 0 and "usage: corral" in r.stdout, args
    assert corral().returncode == 2
    r = corral("frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr


@pytest.mark.parametrize("cmd,status", [
    ("exit 0", 0), ("exit 3", 3), ("exit 200", 200), ("kill -TERM $$", 128 + 15),
    ("kill -9 $$", 137),
])
def test_exit_status_is_the_commands(cmd, status):
    assert corral("run", "--", "/bin/sh", "-c", cmd).returncode == status
    assert corral("run", "--json", "--", "/bin/sh", "-c", cmd).returncode == status


def test_timeout_and_oom_statuses():
    r = corral("run", "--timeout", "500ms", "--", "sleep", "10")
    assert r.returncode == 124 and "timeout" in r.stderr
    r = corral("run", "--json", "--memory", "32M", "--", "/usr/bin/python3", "-c",
               "b = bytearray(100 << 20)")
    assert r.returncode == 137 and json.loads(r.stdout)["verdict"] == "oom"


def test_output_is_streamed_as_is_when_not_a_terminal():
    r = corral("run", "--", "/bin/sh", "-c", "printf 'out\\033[31m\\n'; printf 'err\\n' >&2; exit 4")
    assert r.returncode == 4 and r.stdout == "out\x1b[31m\n" and r.stderr == "err\n"


def test_json_result_has_every_field():
    r = corral("run", "--json", "--", "/bin/sh", "-c", "echo hi; echo oops >&2; exit 1")
    d = json.loads(r.stdout)
    assert set(d) == {"verdict", "exit_code", "signal", "stdout", "stderr", "stdout_truncated",
                      "stderr_truncated", "usage", "events", "isolation"}
    assert (d["verdict"], d["exit_code"], d["signal"]) == ("error", 1, None)
    assert d["stdout"] == "hi\n" and d["stderr"] == "oops\n" and d["isolation"] == "namespace"
    assert set(d["usage"]) == {"wall_s", "cpu_s", "memory_peak_bytes"}
    assert d["usage"]["memory_peak_bytes"] > 0 and d["usage"]["cpu_s"] >= 0


@pytest.mark.parametrize("args,field,status", [
    (["--memory", "lots"], "limits.memory", 2),
    (["--pids", "0"], "limits.pids", 2),
    (["--timeout", "-1"], "limits.timeout", 2),
    (["--workspace", "/nonexistent-corral-ws"], "filesystem.workspace.path", 2),
    (["--ro-bind", "/proc"], "filesystem.ro_binds[0]", 2),
    (["--env", "BAD-NAME"], "env.pass[0]", 2),
    (["--isolation", "microvm"], "image", 3),   # microvm boots images only
    (["--frob"], "--frob", 2),
    (["--policy", "/nonexistent.toml"], "--policy", 2),
])
def test_bad_input_is_one_line_naming_the_field(args, field, status):
    r = corral("run", *args, "--", "true")
    assert r.returncode == status, r.stderr
    assert r.stderr.count("\n") == 1 and field in r.stderr
    r = corral("run", "--json", *args, "--", "true")
    err = json.loads(r.stdout)["error"]
    assert r.returncode == status and err["field"] == field and err["message"]


def test_missing_command_and_exec_failure():
    r = corral("run")
    assert r.returncode == 2 and "no command" in r.stderr
    r = corral("run", "--json", "--", "/no/such/program")
    d = json.loads(r.stdout)
    assert r.returncode == 127 and d["verdict"] == "error" and d["exit_code"] == 127
    assert d["stderr"] == "corral: command not found inside the sandbox: /no/such/program\n"


def test_policy_file_unknown_key_and_round_trip(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[limits]\nmemroy = "1G"\n')
    r = corral("run", "--policy", str(bad), "--", "true")
    assert r.returncode == 2 and "limits.memroy" in r.stderr and "memory" in r.stderr
    good = tmp_path / "good.toml"
    good.write_text('[limits]\nmemory = "1G"\ntimeout = "90s"\n[env]\nset = { A = "1" }\n')
    shown = corral("policy", "show", "--policy", str(good), "--pids", "99", "--env", "B=2")
    assert shown.returncode == 0
    data = tomllib.loads(shown.stdout)
    assert data["limits"]["memory"] == "1G" and data["limits"]["pids"] == 99
    assert data["limits"]["timeout"] == "90s" and data["env"]["set"] == {"A": "1", "B": "2"}
    assert data["network"]["mode"] == "none" and data["limits"]["scratch_inodes"] == 65536
    again = tmp_path / "again.toml"
    again.write_text(shown.stdout)
    assert corral("policy", "show", "--policy", str(again)).stdout == shown.stdout
    r = corral("run", "--policy", str(again), "--", "/bin/sh", "-c", "echo $A$B")
    assert r.stdout == "12\n"


def test_flags_override_the_file(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[limits]\ntimeout = "500ms"\n')
    assert corral("run", "--policy", str(f), "--", "sleep", "2").returncode == 124
    assert corral("run", "--policy", str(f), "--timeout", "5s", "--", "sleep", "1").returncode == 0


def test_stdin_passthrough_and_default():
    r = corral("run", "--stdin", "--", "/bin/sh", "-c", "tr a-z A-Z", input="piped in\n")
    assert r.stdout == "PIPED IN\n"
    r = corral("run", "--", "/bin/sh", "-c", "cat; echo end", input="not passed\n")
    assert r.stdout == "end\n"


def test_workspace_flag_sets_cwd(tmp_path):
    os.chmod(tmp_path, 0o755)
    (tmp_path / "f.txt").write_text("content")
    r = corral("run", "--workspace", f"{tmp_path}:ro", "--", "/bin/sh", "-c", "pwd; cat f.txt")
    assert r.stdout == "/workspace\ncontent"


def test_doctor_looks_and_exits_zero():
    r = corral("doctor")
    assert r.returncode == 0 and "bwrap" in r.stdout and "cgroups" in r.stdout
    facts = json.loads(corral("doctor", "--json").stdout)
    assert facts["tiers"]["namespace"] is True
    assert {"bwrap", "user_namespaces", "seccomp", "cgroups", "landlock_abi", "runsc",
            "kvm"} <= set(facts)


def _run_on_a_terminal(args):
    """Run corral with stdout and stderr on a pseudo-terminal; return what the terminal got."""
    master, slave = pty.openpty()
    p = subprocess.Popen([CORRAL, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 10)
        if not r:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=10)
    os.close(master)
    return p.returncode, out


def test_argv_bytes_that_are_not_utf8_reach_the_command_as_they_are():
    """sys.argv holds them surrogate-escaped; the sandbox's command gets the bytes (it
    was a UnicodeEncodeError traceback)."""
    r = subprocess.run([CORRAL, "run", "--", "printf", "%s", b"\xff\xfe-\xc3\xa4"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"\xff\xfe-\xc3\xa4"


def test_escape_sequences_are_neutralised_on_a_terminal():
    evil = "printf 'a\\033]52;c;ZXZpbA==\\007b\\033[2Jc\\rd\\n'"
    rc, out = _run_on_a_terminal(["run", "--", "/bin/sh", "-c", evil])
    assert rc == 0
    assert b"\x1b" not in out and b"\x07" not in out
    assert b"a\\x1b]52;c;ZXZpbA==\\x07b\\x1b[2Jc\\x0dd" in out
    rc, out = _run_on_a_terminal(["run", "--raw", "--", "/bin/sh", "-c", evil])
    assert b"\x1b]52;" in out


def test_stdin_that_is_a_terminal_is_refused():
    master, slave = pty.openpty()
    try:
        r = subprocess.run([CORRAL, "run", "--stdin", "--", "cat"], stdin=slave,
                           capture_output=True, text=True, timeout=30)
    finally:
        os.close(master)
        os.close(slave)
    assert r.returncode == 2 and "terminal" in r.stderr


# -- the start-up path (issue 14): what `corral run` imports, and how it ends -------------

#: imported only when needed: a policy to read, an event to make, an egress proxy, the
#: whole ctypes package and its C core (_sys's calls are corral's C module, _csys),
#: OpenSSL's hashlib, the audit store's writer thread (and the collections it uses), the
#: seccomp tables (a cache miss), the CLI's other commands; none is on the path of a plain
#: run
OFF_THE_RUN_PATH = ("corral.policy.load", "corral.policy.units", "corral.events",
                    "corral.backends.host.proxy", "ctypes", "hashlib", "json", "enum",
                    "typing", "re", "threading", "subprocess", "dataclasses", "inspect",
                    "collections", "contextvars", "_contextvars", "corral.audit.writer",
                    "corral.linux.seccomp", "corral.cli_terminal", "corral.cli_review",
                    "corral.cli_sandbox", "resource", "_ctypes", "corral.linux._sys_ctypes")
#: the corral modules `corral run -- /bin/true` imports (v0.1 imported 20; each extra one is
#: named in docs/architecture.md, "The start-up path of corral run")
RUN_PATH_MODULES = 29   # 28 and, since session 15, corral.linux._csys in place of _ctypes


def launched(tmp_path, *args) -> tuple[set[str], str]:
    """Run the launcher as installed with a hook that notes, at exit, sys.modules and
    whether the cyclic GC is on (and how many objects gc_back_on() froze)."""
    out = tmp_path / "at-exit"
    hook = ("import atexit, gc, sys\n"
            f"atexit.register(lambda: open({str(out)!r}, 'w').write("
            "f'{gc.isenabled()} {gc.get_freeze_count()}\\n' + '\\n'.join(sys.modules)))\n")
    with open(CORRAL) as f:
        launcher = f.read()
    python = launcher.splitlines()[0][2:].split()
    r = subprocess.run([*python, "-c", hook + launcher, *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    gc_line, *mods = out.read_text().split("\n")
    return set(mods), gc_line


def test_the_gc_is_back_on_before_any_command_runs(tmp_path):
    """The launcher turns the cyclic GC off for the imports; a sandbox's command and every
    other subcommand (corral serve runs for days) run with it on."""
    for args in (["run", "--", "/bin/true"], ["policy", "show"]):
        _, gc_line = launched(tmp_path, *args)
        on, frozen = gc_line.split()
        assert on == "True" and int(frozen) > 1000, (args, gc_line)


def test_run_path_imports_only_what_a_run_needs(tmp_path):
    mods, _ = launched(tmp_path, "run", "--", "/bin/true")
    assert "corral.backends.namespace" in mods and "corral.linux._sys" in mods
    assert not mods & set(OFF_THE_RUN_PATH), sorted(mods & set(OFF_THE_RUN_PATH))
    ours = sorted(m for m in mods if m == "corral" or m.startswith("corral."))
    assert len(ours) <= RUN_PATH_MODULES, ours


def test_a_recorded_run_spools_without_sqlite_or_a_thread(tmp_path, monkeypatch):
    """With the audit store on, `corral run` keeps its record in the spool: after the
    command it imports no sqlite3, threading or json, nor the spool's reader (the writer
    is in corral.audit.record) nor the writer thread's module, or the policy's TOML printer (docs/audit.md)."""
    monkeypatch.setenv("CORRAL_AUDIT", "1")
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "state"))
    mods, _ = launched(tmp_path, "run", "--", "/bin/true")
    assert "corral.audit.record" in mods
    assert not mods & {"_sqlite3", "sqlite3", "threading", "json", "corral.audit.store",
                       "corral.audit.spool", "corral.policy.dump", "_json", "pwd"}
    assert (tmp_path / "state" / "audit" / "spool" / "runs.jsonl").stat().st_size > 0


def test_the_command_ends_like_a_python_exit():
    """entry() skips the interpreter's finalization: stdout is still flushed (a failed
    flush exits 120, as Python's own exit does) and the status is main()'s."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([CORRAL, "--version"], stdout=full, stderr=subprocess.PIPE,
                           timeout=60)
    assert r.returncode == 120
    r = corral("--version")
    assert r.returncode == 0 and r.stdout.startswith("corral ")
    assert corral("frobnicate").returncode == 2
    r = corral("run", "--", "/bin/sh", "-c", "printf 'x%.0s' $(seq 100000)")
    assert r.returncode == 0 and r.stdout == "x" * 100000
