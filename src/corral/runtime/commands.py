"""Commands of a live sandbox: `sb.commands.run(...)`, background handles, `list()`.

    r = sb.commands.run("echo hi > /scratch/a; cat /scratch/a")        # a Result
    h = sb.commands.run(["python3", "-m", "http.server", "8000"], background=True,
                        on_stdout=print)
    h.pid                                  # its pid inside the sandbox
    h.send_stdin(b"..."); h.close_stdin()
    h.kill(); r = h.wait()                 # its own Result, verdict "killed"

Each command is started from the host into the sandbox's namespaces (linux/enter.py) in a
cgroup of its own below the sandbox's: its timeout, cpu_time and output cap are its own,
while memory, pids and scratch hold for the sandbox as a whole. A foreground command's
default timeout is the policy's limits.timeout; a background command's is the sandbox's
life. A process a command leaves behind (`server > log 2>&1 &`) keeps running after it in
that cgroup until it exits or the sandbox ends; one that still holds the command's stdout
or stderr is killed DRAIN_GRACE_S after the command exits (supervise.py).
"""

from __future__ import annotations

import os
import threading
import time

from .._record import Record
from ..audit import record as _audit
from ..backends.base import ExecLimits
from ..backends.host.finish import finish
from ..errors import UsageError
from ..linux.shellexec import as_shell_status
from ..linux.supervise import ExecFailed, LoopWatch, Outcome, Stream, decode_status, supervise

#: bounds on what a caller hands in (a command line, its environment)
MAX_ARGV_BYTES = 1 << 20
MAX_ENV = 1024
#: a background command without a timeout runs until the sandbox ends; supervise() still
#: needs a deadline: this far away (epoll's millisecond timeout must fit in an int)
NO_DEADLINE_S = 1e6


class CommandInfo(Record):
    """One entry of `sb.commands.list()`: a command still running, or a process a
    finished command left behind (`detached`)."""

    pid: int                     # inside the sandbox (the command's, or the first left)
    cmd: tuple[str, ...]
    background: bool
    started: float               # time.time()
    detached: bool = False
    pids: tuple[int, ...] = ()   # host pids of every process in its cgroup


def argv_of(cmd) -> list[str]:
    """A shell command line (run by /bin/sh -c) or an argv list, checked."""
    if isinstance(cmd, str):
        argv = ["/bin/sh", "-c", cmd]
    elif isinstance(cmd, (list, tuple)) and cmd and all(isinstance(a, str) for a in cmd):
        argv = list(cmd)
    else:
        raise UsageError("cmd must be a command line (str) or a non-empty list of str",
                         field="cmd")
    if any("\0" in a for a in argv) or sum(len(a) for a in argv) > MAX_ARGV_BYTES:
        raise UsageError(f"cmd may not contain NUL bytes nor exceed {MAX_ARGV_BYTES} bytes",
                         field="cmd")
    if not all(_bytes_ok(a) for a in argv):
        raise UsageError(f"cmd {NO_BYTE_WHY}", field="cmd")
    return argv


NO_BYTE_WHY = ("holds a lone surrogate that stands for no byte (only U+DC80-U+DCFF do: a "
               "byte that is not UTF-8, as files.list gives it): send text")


def _bytes_ok(s: str) -> bool:
    """Whether s is bytes again with os.fsencode: a lone surrogate outside U+DC80-U+DCFF
    (no surrogate escape) stands for no byte of an argv or env."""
    try:
        s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def env_of(base: dict[str, str], extra) -> dict[str, str]:
    env = dict(base)
    if extra is None:
        return env
    if not isinstance(extra, dict) or len(extra) > MAX_ENV:
        raise UsageError(f"env must be a dict of at most {MAX_ENV} str: str",
                         field="env")
    for k, v in extra.items():
        if not (isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                and "\0" not in k + v):
            raise UsageError(f"env: {k!r} is not NAME (no '=', no NUL) = str value",
                             field="env")
        if not _bytes_ok(k + v):
            raise UsageError(f"env: {k!r} {NO_BYTE_WHY}", field="env")
        env[k] = v
    return env


