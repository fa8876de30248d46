"""sb.pty: terminals driven by a program (corral.runtime.pty), on real sandboxes."""

import re
import threading
import time

import pytest
from conftest import tier_unavailable

import corral
from corral.errors import UsageError
from corral.runtime.pty import command_line

PROMPT = b"corral-pty$ "
WAIT_S = 30


class Screen:
    """What a terminal showed, with expect() on it."""

    def __init__(self):
        self.data = b""
        self.cond = threading.Condition()
        self.pos = 0

    def feed(self, chunk: bytes):
        with self.cond:
            self.data += chunk
            self.cond.notify_all()

    def expect(self, pattern: bytes) -> re.Match:
        deadline = time.monotonic() + WAIT_S
        rx = re.compile(pattern)
        with self.cond:
            while True:
                m = rx.search(self.data, self.pos)
                if m:
                    self.pos = m.end()
                    return m
                left = deadline - time.monotonic()
                assert left > 0, f"{pattern!r} never came; the screen: {self.data[-500:]!r}"
                self.cond.wait(left)


@pytest.fixture(params=["namespace", "gvisor", "process", "namespace-live", "gvisor-live"])
def sb(request):
    tier, _, kept = request.param.partition("-")
    why = tier_unavailable(tier)
    if why:
        pytest.skip(why)
    policy = {"isolation": tier, "limits": {"timeout": "5m"}}
    with (corral.Sandbox.create(policy, timeout=600) if kept else corral.Sandbox(policy)) as s:
        yield s


def _shell(sb, screen, cols=90, rows=30):
    return sb.pty.create(cols, rows, ["bash", "--norc", "-i"], on_data=screen.feed,
                         env={"PS1": PROMPT.decode()}, cwd="/tmp")


def test_a_shell_answers_resizes_and_exits(sb):
    screen = Screen()
    t = _shell(sb, screen)
    screen.expect(re.escape(PROMPT))
    t.send_input(b'echo "pid:"$$ "cwd:"$(pwd)\r')
    m = screen.expect(rb"pid:(\d+) cwd:(\S+)\r\n")
    if sb.isolation != "process":
        assert int(m.group(1)) < 10       # its own pid namespace
    assert m.group(2) == b"/tmp"          # cwd applied
    screen.expect(re.escape(PROMPT))
    t.send_input('echo "size:"$(stty size)\r')
    screen.expect(rb"size:30 90\r\n")
    screen.expect(re.escape(PROMPT))
    t.resize(111, 37)
    t.send_input(b'echo "size:"$(stty size)\r')
    screen.expect(rb"size:37 111\r\n")
    screen.expect(re.escape(PROMPT))
    # TIOCSTI still refused on its own terminal
    t.send_input(b"/usr/bin/python3 -c 'import errno, fcntl\nexec(\"try: fcntl.ioctl(0, "
                 b"0x5412, bytes(1)); print(\\\"sti:\\\" \\\"ok\\\")\\nexcept OSError as e: "
                 b"print(\\\"sti:\\\" + errno.errorcode[e.errno])\")'\r")
    got = screen.expect(rb"sti:(\w+)\r\n").group(1)
    # refused either way: by seccomp (EPERM), or, for a gvisor live sandbox's command (runsc
    # exec: no deny list), by gVisor's own terminal, which has no TIOCSTI (ENOTTY)
    assert got == b"EPERM" or (sb.isolation == "gvisor" and got == b"ENOTTY"), got
    screen.expect(re.escape(PROMPT))
    t.send_input(b"exit 7\r")
    r = t.wait(WAIT_S)
    assert r.exit_code == 7 and "size:37 111" in r.stdout and r.stderr == ""
    with pytest.raises(BrokenPipeError):
        t.send_input(b"late")


