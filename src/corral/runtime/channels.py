"""The transports a code context runs on (runtime/session.py): a process inside the
sandbox with a byte stream each way.

    start = command_start(live_sandbox)          # a live sandbox's stream commands
    session = CodeSession(sb, start=start)       # session.py; the default is ExecChannel

`CommandChannel` (a live sandbox, any tier behind the LiveSandbox contract): the
interpreter is one `sb.commands.stream(...)` command: its output goes to the context every
byte, bounded per cell by the session and never over the interpreter's life; stdin is a
pipe written with a deadline; an interrupt is a real SIGINT to the interpreter's process
(through a pidfd); kill() SIGKILLs its cgroup, the interpreter and everything it started,
also what it left when it died. The interpreter has no CPU limit of its own: the session
bounds each cell's CPU time (limits.cpu_time) and wall clock (its timeout); memory, pids
and cpus hold sandbox-wide.

`ExecChannel` (a one-shot `corral.Sandbox`, whose every exec is fresh namespaces): the
interpreter as one long Sandbox.exec in a thread; see its docstring for its limits.
"""

from __future__ import annotations

import os
import select
import threading
import time

#: how long kill() waits for the killed interpreter's command to be over
KILL_WAIT_S = 5.0


class Channel:
    """A process inside the sandbox with a byte stream each way: what a context runs on.

    Made by a start function `start(argv, on_stdout, on_stderr, on_exit) -> Channel`;
    on_stdout/on_stderr get each chunk of bytes of the process's stdout/stderr as it comes
    (from any thread), on_exit(description) once when it has ended."""

    def send(self, data: bytes, deadline: float) -> None:
        """Write all of data to the process's stdin by time.monotonic() `deadline`; raises
        OSError (the process is gone) or TimeoutError (it stopped reading)."""
        raise NotImplementedError

    def interrupt(self) -> bool:
        """Deliver SIGINT to the process; False when this channel cannot (the python
        runner is then interrupted in-band, by a frame)."""
        return False

    def interrupt_group(self) -> bool:
        """Deliver SIGINT to the process's process group (a shell and its foreground
        command, as a terminal's ^C does); False when this channel cannot."""
        return False

    def kill(self) -> None:
        """End the process now, whatever it does. Idempotent."""
        raise NotImplementedError


class ExecChannel(Channel):
    """The interpreter as one Sandbox.exec, run in a thread, with a pipe as its stdin.

    The transport of a one-shot corral.Sandbox (each exec fresh namespaces). Its limits: no
    signal from the host (interrupts are in-band), and kill() closes the stdin pipe, which
    the runners answer by exiting at once; a process that survives that (sandboxed code
    that took over the runner) runs until its exec's wall clock (`lifetime`) or the
    sandbox closes. The exec also counts against the policy's limits.cpu_time, summed over
    the context's life."""

    def __init__(self, sandbox, argv, on_stdout, on_stderr, on_exit,
                 lifetime: float = 7 * 86400.0) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._w = w
        self._wlock = threading.Lock()
        # Sandbox.exec passes on only the first limits.output bytes of each stream to its
        # callbacks: past that the interpreter's stream is cut, which must read as an end
        cap = _plan_value(sandbox, "OutputCap", "bytes", 1 << 20)
        seen = [0]

        def out(data: bytes) -> None:
            seen[0] += len(data)
            on_stdout(data)
            if seen[0] >= cap:
                self.kill()
                on_exit(f"reached limits.output ({cap} bytes) on its output stream, which "
                        f"bounds a context's whole life on a one-shot Sandbox (a live one, "
                        f"Sandbox.create, bounds each cell instead): raise "
                        f"limits.output for long sessions")

        def body() -> None:
            how = "ended"
            try:
                res = sandbox.exec(argv, stdin=r, on_stdout=out, on_stderr=on_stderr,
                                   timeout=lifetime)
                how = describe_result(res)
            except BaseException as e:          # noqa: BLE001 - reported, not lost
                how = f"could not run: {e}"
            finally:
                os.close(r)   # only now: exec hands this fd to the process it spawns
                self._close_w()
                on_exit(how)

        self.thread = threading.Thread(target=body, name="corral-code", daemon=True)
        self.thread.start()

    def send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        with self._wlock:
            while view:
                if self._w < 0:
                    raise BrokenPipeError("the interpreter's stdin is closed")
                try:
                    n = os.write(self._w, view)
                    view = view[n:]
                    continue
                except BlockingIOError:
                    pass
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the interpreter stopped reading its input")
                p = select.poll()
                p.register(self._w, select.POLLOUT)
                p.poll(min(left, 1.0) * 1000)

    def _close_w(self) -> None:
        with self._wlock:
            if self._w >= 0:
                os.close(self._w)
                self._w = -1

    def kill(self) -> None:
        self._close_w()