def _seconds(value, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value > NO_DEADLINE_S:
        raise UsageError(f"{field} must be seconds > 0 (at most {NO_DEADLINE_S:g}), "
                         f"not {value!r}", field=field)
    return float(value)


class CommandHandle:
    """A command started inside a live sandbox. Background commands are watched by a
    thread of their own; `wait()` returns the command's Result once it has exited."""

    def __init__(self, owner, argv: list[str], *, timeout: float | None, on_stdout,
                 on_stderr, background: bool, on_exit=None, stream: bool = False) -> None:
        self._owner = owner
        self.cmd = tuple(argv)
        self.background = background
        self.started = time.time()
        self.pid = 0            # inside the sandbox
        self.host_pid = 0
        self._timeout = timeout
        self._on_stdout, self._on_stderr = on_stdout, on_stderr
        self._stdin_w = -1
        self._stdin_lock = threading.Lock()
        self._result = None
        self._done = threading.Event()
        self._started = None
        self._thread: threading.Thread | None = None
        #: the sandbox's teardown event, when the sandbox ended while this ran
        self._end_event: dict | None = None
        self._killed = False
        #: send_signal() was used: a signal death is then reported as it is, never as
        #: the shell would report its child's (a /bin/sh -c line run without the shell)
        self._signalled = False
        self._on_exit = on_exit
        #: a stream command (Commands.stream): output only to the callbacks, uncapped;
        #: no CPU limit of its own (its caller bounds what it asks of it)
        self._stream = stream
        self._pidfd = -1
        #: its end was seen by the sandbox (runtime/live.py), its cgroup released or kept
        #: as lingering: kill() no longer kills that cgroup (it may be another's now)
        self._released = False
        self._pidfd_lock = threading.Lock()   # a closed fd's number is never signalled
        #: its record in the audit store (corral runs, corral logs ID)
        self.run_id = _audit.new_id()
        self._stdin_data = None

    # -- the public face --
    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None):
        """The command's Result, once it has exited (with every output chunk passed to the
        callbacks). Raises TimeoutError if `timeout` seconds pass first (it keeps running)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"command {self.pid} still running after {timeout}s")
        return self._result

    def kill(self) -> None:
        """SIGKILL the command and every process it started (its cgroup), also those it
        left running after it exited."""
        started = self._started
        if started is None:
            return
        if self.running:
            self._killed = True
            lock = getattr(self._owner, "_lock", None)
            if lock is None:
                started.cgroup.kill_all()
                return
            # under the sandbox's lock, which its end's release of the cgroup takes: once
            # released, the cgroup may serve the next command's entrant, never killed here
            with lock:
                if not self._released:
                    started.cgroup.kill_all()
                    return
        self._owner._kill_left(self)

    def send_signal(self, sig: int) -> bool:
        """Send `sig` to the command's own process (not the processes it started), through
        a pidfd opened while it could not have been reaped: never a recycled pid. False once
        it has exited."""
        import _signal

        # a tier whose command's host process is not the command (gvisor: runsc exec,
        # which forwards no signal and dies of one) signals the command inside itself
        inside = getattr(getattr(self._started, "cgroup", None), "signal_command", None)
        if inside is not None:
            if not self.running:
                return False
            inside(sig)
            return True
        with self._pidfd_lock:
            fd = self._pidfd
            if fd < 0 or not self.running:
                return False
            self._signalled = True
            try:
                _signal.pidfd_send_signal(fd, sig)
            except (ProcessLookupError, OSError):
                return False
            return True

    def send_stdin(self, data: bytes | str, timeout: float | None = None) -> None:
        """Write to the command's stdin (a pipe; a background command's only). Blocks
        while the pipe is full, at most `timeout` seconds if given (then TimeoutError,
        with part of data perhaps written). Raises BrokenPipeError once the command
        closed it."""
        if isinstance(data, str):
            data = data.encode()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._stdin_lock:
            if self._stdin_w < 0:
                raise BrokenPipeError("the command's stdin is closed")
            view = memoryview(data)
            if deadline is None:
                while view:
                    view = view[os.write(self._stdin_w, view):]
                return
            import select

            os.set_blocking(self._stdin_w, False)
            try:
                while view:
                    try:
                        view = view[os.write(self._stdin_w, view):]
                        continue
                    except BlockingIOError:
                        pass
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("the command stopped reading its stdin")
                    p = select.poll()
                    p.register(self._stdin_w, select.POLLOUT)
                    p.poll(min(left, 1.0) * 1000 + 1)
            finally:
                os.set_blocking(self._stdin_w, True)

    def close_stdin(self) -> None:
        with self._stdin_lock:
            if self._stdin_w >= 0:
                os.close(self._stdin_w)
                self._stdin_w = -1

    def __repr__(self) -> str:
        state = "running" if self.running else self._result.verdict
        return f"<CommandHandle pid={self.pid} {state} {list(self.cmd)!r:.60}>"

    # -- the owner's side --
    def _run(self, started, stdin_w: int = -1, on_start=None, watch: bool = True) -> None:
        self._started = started
        self.host_pid, self.pid = started.pid, started.ns_pid
        self._stdin_w = stdin_w
        if self.background:
            try:   # opened while it could not be reaped: its own pid, never a recycled one
                own = getattr(started, "pidfd", -1)
                self._pidfd = os.dup(own) if own >= 0 else os.pidfd_open(started.pid)
            except OSError:
                self._pidfd = -1
            self._thread = threading.Thread(target=self._watch, daemon=True,
                                            name=f"corral-cmd-{self.pid}")
            self._thread.start()
            if on_start is not None:
                on_start(self)
            return
        if on_start is not None:
            try:
                on_start(self)
            except BaseException:     # nobody would wait for it: not left running
                self._killed = True
                started.cgroup.kill_all()
                self._watch()
                raise
        if watch:
            self._watch()

    def _failed(self, e: ExecFailed) -> None:
        """Its exec failed inside: the Result says so (127/126), nothing ran."""
        lim = ExecLimits.from_plan(self._owner.plan)
        cap = lim.cap
        out = Outcome()
        out.status = 0
        out.stdout, out.stderr = Stream(cap, None), Stream(cap, None)
        self._result = finish(out, exit_code=None, sig=None, events=self._owner._events_copy(),
                              usage=_usage(out, None)[0], oom_kills=0, wall=0, cpu=0,
                              memory=lim.memory, cap=cap,
                              isolation=self._owner.isolation, failed=(self.cmd[0], e))
        if self._on_stderr is not None:
            self._on_stderr(self._result.stderr.encode())
        self._record()
        self._done.set()
        if self._on_exit is not None:
            self._on_exit(self._result)

    def _record(self) -> None:
        if self._stream or self._result is None:
            return     # a run_code interpreter: its cells are not commands
        owner = self._owner
        learner = getattr(owner, "_learner", None)
        if learner is not None:          # learn mode (runtime/learn.py)
            learner.add(self._result)
        origin = getattr(owner, "_audit_origin", None) or _audit.origin()
        _audit.record_run(self.run_id, self.started, self._result, policy=owner.policy,
                          plan=owner.plan, argv=list(self.cmd), isolation=owner.isolation,
                          origin=origin, sandbox=getattr(owner, "id", None),
                          kind="command", stdin=self._stdin_data,
                          receipt=origin[0] in ("service", "e2b"))

    def _watch(self) -> None:
        outcome = error = None
        try:
            s = self._started
            outcome = supervise(s.pid, s.out_r, s.err_r, **self._watch_args())
        except BaseException as e:  # noqa: BLE001 - raised by _after, once it is done
            error = e
        self._after(outcome, error)

    def _watch_on(self, loop, then, defer=None) -> None:
        """A foreground command's watch, as _watch's, driven by the event loop `loop`
        instead of a thread (corral serve's lean exec path: service/fastexec.py): its
        pipes and pidfd readers of the loop, its limits timers of it, its Result made
        there too, or in a thread of its own when it waits for the proxy's events (a
        connection of the command still open: _net_for's wait; learn mode). Returns at
        once; then(result, error) once the command is done (error: what _watch would
        have raised), from the loop or that thread. `defer(fn)`: on the loop, what need
        not come before the Result is answered (its audit record queued, the sandbox's
        watchdog woken: each wakes a thread, which takes the GIL) is handed to it."""
        def over(outcome, error) -> None:
            if error is None and self._owner._net_waits(self):
                threading.Thread(target=finish, args=(outcome, None, None), daemon=True,
                                 name=f"corral-cmd-{self.pid}").start()
            else:
                finish(outcome, error, defer)

        def finish(outcome, error, defer) -> None:
            try:
                self._after(outcome, error, defer)
            except BaseException as e:  # noqa: BLE001 - the caller's to raise
                then(None, e)
                return
            then(self._result, None)

        s = self._started
        try:
            # the entrant's exit (before_wait) is waited for by the loop too
            LoopWatch(loop, over, s.pid, s.out_r, s.err_r, **self._watch_args(),
                      before_fd=getattr(s, "before_fd", -1))
        except BaseException as e:  # noqa: BLE001 - as _watch: done, then said
            finish(None, e, defer)

    def _after(self, outcome, error, defer=None) -> None:
        """What follows the watch of the command (`outcome`, or the `error` it raised):
        its end told to the sandbox, its Result made and recorded, the handle done;
        raises `error` once done. `defer`: see _watch_on."""
        try:
            try:
                ended = self._ended_now(outcome)
            finally:
                if error is not None:
                    raise error
            self._result = self._result_of(outcome, *ended)
            if defer is None:
                self._record()
            else:
                defer(self._record)
        finally:
            self._owner._net_drop(self)    # if it failed before the Result took its events
            with self._pidfd_lock:
                fd, self._pidfd = self._pidfd, -1
                if fd >= 0:
                    os.close(fd)
            self._done.set()
            # after the Result: the next entrant (a fork) comes now
            if defer is None:
                self._owner._wake()
            else:
                defer(self._owner._wake)
        if self._on_exit is not None:
            self._on_exit(self._result)

    def _watch_args(self) -> dict:
        """supervise()'s arguments but the pid and pipes, for this command."""
        owner, s = self._owner, self._started
        lim = _limits_of(owner)
        cap, cpu = lim.cap, lim.cpu
        wall = lim.wall if self._timeout is None else self._timeout
        if self._timeout is None and self.background:
            wall = NO_DEADLINE_S
        keep = cap
        cpu_now = s.cgroup.cpu_seconds
        if self._stream:
            keep, cpu, cpu_now = None, NO_DEADLINE_S, None
        self._wall_cpu = wall, cpu
        return dict(timeout=wall, cpu_time=cpu, cpu_seconds=cpu_now, output_cap=keep,
                    on_stdout=self._on_stdout, on_stderr=self._on_stderr,
                    kill=s.cgroup.kill_all, started=time.monotonic(),
                    before_wait=s.before_wait, pidfd=getattr(s, "pidfd", -1),
                    exit_status=getattr(s, "exit_status", None))

    def _ended_now(self, outcome):
        """Once the watch is over (also after it failed: `outcome` None): the command's
        stdin and pidfd closed, its entrant reaped, its end told to the sandbox; its
        (usage, oom_kills, exit_code, sig)."""
        owner, s = self._owner, self._started
        usage, oom_kills = None, 0
        self.close_stdin()
        fd = getattr(s, "pidfd", -1)
        if fd >= 0:
            s.pidfd = -1
            os.close(fd)
        if s.before_wait is not None:
            s.before_wait()      # the entrant, if supervise() did not get to it
        final = getattr(s, "final_status", None)   # the tier's word on the status
        if final is not None and outcome is not None and outcome.status is not None:
            outcome.status = final(outcome.status)
        if outcome is not None:
            usage, oom_kills = _usage(outcome, s.cgroup)
        # a tier whose command is a runtime's client (runsc exec) reports a signal
        # as 128+N
        by_exit = getattr(s, "signal_exit_codes", False)
        exit_code, sig = decode_status((outcome.status or 0) if outcome else 0,
                                       signal_exit_codes=by_exit)
        stray = (outcome is not None and not outcome.timed_out and not self._killed
                 and not oom_kills and sig == 9)
        owner._command_ended(self, stray)
        if sig is not None and getattr(s, "direct", False) and not (
                outcome.timed_out or self._killed or self._signalled
                or owner._ended is not None):
            # a /bin/sh -c line run without the shell (linux/shellexec.py): its own
            # death by a signal is told as the shell tells its child's
            status, text = as_shell_status(outcome.status)
            exit_code, sig = decode_status(status, signal_exit_codes=False)
            if text:
                outcome.stderr.feed(text)
        return usage, oom_kills, exit_code, sig

    def _result_of(self, outcome, usage, oom_kills, exit_code, sig):
        owner, s = self._owner, self._started
        wall, cpu = self._wall_cpu
        lim = _limits_of(owner)
        if getattr(owner, "_learner", None) is not None:
            # learn mode: also a connection the proxy accepted only after the command's
            # end (it connected and exited at once) is in the Result the learner reads
            owner._net_settle()
        # the proxy writes a connection's event once it has seen the close, which can
        # come after the command's end: it waits for connections still open (live.py)
        events = owner._events_copy() + owner._net_for(self)
        refused = getattr(s, "syscall_events", None)   # observed refused syscalls
        if refused is not None:
            events += refused()
        result = finish(outcome, exit_code=exit_code, sig=sig, events=events,
                        usage=usage, oom_kills=oom_kills, wall=wall, cpu=cpu,
                        memory=lim.memory, cap=lim.cap,
                        isolation=owner.isolation)
        hook = getattr(s, "on_result", None)   # a tier's own account of how it ended (wasm)
        if hook is not None:
            result = hook(result)
        if self._end_event is not None:
            result.events.append(dict(self._end_event))
        return result


def _limits_of(owner) -> ExecLimits:
    """The owner's plan's ExecLimits (no timeout of the command's own), made once per plan:
    every command of a live sandbox reads them."""
    plan = owner.plan
    kept = getattr(owner, "_exec_limits", None)
    if kept is None or kept[0] is not plan:
        kept = (plan, ExecLimits.from_plan(plan))
        try:
            owner._exec_limits = kept
        except AttributeError:   # an owner with __slots__: made each time
            pass
    return kept[1]


def _usage(outcome, cg):
    from ..result import Usage

    usage = Usage(wall_s=round(outcome.wall_s, 6))
    if cg is None:
        return usage, 0
    try:
        u = cg.usage()
    except OSError:
        return usage, 0
    usage.cpu_s = round(u.cpu_s, 6) if u.cpu_s is not None else None
    usage.memory_peak_bytes = u.memory_peak_bytes
    return usage, u.oom_kills or 0


class Commands:
    """`sb.commands` of a live sandbox."""

    def __init__(self, owner) -> None:
        self._owner = owner

    def run(self, cmd, *, env: dict[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | int | None = None, timeout: float | None = None,
            on_stdout=None, on_stderr=None, background: bool = False,
            tty_fd: int | None = None, on_start=None, user: str | None = None):
        """Run a command line (str, by /bin/sh -c) or an argv list inside. On the namespace
        tier a line that is one plain command is exec'd without the shell when that gives
        what the shell would (linux/shellexec.py; docs/sessions.md).

        user: None or "root", the sandbox's root; "user", the unprivileged account of a
        sandbox made with one (Sandbox.create(user_account=True), the namespace tier as
        root): uid 1000 inside, HOME /home/user (refused in a sandbox without one).

        Foreground (default): waits and returns its Result; stdin None (/dev/null),
        bytes, or a readable fd; timeout defaults to the policy's limits.timeout.
        background=True: returns a CommandHandle at once; its stdin is a pipe
        (send_stdin/close_stdin; `stdin` bytes are written to it first); timeout
        defaults to none (it runs until it exits or the sandbox ends).
        on_stdout/on_stderr get each chunk of bytes as it arrives, from the caller's
        thread (foreground) or the handle's (background).

        tty_fd (for sb.pty): a terminal's slave, the command's stdin, stdout, stderr and
        controlling terminal; its output is then read from the master by the caller (the
        Result's stdout and stderr are empty), `stdin` must be None.

        on_start(handle): called once the command runs, before its output is read, with
        its CommandHandle (pid, kill()): how a foreground command waited for in one thread
        is killed from another (corral serve's foreground commands). Not called when its
        exec failed (the Result says so)."""
        timeout = _seconds(timeout, "timeout")
        return self._run(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                         on_stdout=on_stdout, on_stderr=on_stderr, background=background,
                         tty_fd=tty_fd, on_start=on_start, user=user)

    def _begin(self, cmd, *, env: dict[str, str] | None = None, cwd: str | None = None,
              stdin: bytes | None = None, timeout: float | None = None, on_stdout=None,
              on_stderr=None):
        """A foreground command (as run's) for an event loop, which waits for nothing:
        its request sent to the sandbox's prepared entrant (after the owner's
        _quick_start()), its answer not waited for. Returns (fd, pending): once fd is
        readable, _started(pending) takes the answer; or None, nothing started, when the
        sandbox is busy (its lock held: the caller runs the command in a thread)."""
        timeout = _seconds(timeout, "timeout")
        owner = self._owner
        owner._check_open()
        argv = argv_of(cmd)
        run_env = env_of(owner._command_env(), env)
        cwd = owner._command_cwd(cwd)
        handle = CommandHandle(owner, argv, timeout=timeout, on_stdout=on_stdout,
                               on_stderr=on_stderr, background=False)
        if isinstance(stdin, (bytes, bytearray)):
            handle._stdin_data = bytes(stdin)
        stdin_fd, close_fd, _ = _stdin(stdin, False)
        try:
            got = owner._start_send(handle, argv, run_env, cwd, stdin_fd)
        finally:
            if close_fd:
                os.close(stdin_fd)
        if got is None:
            return None
        fd, sent = got
        return fd, (handle, sent)

    def _started(self, pending, on_start=None) -> CommandHandle:
        """_begin()'s command once its fd is readable: its CommandHandle (on_start called
        as run's), not watched (CommandHandle._watch_on watches it), or done at once
        when its exec failed (its Result says so)."""
        handle, sent = pending
        try:
            s = self._owner._start_answer(handle, sent)
        except ExecFailed as e:
            handle._failed(e)
            return handle
        handle._run(s, -1, on_start, watch=False)
        return handle

    def stream(self, cmd, *, on_stdout, on_stderr, on_exit, cwd: str | None = None,
               env: dict[str, str] | None = None, label=None) -> CommandHandle:
        """A background command for a long-lived peer such as a run_code interpreter
        (runtime/channels.py): its output goes to on_stdout/on_stderr only, every byte of
        it (the caller bounds what it keeps: nothing is kept here, so limits.output does
        not end it), it has no timeout and no CPU limit of its own (the caller bounds
        each request it makes of it; limits.memory, pids and cpus hold sandbox-wide as
        for every command), and on_exit(Result) is called from its thread once it ended.
        Its stdin is a pipe (send_stdin with a timeout); send_signal, kill. `label`: the
        cmd that commands.list() shows (a runner's whole source is no name)."""
        return self._run(cmd, env=env, cwd=cwd, stdin=None, timeout=None,
                         on_stdout=on_stdout, on_stderr=on_stderr, background=True,
                         tty_fd=None, on_exit=on_exit, stream=True, label=label)

    def _run(self, cmd, *, env, cwd, stdin, timeout, on_stdout, on_stderr, background,
             tty_fd, on_exit=None, stream=False, label=None, on_start=None, user=None):
        owner = self._owner
        owner._check_open()
        argv = argv_of(cmd)
        uid = _user_id(owner, user)
        base = owner._command_env()
        if uid is not None:   # the account's own HOME, USER and LOGNAME
            base = {**base, "HOME": "/home/user", "USER": "user", "LOGNAME": "user"}
        run_env = env_of(base, env)
        cwd = owner._command_cwd(cwd)
        handle = CommandHandle(owner, argv, timeout=timeout, on_stdout=on_stdout,
                               on_stderr=on_stderr, background=background, on_exit=on_exit,
                               stream=stream)
        if label is not None:
            handle.cmd = tuple(str(a) for a in label)
        if isinstance(stdin, (bytes, bytearray)):
            handle._stdin_data = bytes(stdin)
        if tty_fd is not None:
            if stdin is not None:
                raise UsageError("stdin goes through the terminal with tty_fd", field="stdin")
            stdin_fd, close_fd, stdin_w = tty_fd, False, -1
        else:
            stdin_fd, close_fd, stdin_w = _stdin(stdin, background)
        try:
            started = owner._start_command(handle, argv, run_env, cwd, stdin_fd, tty_fd,
                                           cpu_seconds=NO_DEADLINE_S if stream else None,
                                           **({"user": uid} if uid is not None else {}))
        except ExecFailed as e:
            if stdin_w >= 0:
                os.close(stdin_w)
            handle._failed(e)
            return handle if background else handle._result
        except BaseException:
            if stdin_w >= 0:
                os.close(stdin_w)
            raise
        finally:
            if close_fd:
                os.close(stdin_fd)
        handle._run(started, stdin_w, on_start)
        if background and isinstance(stdin, (bytes, bytearray, memoryview)):
            try:   # after _run: its thread drains the output meanwhile
                handle.send_stdin(bytes(stdin))
            except BrokenPipeError:
                pass
        return handle if background else handle._result

    def list(self) -> list[CommandInfo]:
        """The commands running now, then processes finished commands left behind."""
        return self._owner._list_commands()


def _stdin(stdin, background: bool) -> tuple[int, bool, int]:
    """(fd for the command's stdin, whether to close it here, our write end or -1)."""
    if background:
        if isinstance(stdin, int) and not isinstance(stdin, bool):
            return stdin, False, -1
        if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview)):
            raise TypeError("stdin must be None, bytes or a file descriptor")
        r, w = os.pipe()
        return r, True, w
    from .sandbox import _stdin_fd

    fd, close = _stdin_fd(stdin)
    if fd is None:
        return _devnull(), False, -1
    return fd, close, -1


_DEVNULL = [-1, 0]    # one read-only /dev/null for every command's stdin, and its owner pid


def _devnull() -> int:
    if _DEVNULL[1] != os.getpid():
        _DEVNULL[:] = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), os.getpid()]
    return _DEVNULL[0]


__all__ = ["CommandHandle", "CommandInfo", "Commands"]


def _user_id(owner, user) -> int | None:
    """The uid inside for commands.run(user=): None for the sandbox's root."""
    if user is None or user == "root":
        return None
    uid = getattr(owner, "user_uid", None)
    if user != "user":
        raise UsageError(f"user {str(user)[:32]!r}: a command runs as \"root\" (the "
                         "sandbox's own root) or \"user\" (its unprivileged account)",
                         field="user")
    if uid is None:
        raise UsageError("user \"user\": this sandbox has no unprivileged account; create "
                         "it with Sandbox.create(user_account=True) on the namespace tier "
                         "(corral as root)", field="user")
    return uid
