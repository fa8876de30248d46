"""`corral run -t`: a terminal of the sandbox's own, driven through a real pseudo-terminal
as a user's shell would (pty.fork: corral's controlling terminal is the test's pty), on
every tier; and the notice when stdin is a terminal without -t. Every read is bounded by a
generous timeout; nothing asserts on time."""

import errno
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios

import pytest
from conftest import ALL_TIERS, CORRAL, tier_unavailable

#: a wait for output that should come at once; only a broken run ever reaches it
READ_TIMEOUT_S = 60
PROMPT = b"@corral-tty@ "


class Term:
    """corral under a pty of the test's own, as its controlling terminal (the test is the
    terminal emulator: it reads the master and types into it)."""

    def __init__(self, args, size=(24, 80), stderr_pipe=False):
        self.err_r = None
        err_w = None
        if stderr_pipe:
            self.err_r, err_w = os.pipe()
        pid, fd = pty.fork()
        if pid == 0:  # child: fds 0-2 are the slave, which is its controlling terminal
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
                if err_w is not None:
                    os.dup2(err_w, 2)
                os.execv(CORRAL, [CORRAL, *args])
            finally:
                os._exit(127)
        if err_w is not None:
            os.close(err_w)
        self.pid, self.fd = pid, fd
        self.seen = b""
        self.status = None

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def expect(self, pattern: bytes, timeout=READ_TIMEOUT_S) -> re.Match:
        """Read until `pattern` matches what came since the last match; return the match."""
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.seen)
            if m:
                self.seen = self.seen[m.end():]
                return m
            r, _, _ = select.select([self.fd], [], [], timeout)
            if not r:
                raise AssertionError(f"no {pattern!r} in {timeout} s; got {self.seen[-2000:]!r}")
            try:
                data = os.read(self.fd, 65536)
            except OSError as e:   # EIO: corral exited and closed the terminal
                assert e.errno == errno.EIO
                data = b""
            if not data:
                raise AssertionError(f"corral ended before {pattern!r}: {self.seen[-2000:]!r}")
            self.seen += data

    def resize(self, rows: int, cols: int) -> None:
        """What a terminal emulator does: the kernel signals corral (SIGWINCH)."""
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout=READ_TIMEOUT_S) -> int:
        """Read to the end (EIO), then corral's exit status."""
        while True:
            r, _, _ = select.select([self.fd], [], [], timeout)
            if not r:
                raise AssertionError(f"corral did not end in {timeout} s: {self.seen[-2000:]!r}")
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            self.seen += data
        _, st = os.waitpid(self.pid, 0)
        self.status = os.waitstatus_to_exitcode(st)
        return self.status

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)
        if self.err_r is not None:
            os.close(self.err_r)


def shell(tier: str, *extra) -> Term:
    return Term(["run", "-t", "--isolation", tier, "--timeout", "10m",
                 f"--env=PS1={PROMPT.decode()}", *extra, "--", "bash", "--norc", "-i"],
                size=(30, 90))


def skip_unless(tier):
    why = tier_unavailable(tier)
    if why:
        pytest.skip(f"{tier} tier unavailable here: {why}")


@pytest.mark.parametrize("tier", ALL_TIERS)
def test_interactive_shell_on_a_terminal_of_its_own(tier):
    skip_unless(tier)
    t = shell(tier)
    try:
        t.expect(PROMPT)
        # $$: the shell's pid as the sandbox sees it (pid namespace: a small number)
        t.send(b'echo "pid:"$$\r')
        pid = int(t.expect(rb"pid:(\d+)\r\n").group(1))
        if tier in ("namespace", "gvisor"):
            assert pid < 10, pid
        t.expect(PROMPT)
        # a terminal on stdin, stdout and stderr, and the shell's controlling terminal
        t.send(b'for fd in 0 1 2; do test -t $fd && echo "isatty:$fd"; done; '
               b'echo "ctty:"$(ps -o tty= -p $$)\r')
        t.expect(rb"isatty:0\r\nisatty:1\r\nisatty:2\r\n")
        ctty = t.expect(rb"ctty:(\S*)\r\n").group(1)
        if tier != "gvisor":   # gVisor's ps shows no tty for its host-backed terminal
            assert ctty.startswith(b"pts/"), ctty
        t.expect(PROMPT)
        if tier != "gvisor":   # ttyname(): gVisor answers "not a tty" (docs/tiers.md)
            t.send(b"tty\r")
            t.expect(rb"\r\n/dev/pts/\d+\r\n")
            t.expect(PROMPT)
        # the window size: first the caller's, then each change of it
        t.send(b'echo "size:"$(stty size)\r')
        t.expect(rb"size:30 90\r\n")
        t.expect(PROMPT)
        # the foreground job inside waits for its SIGWINCH (blocked first: none is missed)
        t.send(b"/usr/bin/python3 -c 'import os, signal as s; "
               b"s.pthread_sigmask(s.SIG_BLOCK, [s.SIGWINCH]); "
               b"print(\"wait\" \"ing\", flush=True); s.sigwait([s.SIGWINCH]); "
               b"print(\"winch:%dx%d\" % os.get_terminal_size()[::-1])'\r")
        t.expect(rb"\r\nwaiting\r\n")
        t.resize(37, 111)
        t.expect(rb"winch:37x111\r\n")
        t.expect(PROMPT)
        t.send(b'echo "size:"$(stty size)\r')
        t.expect(rb"size:37 111\r\n")
        t.expect(PROMPT)
        # ^C interrupts the foreground job inside (it prints once it runs as that job);
        # the shell goes on
        t.send(b"sh -c 'echo \"sta\"\"rted\"; exec sleep 100'\r")
        t.expect(rb"\r\nstarted\r\n")
        t.send(b"\x03")
        t.expect(PROMPT)
        t.send(b'echo "st:"$?\r')
        t.expect(rb"st:130\r\n")
        t.expect(PROMPT)
        t.send(b'echo "alive:"$((6*7))\r')
        t.expect(rb"alive:42")
        t.expect(PROMPT)
        # TIOCSTI and TIOCLINUX are refused even on the sandbox's own terminal (a pty
        # answers TIOCLINUX with ENOTTY when the call is let through)
        t.send(b"/usr/bin/python3 -c 'exec(\"import errno, fcntl\\nfor r in (0x5412, "
               b"0x541C):\\n try: fcntl.ioctl(0, r, bytes(1)); print(\\\"ioctl:%x:ok\\\""
               b" % r)\\n except OSError as e: print(\\\"ioctl:%x:%s\\\" % (r, "
               b"errno.errorcode[e.errno]))\")'\r")
        assert t.expect(rb"ioctl:5412:(\w+)\r\n").group(1) == b"EPERM"
        assert t.expect(rb"ioctl:541c:(\w+)\r\n").group(1) == b"EPERM"
        t.expect(PROMPT)
        t.send(b"exit 3\r")
        assert t.wait() == 3
        # the caller's terminal is back in its own mode (corral set it raw)
        lflag = termios.tcgetattr(t.fd)[3]
        assert lflag & termios.ECHO and lflag & termios.ICANON
    finally:
        t.close()


