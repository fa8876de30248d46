"""A /bin/sh -c command line that the shell would only exec runs without the shell in a
namespace-tier live sandbox (linux/shellexec.py), and gives what the shell gives. Each
line runs both ways in one real sandbox: as a str (sb.commands.run(line), exec'd directly
when it can be) and as ["/bin/sh", "-c", line, "/bin/sh"] (always the shell: four
words; $0 is the same), and the Results are compared."""

from __future__ import annotations

import pytest
from livefix import available

import corral
from corral.linux.shellexec import simple_words


@pytest.fixture(scope="module")
def sb():
    available("namespace")
    s = corral.Sandbox.create({"isolation": "namespace"}, timeout=300)
    yield s
    s.kill()


def _both(sb, line, **kw):
    direct = sb.commands.run(line, **kw)
    shell = sb.commands.run(["/bin/sh", "-c", line, "/bin/sh"], **kw)
    return direct, shell


def _same(a, b, *, sort_lines=False):
    def out(r):
        return "".join(sorted(r.stdout.splitlines(True))) if sort_lines else r.stdout
    assert (out(a), a.stderr, a.exit_code, a.signal, a.verdict) == \
        (out(b), b.stderr, b.exit_code, b.signal, b.verdict), (a, b)


def _ppid(r) -> int:
    line = [x for x in r.stdout.splitlines() if x.startswith("PPid:")][0]
    return int(line.split()[1])


def test_a_plain_command_runs_without_the_shell(sb):
    # the program's parent is the shell's pid inside, or none inside (0: the zygote,
    # outside the sandbox's pid namespace) when exec'd directly
    direct, shell = _both(sb, "cat /proc/self/status")
    assert _ppid(shell) > 0, shell
    assert _ppid(direct) == 0, direct
    # one the shell must run keeps it (a redirection)
    r = sb.commands.run("cat /proc/self/status > /scratch/st; cat /scratch/st")
    assert _ppid(r) > 0, r


@pytest.mark.parametrize("line", [
    "true", "false", "true --version", "false x", "ls -la /usr", "id", "python3 -c 1",
    "/usr/bin/env", "nosuchcmd", "nosuchcmd a b", "/nosuch/prog", "/scratch", "cd /tmp",
    "echo -e a\\tb", "echo $HOME", "ls /usr/bin/py*", "test -d /tmp", "pwd", "kill -l 9",
    "exit 3", "sleep 0", "printf %s x", ":", "[ -d / ]", "if", "{", "env -u PATH",
    "ls -d ~", "A=1 env", "ls /nonexistent",
])
def test_the_same_result_with_and_without_the_shell(sb, line):
    a, b = _both(sb, line)
    _same(a, b, sort_lines="env" in line)


def test_env_and_pwd_as_the_shell_exports_them(sb):
    extra = {"FOO": "bar baz", "WEIRD.NAME": "x", "_U": "1", "PWD": "/nowhere"}
    a, b = _both(sb, "env", env=extra, cwd="/tmp")
    _same(a, b, sort_lines=True)
    assert "FOO=bar baz\n" in a.stdout and "WEIRD.NAME" not in a.stdout, a
    assert "PWD=/tmp\n" in a.stdout, a
    a, b = _both(sb, "env", env={"PWD": "/tmp/"}, cwd="/tmp")   # names it: kept
    _same(a, b, sort_lines=True)
    for name in ("IFS", "OPTIND", "LINENO", "PS1"):    # dash sets some itself
        a, b = _both(sb, "env", env={name: "x"})
        _same(a, b, sort_lines=True)
    # an environment without PATH: the shell's own default search
    a, b = _both(sb, "ls /", env={"PATH": ""})
    _same(a, b)


def test_scripts_files_and_signal_deaths_as_the_shell_reports_them(sb):
    setup = ("printf '#!/bin/sh\\necho script $0 $1\\n' > /scratch/s.sh; "
             "printf 'echo noshebang\\n' > /scratch/n.sh; "
             "printf 'not a program' > /scratch/x.bin; "
             "printf '#!/usr/bin/python3\\nimport os, signal\\n"
             "os.kill(os.getpid(), signal.SIGSEGV)\\n' > /scratch/segv; "
             "printf '#!/usr/bin/python3\\nimport os, signal\\n"
             "os.kill(os.getpid(), signal.SIGINT)\\n' > /scratch/int; "
             "chmod +x /scratch/s.sh /scratch/n.sh /scratch/x.bin /scratch/segv "
             "/scratch/int; printf x > /scratch/noexec; "
             "printf '#!/nonexistent\\n' > /scratch/badi; chmod +x /scratch/badi")
    assert sb.commands.run(setup).exit_code == 0
    for line in ("/scratch/s.sh one", "/scratch/n.sh", "/scratch/x.bin", "/scratch/noexec",
                 "/scratch/segv", "/scratch/int", "/scratch/badi"):
        a, b = _both(sb, line)
        _same(a, b)
    a, _ = _both(sb, "/scratch/segv")
    assert a.exit_code == 139 and a.stderr == "Segmentation fault\n", a
    a, b = _both(sb, "/scratch/s.sh two")
    _same(a, b)
    assert a.stdout == "script /scratch/s.sh two\n", a


def test_a_timeout_or_kill_is_still_a_signal(sb):
    r = sb.commands.run("sleep 5", timeout=0.3)
    assert r.signal == 9 and r.exit_code is None, r
    h = sb.commands.run("sleep 5", background=True)
    h.send_signal(15)
    r = h.wait(10)
    assert r.signal == 15, r


def test_simple_words_takes_only_plain_lines():
    assert simple_words("ls -la /tmp") == ["ls", "-la", "/tmp"]
    assert simple_words("python3\tmain.py ") == ["python3", "main.py"]
    for line in ("", "  ", "true", "false", "true x", "echo hi", "cd /", "a=b", "ls *", "ls ~", "ls 'a'",
                 "ls $X", "a; b", "a | b", "a > f", "a\nb", "./prog", "if", "ls \\x",
                 "ls é", "f(x)", "ls #c", "a&"):
        assert simple_words(line) is None, line


def test_read_head_reads_a_files_first_bytes_or_says_none(tmp_path):
    """The one head read of resolve() and the process tier's missing-interpreter check."""
    import os

    from corral.linux.shellexec import read_head

    (tmp_path / "s.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (tmp_path / "tiny").write_bytes(b"ab")
    os.mkfifo(tmp_path / "fifo")            # no writer: not waited for
    assert read_head(tmp_path / "s.sh", 4) == b"#!/b"
    assert read_head(str(tmp_path / "tiny"), 256) == b"ab"
    assert read_head(os.fsencode(tmp_path / "s.sh"), 256) == b"#!/bin/sh\necho hi\n"
    assert read_head(tmp_path / "fifo", 4) == b""
    assert read_head(tmp_path / "none", 4) is None
    assert read_head(tmp_path, 4) is None   # a directory: EISDIR