def test_kill_ends_it(sb):
    screen = Screen()
    t = _shell(sb, screen)
    screen.expect(re.escape(PROMPT))
    t.send_input(b"trap '' HUP INT TERM; echo trapped\r")   # it ignores what it can
    screen.expect(rb"trapped\r\n")
    # the host sees the session leader (on gvisor it is inside gVisor: the pid inside)
    assert t.pid is not None or t.pid_inside is not None
    t.kill()
    r = t.wait(WAIT_S)
    assert r.verdict == "killed" and r.signal == 9
    # the sandbox goes on: another terminal in it works
    screen2 = Screen()
    t2 = sb.pty.create(80, 24, "echo second-$((40+2))", on_data=screen2.feed)
    screen2.expect(rb"second-42")
    assert t2.wait(WAIT_S).exit_code == 0


def test_command_line_checks_its_input():
    assert command_line("bash", None, None) == ["/bin/bash", "-i"]
    assert command_line("ls | wc", None, None) == ["/bin/sh", "-c", "ls | wc"]
    assert command_line(["top"], {"TERM": "xterm"}, "/w") == \
        ["/usr/bin/env", "-C", "/w", "--", "TERM=xterm", "top"]
    for env in ({"A=B": "x"}, {"": "x"}, {"A": "x\0y"}):
        with pytest.raises(UsageError, match="env name"):
            command_line("bash", env, None)
    with pytest.raises(UsageError, match="cols"):
        corral.Sandbox({"isolation": "namespace"}).pty.create(0, 24)


@pytest.mark.parametrize("tier", ["namespace", "gvisor"])
def test_corral_shell_is_a_terminal_in_a_fresh_sandbox(tier):
    """`corral shell`: the caller's terminal relayed to a pty of the sandbox's own; size
    changes followed; the shell's exit status is corral's."""
    why = tier_unavailable(tier)
    if why:
        pytest.skip(why)
    from test_tty import Term

    t = Term(["shell", "--isolation", tier, "--timeout", "5m", f"--env=PS1={PROMPT.decode()}", "--",
              "bash", "--norc", "-i"], size=(30, 90))
    try:
        t.expect(re.escape(PROMPT))
        t.send(b'echo "pid:"$$ "size:"$(stty size)\r')
        m = t.expect(rb"pid:(\d+) size:30 90\r\n")
        assert int(m.group(1)) < 10
        t.expect(re.escape(PROMPT))
        t.resize(37, 111)   # corral gets SIGWINCH before it reads the next keys
        t.send(b'echo "size:"$(stty size)\r')
        t.expect(rb"size:37 111\r\n")
        t.send(b"exit 5\r")
        assert t.wait() == 5
    finally:
        t.close()


def test_corral_shell_refuses_a_pipe_and_an_id(corral_bin):
    import subprocess

    r = subprocess.run([corral_bin, "shell"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, check=False)
    assert r.returncode == 2 and "needs a terminal" in r.stderr
    r = subprocess.run([corral_bin, "shell", "sb-123"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "live sandbox" in r.stderr


def test_a_live_sandboxs_terminal_is_one_of_its_commands():
    """On a live sandbox a terminal runs among the sandbox's own processes (its pid
    namespace: it sees a background command's process) and is listed as a command."""
    why = tier_unavailable("namespace")
    if why:
        pytest.skip(why)
    with corral.Sandbox.create({"limits": {"timeout": "5m"}}, timeout=600) as sb:
        bg = sb.commands.run(["sleep", "4242"], background=True)
        screen = Screen()
        t = _shell(sb, screen)
        screen.expect(re.escape(PROMPT))
        assert any(i.cmd[:1] == ("/usr/bin/env",) for i in sb.commands.list())
        t.send_input(b"echo seen:$(pgrep -f 'slee[p] 4242')\r")
        assert int(screen.expect(rb"seen:(\d+)\r\n").group(1)) == bg.pid
        t.kill()
        assert t.wait(WAIT_S).verdict == "killed"
        assert bg.running                     # the terminal's kill was its own
        bg.kill()