def test_exit_status_by_signal_and_terminal_restored_after_a_kill():
    """A command killed by a signal: 128+N, and the terminal restored all the same."""
    skip_unless("namespace")
    t = Term(["run", "-t", "--", "sh", "-c", "echo ready; kill -TERM $$"])
    try:
        t.expect(rb"ready")
        assert t.wait() == 128 + 15
        lflag = termios.tcgetattr(t.fd)[3]
        assert lflag & termios.ECHO and lflag & termios.ICANON
    finally:
        t.close()


def test_terminal_restored_when_corral_is_stopped_or_times_out():
    """SIGTERM to corral mid-session, and the wall clock: the run ends, torn down, and the
    caller's terminal is back in its own mode."""
    skip_unless("namespace")
    t = shell("namespace")
    try:
        t.expect(PROMPT)
        assert not termios.tcgetattr(t.fd)[3] & termios.ECHO   # raw while it runs
        os.kill(t.pid, 15)
        assert t.wait() == 130
        assert b"the sandbox was torn down" in t.seen
        lflag = termios.tcgetattr(t.fd)[3]
        assert lflag & termios.ECHO and lflag & termios.ICANON
    finally:
        t.close()
    t = Term(["run", "-t", "--timeout", "2s", "--", "sleep", "100"])
    try:
        assert t.wait() == 124
        lflag = termios.tcgetattr(t.fd)[3]
        assert lflag & termios.ECHO and lflag & termios.ICANON
    finally:
        t.close()


def test_a_terminal_stdin_without_tty_gets_a_one_line_notice():
    skip_unless("namespace")
    t = Term(["run", "--", "sh", "-c", "read x; echo read:$?"], stderr_pipe=True)
    try:
        t.expect(rb"read:1")   # the command read end of file, not the terminal
        assert t.wait() == 0
        err = b""
        while True:
            chunk = os.read(t.err_r, 65536)
            if not chunk:
                break
            err += chunk
    finally:
        t.close()
    lines = err.decode().splitlines()
    assert len(lines) == 1, lines
    assert "stdin is a terminal" in lines[0] and "-t" in lines[0]


def test_no_notice_when_stdin_is_not_a_terminal():
    r = subprocess.run([CORRAL, "run", "--", "true"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.parametrize("tier", ALL_TIERS)
def test_api_tty_result_is_the_terminal_stream(tier):
    """Sandbox.exec(tty=True): input typed from bytes, one stream in Result.stdout (the
    command's stderr included), stderr empty, the cap on what is kept."""
    skip_unless(tier)
    import corral

    with corral.Sandbox({"isolation": tier, "limits": {"output": "4K"}}) as sb:
        r = sb.exec(["sh", "-c", "read line; echo got:$line; echo to-stderr >&2; "
                                 "test -t 0 && test -t 2 && echo both-ttys"],
                    stdin=b"hello\n", tty=True, tty_size=(40, 120))
        assert r.verdict == "ok", r
        assert "got:hello" in r.stdout and "to-stderr" in r.stdout
        assert "both-ttys" in r.stdout
        assert r.stderr == "" and not r.stdout_truncated
        shown = []
        r = sb.exec(["sh", "-c", "stty size; head -c 100000 /dev/zero | tr '\\0' x"],
                    tty=True, tty_size=(40, 120), on_stdout=shown.append)
        assert r.stdout.startswith("40 120") and len(r.stdout) == 4096
        assert r.stdout_truncated
        assert any(e["limit"] == "output" for e in r.events if e["kind"] == "limit")
        assert len(b"".join(shown)) >= 100000   # what was shown is not capped
