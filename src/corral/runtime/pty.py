"""Terminals inside a sandbox (`sb.pty`): an interactive shell driven by a program.

    term = sb.pty.create(cols=100, rows=30, on_data=lambda b: print(b.decode(), end=""))
    term.send_input(b"ls -l\\r")
    term.resize(120, 40)
    term.send_input(b"exit\\r")
    result = term.wait()           # the command's Result (its stdout: what the pty showed)

Each terminal is a command with a pty pair of its own inside the sandbox (linux.tty: on the
namespace tier from the sandbox's own devpts instance, made its controlling terminal by
setsid --ctty; on gvisor, runsc's console), never the caller's terminal. TIOCSTI and
TIOCLINUX stay refused by the tiers' seccomp rules. Input goes through a pipe the relay
thread copies to the pty's master (so send_input waits when the terminal is not reading,
rather than losing keys); output reaches on_data from the relay thread, as it comes.

A terminal is started by a `starter`, a callable (argv, term, timeout) -> Started:
 - it runs argv inside with `term` (a linux.tty.Terminal whose stdin is the input pipe) as
   LiveSandbox.exec(tty=term) does: the tier makes the pty (term.open(devpts), or
   term.console_socket(dir) for runsc), gives the slave to the command as fds 0-2 and
   controlling terminal, and calls term.start() once the command runs;
 - when the command has ended it calls term.finish() and puts its text in the Result's
   stdout (stderr ""), as Sandbox._exec_tty does;
 - Started.wait(timeout) -> Result (TimeoutError while it runs; None waits), and
   optionally Started.kill(), used by PtyHandle.kill instead of the session signal.
`for_sandbox` gives one for today's Sandbox: a tty exec in a thread of its own. A live
sandbox gives its own: a command entered in its namespaces with the Terminal, its kill()
that command's (see docs/sessions.md).
"""

from __future__ import annotations

import os
import threading

from ..errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Self

    from ..result import Result

#: the command a terminal runs by default: an interactive login-less bash
DEFAULT_CMD = ("/bin/bash", "-i")
#: after kill(): how long wait() gives the command to go
KILL_WAIT_S = 30.0


def _size(cols: int, rows: int) -> tuple[int, int]:
    for name, v in (("cols", cols), ("rows", rows)):
        if not isinstance(v, int) or not 1 <= v <= 65535:
            raise UsageError(f"{name} must be a whole number from 1 to 65535, not {v!r}",
                             field=name)
    return rows, cols


def command_line(cmd, env: Mapping[str, str] | None, cwd: str | None) -> list[str]:
    """The argv a terminal runs: cmd (a shell command line, run by /bin/sh -c, or an argv
    list; "bash" is an interactive bash), with env and cwd applied by /usr/bin/env inside
    (-C DIR, NAME=VALUE...) for a starter that takes neither."""
    if cmd is None or cmd == "bash":
        argv = list(DEFAULT_CMD)
    elif isinstance(cmd, str):
        argv = ["/bin/sh", "-c", cmd]
    else:
        argv = [str(a) for a in cmd]
        if not argv:
            raise UsageError("cmd is an empty list; give a command", field="cmd")
    if not env and cwd is None:
        return argv
    pre = ["/usr/bin/env"]
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd or "\0" in cwd:
            raise UsageError("cwd is a directory path inside the sandbox", field="cwd")
        pre += ["-C", cwd]
    pre.append("--")   # no option after this; NAME=VALUE words, then the command
    for k, v in (env or {}).items():
        if not k or "=" in k or "\0" in k or "\0" in str(v):
            raise UsageError(f"env name {k!r}: a name without '=' or NUL, and a value "
                             "without NUL", field="env")
        pre.append(f"{k}={v}")
    if "=" in argv[0]:   # env would take it for one more NAME=VALUE
        raise UsageError(f"a command named {argv[0]!r} (with '=') cannot be given env or "
                         "cwd here", field="cmd")
    return [*pre, *argv]