def describe_result(res, killed_by_us: bool = True) -> str:
    """How an interpreter's command ended, from its Result, for the context's error."""
    if res.verdict == "timeout":
        return "was killed at its wall clock or CPU time limit"
    if res.verdict == "oom":
        return "was killed by the memory limit (limits.memory)"
    if res.signal is not None:
        import signal as _signal

        try:
            name = _signal.Signals(res.signal).name
        except ValueError:
            name = f"signal {res.signal}"
        who = "" if killed_by_us else " (not by corral: from inside the sandbox)"
        return f"was killed by {name}{who}"
    tail = res.stderr.strip().splitlines()[-1:] if res.stderr.strip() else []
    why = f": {tail[0][:300]}" if tail else ""
    return f"exited with status {res.exit_code}{why}"


def _plan_value(sandbox, op: str, attr: str, default):
    plan = getattr(sandbox, "plan", None)
    if plan is None:
        return default
    from .. import plan as plan_mod

    found = plan.find(getattr(plan_mod, op))
    return getattr(found[0], attr) if found else default


class CommandChannel(Channel):
    """The interpreter as a stream command of a live sandbox (see the module docstring)."""

    def __init__(self, sandbox, argv, on_stdout, on_stderr, on_exit) -> None:
        self._exit_cb = on_exit
        self._exited = threading.Event()
        self._killing = False
        self.handle = None
        self._sandbox = sandbox
        label = [a if len(a) <= 80 else f"<{len(a)} bytes>" for a in argv]
        self.handle = sandbox.commands.stream(argv, on_stdout=on_stdout,
                                              on_stderr=on_stderr, on_exit=self._ended,
                                              label=label)

    def _ended(self, result) -> None:
        if not self._exited.is_set():
            self._exited.set()
            self._exit_cb(describe_result(result, self._killing))

    def send(self, data: bytes, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the interpreter stopped reading its input")
        self.handle.send_stdin(data, timeout=left)

    def interrupt(self) -> bool:
        return self.handle.send_signal(2)    # SIGINT

    def interrupt_group(self) -> bool:
        """`kill -s INT -- -PGID` run inside the sandbox by the interpreter's own bash
        (the interpreter is its session's and process group's leader: its pid inside is
        the group's id), as a stream command (no audit record, no usage count): the same
        on every tier (gVisor's processes are not the host's). Waits for it, 5 s at most."""
        h = self.handle
        if h is None or not h.running or h.pid <= 1:
            return False
        done = threading.Event()
        got = []

        def ended(result) -> None:
            got.append(result)
            done.set()

        try:
            k = self._sandbox.commands.stream(
                ["bash", "--noprofile", "--norc", "-c", 'kill -s INT -- "-$1"', "corral-int",
                 str(h.pid)], on_stdout=None, on_stderr=None, on_exit=ended,
                label=["corral-interrupt", str(h.pid)])
        except Exception:  # noqa: BLE001 - the sandbox is ending: the caller kills
            return False
        if not done.wait(5.0):
            k.kill()
            return False
        return bool(got) and got[0].exit_code == 0

    def kill(self) -> None:
        h = self.handle
        if h is not None:
            self._killing = True
            h.close_stdin()
            h.kill()
            if threading.current_thread() is not h._thread:   # not from its own thread
                try:      # gone, and off sb.commands.list(), when kill() returns
                    h.wait(KILL_WAIT_S)
                except TimeoutError:
                    pass

    def cpu_seconds(self) -> float | None:
        """CPU time used so far by the interpreter and all it started (its cgroup), or
        None once it has ended or where the tier cannot tell."""
        h = self.handle
        started = getattr(h, "_started", None)
        if started is None or not h.running:
            return None
        fn = getattr(started.cgroup, "cpu_seconds", None)   # None: the tier cannot tell
        try:
            return fn() if fn is not None else None
        except OSError:
            return None


def command_start(sandbox):
    """A CodeSession start function running each interpreter as a stream command of the
    live `sandbox`."""
    def start(argv, on_stdout, on_stderr, on_exit):
        return CommandChannel(sandbox, argv, on_stdout, on_stderr, on_exit)
    return start