class PtyHandle:
    """One terminal: send_input, resize, kill, wait."""

    def __init__(self, term, input_w: int, started) -> None:
        self._term = term
        self._input_w = input_w
        self._started = started
        self._lock = threading.Lock()
        self._result: Result | None = None

    @property
    def pid(self) -> int | None:
        """The host pid of the terminal's session leader (see kill), or None."""
        return self._term.session()

    @property
    def pid_inside(self) -> int | None:
        """The pid of the terminal's command inside the sandbox, where the starter knows it
        (a live sandbox's); None otherwise."""
        return getattr(self._started, "pid_inside", None)

    def send_input(self, data: bytes | str) -> None:
        """Type data into the terminal (str: UTF-8). Waits while the terminal is not taking
        input (its buffers full). BrokenPipeError once the command has ended."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        view = memoryview(data)
        with self._lock:
            if self._input_w < 0:
                raise BrokenPipeError("the terminal has ended")
            while view:
                view = view[os.write(self._input_w, view):]

    def resize(self, cols: int, rows: int) -> None:
        """A new window size; the command's foreground group gets SIGWINCH."""
        self._term.resize(_size(cols, rows))

    def kill(self) -> None:
        """End the command: the starter's kill where it has one (a live sandbox's command),
        else SIGKILL to the terminal's session leader, found with TIOCGSID on the master
        and signalled through a pidfd after checking it is still that terminal's session
        (a recycled pid is never hit). That leader is the command itself on the namespace
        tier; on gvisor it is runsc's sandbox process, which a tty exec runs for itself
        alone (so the exec ends, as it should; a live gVisor sandbox must give a kill())."""
        kill = getattr(self._started, "kill", None)
        if kill is not None:
            kill()
            return
        import _signal

        sid = self._term.session()
        if sid is None:
            raise UsageError("this terminal has no session on the host and its starter no "
                         "kill(): send it exit", field="kill")
        try:
            fd = os.pidfd_open(sid)
        except ProcessLookupError:
            return   # gone already
        try:
            if self._term.session() == sid:   # still our terminal's: the pidfd is its
                try:
                    _signal.pidfd_send_signal(fd, 9)
                except ProcessLookupError:
                    pass
        finally:
            os.close(fd)

    def wait(self, timeout: float | None = None) -> Result:
        """The command's Result once it has ended (stdout: what the terminal showed, up to
        limits.output; stderr empty). TimeoutError if it has not ended in timeout s."""
        if self._result is None:
            self._result = self._started.wait(timeout)
            with self._lock:
                if self._input_w >= 0:
                    os.close(self._input_w)
                    self._input_w = -1
        return self._result

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if self._result is None:
            try:
                self.kill()
            except UsageError:
                pass
            self.wait(KILL_WAIT_S)


class _ThreadStarted:
    """A Sandbox.exec(tty=...) in a thread: wait() joins it."""

    def __init__(self, run: Callable[[], Result]) -> None:
        self._result = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(run,), name="corral-pty",
                                        daemon=True)
        self._thread.start()

    def _run(self, run) -> None:
        try:
            self._result = run()
        except BaseException as e:  # noqa: BLE001 - re-raised by wait()
            self._error = e

    def wait(self, timeout: float | None = None) -> Result:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the terminal's command is still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


class Pty:
    """`sb.pty`: makes terminals in one sandbox through a starter (see the module's
    docstring)."""

    def __init__(self, starter, *, output_cap: int) -> None:
        self._starter = starter
        self._cap = output_cap

    @classmethod
    def for_sandbox(cls, sb) -> Pty:
        """For today's corral.Sandbox: each terminal a tty exec of its own in a thread
        (Sandbox.exec(tty=...) semantics: the policy's limits, a fresh set of namespaces
        sharing the sandbox's scratch)."""
        from ..plan import OutputCap

        def start(argv, term, timeout):
            sb.open()
            live = sb._live

            def run():
                result = None
                try:
                    result = live.exec(argv, stdin=None, timeout=timeout, tty=term)
                finally:
                    text = term.finish(errors=result is not None)
                if result is not None:
                    result.stdout, result.stdout_truncated = text, term.truncated
                    result.stderr, result.stderr_truncated = "", False
                return result
            return _ThreadStarted(run)

        return cls(start, output_cap=sb.plan.find(OutputCap)[0].bytes)

    def create(self, cols: int = 80, rows: int = 24, cmd=None, *,
               on_data: Callable[[bytes], None] | None = None,
               env: Mapping[str, str] | None = None, cwd: str | None = None,
               timeout: float | None = None) -> PtyHandle:
        """A terminal of cols x rows running cmd (default: an interactive bash; a str is a
        shell command line, a list an argv), on_data called with each chunk it shows.
        timeout: seconds (default: the policy's limits.timeout)."""
        from ..linux.tty import Terminal

        size = _size(cols, rows)
        argv = command_line(cmd, env, cwd)
        input_r, input_w = os.pipe2(os.O_CLOEXEC)
        try:
            term = Terminal(input_r, on_data, self._cap, size)
            started = self._starter(argv, term, timeout)
        except BaseException:
            os.close(input_r)
            os.close(input_w)
            raise
        _close_after(started, input_r)   # the relay reads it until the command has ended
        return PtyHandle(term, input_w, started)


def _close_after(started, fd: int) -> None:
    """Close fd once the command has ended (the relay no longer reads it)."""
    def closer():
        try:
            started.wait(None)
        except BaseException:  # noqa: BLE001, S110 - the handle's wait() reports it
            pass
        os.close(fd)
    threading.Thread(target=closer, name="corral-pty-close", daemon=True).start()
