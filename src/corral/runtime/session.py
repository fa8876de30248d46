"""run_code: persistent interpreters ("code contexts") inside a sandbox, E2B-shaped.

    with corral.Sandbox() as sb:
        sb.run_code("import math; x = 2")
        ex = sb.run_code("math.sqrt(x)")
        ex.text                      # '1.4142135623730951' (the last expression's value)
        ex.logs.stdout, ex.error     # [], None

A context is one long-lived interpreter process inside the sandbox: python (an IPython
kernel behind corral's bridge, guest/kernel.py, where the image's python3 has ipykernel;
else corral's own runner, guest/runner.py; both shipped in as `python3 -c SOURCE`: see
session_wire._PY_BOOT), javascript (node, with
corral.guest.runner.js as `node -e SOURCE`) or bash (a plain bash reading NUL-ended cells).
Variables, imports, the working directory and (bash) the environment persist between
cells. Nothing of corral needs to be installed in the image.

Everything the interpreter sends is hostile: it runs the user's code, as the sandbox's
root, and that code can write anything to any fd or replace the runner. So the host
bounds every frame (`max_frame`, 16 MiB by default) and what one execution keeps (logs:
the policy's limits.output per stream; display data: `max_results`), parses strictly
(an unknown message type, a field of the wrong type, a frame over the bound or bytes that
are no frame close the context with a clear error), believes nothing it says about anything
but its own output, and never waits on it without a deadline.

Between cells no output is kept (a context's threads' output is dropped; any other
message then breaks the protocol), and at most `max_pending` bytes of messages wait for the
cell's thread (the channel's thread, and so the interpreter, waits past that).

The process transport is a small interface (`Channel`, runtime/channels.py), made by
`CodeSession(start=...)`: a live sandbox's contexts are its stream commands
(`CommandChannel`: per-cell output and CPU bounds, a real SIGINT, a cgroup kill); a
one-shot Sandbox's run as one long `Sandbox.exec` each (`ExecChannel`, the default).
"""

from __future__ import annotations

import codecs
import collections
import json
import queue
import threading
import time
import uuid

from ..errors import CorralError
from .channels import Channel, ExecChannel, _plan_value
from .execution import (  # noqa: F401 - Logs, MIME_ATTRS: re-exported
    MIME_ATTRS,
    CodeResult,
    Execution,
    ExecutionError,
    Logs,
)
from .session_wire import (  # noqa: F401 - FrameReader, check_message: re-exported
    _BASH_SETUP,
    ENGINES,
    HEADER,
    FrameReader,
    ProtocolError,
    _runner_argv,
    bash_quote,
    check_message,
)

MAX_FRAME = 16 << 20           # bytes of JSON per frame, either way
MAX_RESULTS = 64 << 20         # bytes of display data one execution keeps
INTERRUPT_GRACE = 5.0          # seconds an interrupted cell has to end before its kill
START_TIMEOUT = 30.0           # seconds an interpreter has to say it is ready
MAX_PENDING = 32 << 20         # bytes of messages an interpreter may have waiting for the cell
CPU_POLL_S = 0.1               # how often a cell's CPU time is looked at
LANGUAGES = ("python", "javascript", "bash")


class ContextError(CorralError):
    """A code context cannot be used: it is dead, removed, or its interpreter is missing."""

    kind = "context"
    exit_code = 125


class Context:
    """A code context as the caller sees it: id, language, cwd (None: the sandbox's), and
    `engine`, what runs it once started: "ipykernel" (an IPython kernel: the image's
    python has ipykernel), "runner" (corral's own python runner), "node" or "bash"."""

    __slots__ = ("_want", "cwd", "engine", "id", "language")

    def __init__(self, id: str, language: str, cwd: str | None, want: str = "auto") -> None:
        self.id, self.language, self.cwd = id, language, cwd
        self._want = want            # the engine asked for: "auto", "ipykernel", "runner"
        self.engine = "bash" if language == "bash" else None

    def __eq__(self, other) -> bool:
        return isinstance(other, Context) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Context(id={self.id!r}, language={self.language!r}, cwd={self.cwd!r})"


# --- the transport: runtime/channels.py ------------------------------------------------


class _Inbox:
    """What an interpreter sent, waiting for the cell's thread: at most `most` bytes of it
    (the sender, the channel's thread, then waits, and so does the interpreter on its
    pipe, until the cell's thread has taken some), except once closed."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.items: collections.deque = collections.deque()
        self.size = 0
        self.closed = False
        self.cond = threading.Condition()

    def put(self, item, size: int = 0) -> None:
        with self.cond:
            while size and self.size and self.size + size > self.most and not self.closed:
                self.cond.wait(1.0)
            self.items.append((item, size))
            self.size += size
            self.cond.notify_all()

    def close(self, item) -> None:
        """The last item (never waits); senders waiting go on."""
        with self.cond:
            self.closed = True
            self.items.append((item, 0))
            self.cond.notify_all()

    def get(self, timeout: float):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.items:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty
                self.cond.wait(left)
            item, size = self.items.popleft()
            self.size -= size
            self.cond.notify_all()
            return item


class _Interp:
    """One context's interpreter process and the messages it sent, for one language."""

    def __init__(self, session: CodeSession, ctx: Context) -> None:
        self.session, self.ctx = session, ctx
        self.q = _Inbox(session.max_pending)
        self.dead: str | None = None            # why it is gone, once it is
        self.running = 0                        # the cell id being run, 0 between cells
        self.lock = threading.Lock()            # one cell at a time
        self.channel: Channel | None = None
        self.cpu_at = None                      # the cell's CPU budget: (start, limit)
        self.was_ready = False                  # it said it was ready once

    # called from the channel's thread
    def _die(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
            self.q.close(("dead", why))
            ch = self.channel
            if ch is not None:
                ch.kill()

    def on_exit(self, how: str) -> None:
        lost = ("; its state is lost (restart_context() gives the context a fresh one)"
                if self.was_ready else "")
        self._die(f"the {self.ctx.language} interpreter {how}{lost}")

    def _cpu_start(self) -> None:
        """Note the interpreter's CPU time at a cell's start, where the channel tells it
        (a live sandbox's stream command has no CPU limit of its own: each cell has)."""
        used = getattr(self.channel, "cpu_seconds", lambda: None)()
        limit = self.session.cpu_time
        self.cpu_at = (used, limit) if used is not None and limit else None

    def _cpu_over(self) -> bool:
        if self.cpu_at is None:
            return False
        used = self.channel.cpu_seconds()
        return used is not None and used - self.cpu_at[0] >= self.cpu_at[1]

    def _wait(self, deadline: float):
        """The next item by `deadline`: ("timeout", None) then, or ("cpu", None) when the
        cell used up its CPU time (checked every CPU_POLL_S)."""
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                return ("timeout", None)
            if self.cpu_at is not None:
                left = min(left, CPU_POLL_S)
            try:
                return self.q.get(timeout=left)
            except queue.Empty:
                if self._cpu_over():
                    self.cpu_at = None
                    return ("cpu", None)

    def close(self, why: str) -> None:
        self._die(why)


class _FramedInterp(_Interp):
    """python and javascript: corral's runner, speaking frames."""

    def start(self) -> None:
        s = self.session
        self.reader = FrameReader(s.max_frame)
        self.stderr_tail = bytearray()
        self.between = False        # the last cell's end came: output now is dropped
        self.channel = s.start(_runner_argv(self.ctx.language, s.max_frame, self.ctx.cwd,
                                            self.ctx._want),
                               self.on_stdout, self.on_stderr, self.on_exit)
        kind, msg = self._next(time.monotonic() + s.start_timeout, "start")
        if kind == "msg" and msg["type"] == "ready":
            self.ctx.engine = ("ipykernel" if "kernel" in msg else
                               "node" if "node" in msg else "runner")
            self.was_ready = True
            return
        if kind == "msg" and msg["type"] == "fatal":   # its own words, even if its exit
            why = (f"the {self.ctx.language} interpreter could not start: "   # came first
                   f"{msg['message'][:300]}")
            self.close(why)
            raise ContextError(f"{self.ctx.language} context: {why}", field="context")
        if kind == "msg":
            self.close(f"the {self.ctx.language} interpreter sent {msg['type']!r} before "
                       f"'ready'")
        raise ContextError(self._start_failure(), field="context")

    def _start_failure(self) -> str:
        why = self.dead or "it did not start"
        if "status 127" in why:
            prog = "python3" if self.ctx.language == "python" else "node"
            why = f"{prog} is not in the sandbox's image (exit 127): {why}"
        return f"{self.ctx.language} context: {why}"

    def on_stdout(self, data: bytes) -> None:
        if self.dead is not None:
            return
        try:
            for msg, size in self.reader.feed(data):
                kind = check_message(msg)
                if self.between:      # no cell runs: its threads' output is nobody's
                    if kind in ("stdout", "stderr"):
                        continue
                    raise ProtocolError(f"it sent {kind!r} between cells")
                if kind == "end":
                    self.between = True
                self.q.put(("msg", msg), size)
        except ProtocolError as e:
            self._die(f"the {self.ctx.language} interpreter broke the protocol ({e}); "
                      f"it was killed")

    def on_stderr(self, data: bytes) -> None:
        # the runner's own stderr (user code's goes through frames): kept for diagnostics
        self.stderr_tail = (self.stderr_tail + data)[-4096:]

    def on_exit(self, how: str) -> None:
        tail = bytes(self.stderr_tail).decode("utf-8", "replace").strip().splitlines()
        if tail and ": " not in how:
            how += f" (its last words: {tail[-1][:300]!r})"
        super().on_exit(how)

    def _next(self, deadline: float, what: str):
        return self._wait(deadline)

    def run(self, code: str, ex: Execution, timeout: float, cb, env=None) -> None:
        s = self.session
        cid = s.next_id()
        req = {"type": "exec", "id": cid, "code": code, "timeout": int(timeout * 1000)}
        if env:
            req["env"] = env      # set for this cell only (the runner puts them back)
        data = json.dumps(req).encode()
        if len(data) > s.max_frame:
            raise ValueError(f"code: {len(data)} bytes, over the {s.max_frame} byte frame "
                             f"limit")
        self.running = cid
        self.between = False
        self._cpu_start()
        try:
            self.channel.send(HEADER.pack(len(data)) + data, time.monotonic() + timeout)
        except (OSError, TimeoutError) as e:
            self._die(f"the {self.ctx.language} interpreter does not take input ({e}); it "
                      f"was killed")
        deadline = time.monotonic() + timeout
        interrupted = False
        over = f"its timeout of {timeout:g}s"
        try:
            while True:
                kind, msg = self._next(deadline, "cell")
                if kind == "dead":
                    ex.error = ExecutionError("ContextDied", msg)
                    return
                if kind == "cpu" and not interrupted:
                    over = f"its CPU time limit (limits.cpu_time, {s.cpu_time:g}s a cell)"
                    interrupted = True
                    self._interrupt(cid)
                    deadline = time.monotonic() + s.interrupt_grace
                    continue
                if kind in ("timeout", "cpu"):
                    if interrupted:
                        self._die(f"the cell did not stop within {s.interrupt_grace:g}s of "
                                  f"its interrupt (after {over}): the "
                                  f"{self.ctx.language} interpreter was killed and its "
                                  f"state is lost")
                        ex.error = ExecutionError("ContextDied", self.dead)
                        return
                    interrupted = True
                    over = f"its timeout of {timeout:g}s"
                    self._interrupt(cid)
                    deadline = time.monotonic() + s.interrupt_grace
                    continue
                t = msg["type"]
                if t in ("stdout", "stderr"):
                    s.keep_log(ex, t, msg["text"], cb)
                    continue
                if t in ("ready", "fatal") or msg["id"] != cid:
                    self._die(f"the {self.ctx.language} interpreter broke the protocol (it "
                              f"sent {t!r} for cell {msg.get('id')} while cell {cid} ran); "
                              f"it was killed")
                    continue
                if t == "display":
                    s.keep_result(ex, CodeResult(msg["data"], msg["main"]), cb)
                elif t == "error":
                    if ex.error is None:
                        err = ExecutionError(msg["name"][:200], msg["value"][:100_000],
                                             msg["traceback"])
                        if interrupted and err.name == "KeyboardInterrupt":
                            err.name = "TimeoutError"
                            err.value = f"the cell ran past {over} and was interrupted"
                        ex.error = err
                        if cb.on_error:
                            cb.on_error(err)
                elif t == "end":
                    ex.execution_count = msg["count"]
                    return
        finally:
            self.running = 0

    def _interrupt(self, cid: int) -> None:
        if self.channel.interrupt():
            return
        data = json.dumps({"type": "interrupt", "id": cid}).encode()
        try:
            self.channel.send(HEADER.pack(len(data)) + data, time.monotonic() + 1.0)
        except (OSError, TimeoutError):
            pass    # the grace period's end kills it


class _BashInterp(_Interp):
    """bash: one interactive `bash --noprofile --norc --noediting -i` reading its cells
    from its stdin (a pipe), one line each: `__corral_n=NONCE; eval $'CELL' </dev/null;
    __corral_end $?`. Each cell ends with a line carrying the random nonce and the exit
    status on stdout (and the nonce on stderr), which is how the host knows the cell is
    over. Interactive, so a SIGINT aborts the running line and bash reads the next one,
    its state kept, as ^C at a terminal: at a cell's timeout the host sends SIGINT to the
    shell's process group (the shell and its foreground commands; background jobs ignore
    it) and then the line `__corral_end 130`; a cell still running INTERRUPT_GRACE
    seconds later (it trapped SIGINT) kills the context. Where no signal can be sent (a
    one-shot Sandbox's ExecChannel) the context is killed at the timeout."""

    READY = b"corral-bash-ready\n"

    def start(self) -> None:
        s = self.session
        self.out = bytearray()
        self.err = bytearray()
        self.ready = self.out_ready = self.err_ready = False
        self.nonce = None
        self.dec = {"stdout": codecs.getincrementaldecoder("utf-8")("replace"),
                    "stderr": codecs.getincrementaldecoder("utf-8")("replace")}
        self.done = {"stdout": False, "stderr": False}
        self.status = None
        self.olock = threading.Lock()
        argv = ["bash", "--noprofile", "--norc", "--noediting", "-i"]
        self.channel = s.start(argv, self.on_stdout, self.on_stderr, self.on_exit)
        cd = f"cd -- {bash_quote(self.ctx.cwd)} || exit 97; " if self.ctx.cwd else ""
        try:
            self.channel.send((_BASH_SETUP + cd + "printf 'corral-bash-ready\\n'; "
                               "printf 'corral-bash-ready\\n' >&2\n").encode(),
                              time.monotonic() + s.start_timeout)
        except (OSError, TimeoutError):
            pass    # it died: said below
        kind, _ = self._wait_ready(time.monotonic() + s.start_timeout)
        if kind != "ready":
            why = self.dead or "it did not start"
            if "status 127" in why:
                why = f"bash is not in the sandbox's image (exit 127): {why}"
            elif "status 97" in why:
                why = f"cannot cd to {self.ctx.cwd!r}: {why}"
            self.close(why)
            raise ContextError(f"bash context: {why}", field="context")

    def _wait_ready(self, deadline):
        while True:
            left = deadline - time.monotonic()
            try:
                kind, msg = self.q.get(timeout=max(left, 0.001))
            except queue.Empty:
                return ("timeout", None)
            if kind in ("ready", "dead"):
                return (kind, msg)

    def on_exit(self, how: str) -> None:
        # bash's stderr tail is the cells' own (and the end lines), not a diagnosis
        super().on_exit(how.split(": corral-end-")[0])

    def on_stdout(self, data: bytes) -> None:
        self._feed("stdout", data)

    def on_stderr(self, data: bytes) -> None:
        self._feed("stderr", data)

    def _feed(self, stream: str, data: bytes) -> None:
        with self.olock:
            if self.dead is not None:
                return
            buf = self.out if stream == "stdout" else self.err
            buf += data
            if not self.ready:
                if stream == "stdout":
                    if buf.startswith(self.READY):
                        del buf[:len(self.READY)]
                        self.out_ready = True
                    elif len(buf) >= len(self.READY) or not self.READY.startswith(bytes(buf)):
                        self._die("bash printed something else than its ready line")
                else:   # an interactive bash's notes and first prompt come before it
                    at = buf.find(self.READY)
                    if at >= 0:
                        del buf[:at + len(self.READY)]
                        self.err_ready = True
                    elif len(buf) > 65536:
                        self._die("bash printed too much on its stderr before it was ready")
                if self.out_ready and self.err_ready:
                    self.ready = self.was_ready = True
                    self.q.put(("ready", None))
                return
            if self.nonce is None or self.done[stream]:
                del buf[:]        # between cells (a background job's output): dropped
                return
            mark = b"\n" + self.nonce + (b" " if stream == "stdout" else b"\n")
            at = buf.find(mark)
            if at < 0:
                cut = len(buf) - (len(mark) - 1)    # a mark may be cut across chunks
                if cut > 0:
                    self._text(stream, bytes(buf[:cut]))
                    del buf[:cut]
                return
            if stream == "stdout":
                nl = buf.find(b"\n", at + len(mark))
                if nl < 0:
                    if len(buf) - at > len(mark) + 8:
                        self._die("bash's end-of-cell line is malformed")
                    return
                status = bytes(buf[at + len(mark):nl])
                if not status.isdigit() or len(status) > 3:
                    self._die("bash's end-of-cell line is malformed")
                    return
                self.status = int(status)
            self._text(stream, bytes(buf[:at]), final=True)
            del buf[:]
            self.done[stream] = True
            if all(self.done.values()):
                self.q.put(("end", self.status))

    def _text(self, stream: str, data: bytes, final: bool = False) -> None:
        text = self.dec[stream].decode(data, final)
        if text:
            self.q.put((stream, text), len(text))

    def run(self, code: str, ex: Execution, timeout: float, cb) -> None:
        s = self.session
        if "\0" in code:
            raise ValueError("code: a bash cell cannot contain a NUL character")
        nonce = ("corral-end-" + uuid.uuid4().hex).encode()
        with self.olock:
            self.nonce = nonce
            self.done = {"stdout": False, "stderr": False}
            self.status = None
        data = (b"__corral_n=" + nonce + b"; eval " +
                bash_quote(code).encode("utf-8", "surrogateescape") +
                b" </dev/null; __corral_end $?\n")
        try:
            self.channel.send(data, time.monotonic() + timeout)
        except (OSError, TimeoutError) as e:
            self._die(f"bash does not take input ({e}); it was killed")
        deadline = time.monotonic() + timeout
        self.session.count[self.ctx.id] = self.session.count.get(self.ctx.id, 0) + 1
        self._cpu_start()
        interrupted = None
        try:
            while True:
                kind, msg = self._wait(deadline)
                if kind in ("timeout", "cpu") and interrupted is None:
                    interrupted = (f"its timeout of {timeout:g}s" if kind == "timeout" else
                                   f"its CPU time limit (limits.cpu_time, {s.cpu_time:g}s "
                                   f"a cell)")
                    if self._interrupt():
                        deadline = time.monotonic() + s.interrupt_grace
                        continue
                    self._die(f"the bash cell ran past {interrupted} and could not be "
                              f"interrupted, so the context was killed")
                    ex.error = ExecutionError("TimeoutError", self.dead)
                    return
                if kind in ("timeout", "cpu"):
                    self._die(f"the bash cell did not stop within {s.interrupt_grace:g}s "
                              f"of its interrupt (after {interrupted}): the context was "
                              f"killed and its state is lost")
                    ex.error = ExecutionError("ContextDied", self.dead)
                    return
                if kind == "dead":
                    ex.error = ExecutionError("ContextDied", msg)
                    return
                if kind in ("stdout", "stderr"):
                    s.keep_log(ex, kind, msg, cb)
                elif kind == "end":
                    ex.exit_code = msg
                    ex.execution_count = self.session.count[self.ctx.id]
                    if interrupted is not None:
                        ex.error = ExecutionError("TimeoutError", f"the cell ran past "
                                                                  f"{interrupted} and was "
                                                                  f"interrupted")
                        if cb.on_error:
                            cb.on_error(ex.error)
                    elif msg != 0:
                        ex.error = ExecutionError("ExitStatus", f"the cell exited with "
                                                                f"status {msg}")
                        if cb.on_error:
                            cb.on_error(ex.error)
                    return
        finally:
            with self.olock:
                self.nonce = None

    def _interrupt(self) -> bool:
        """SIGINT to the shell's process group, then the line that ends the aborted
        cell (a no-op if the cell ended first). False if no signal could be sent."""
        if not self.channel.interrupt_group():
            return False
        try:
            self.channel.send(b"__corral_end 130\n", time.monotonic() + 1.0)
        except (OSError, TimeoutError):
            return False
        return True


class _Callbacks:
    __slots__ = ("on_error", "on_result", "on_stderr", "on_stdout")

    def __init__(self, on_stdout, on_stderr, on_result, on_error) -> None:
        self.on_stdout, self.on_stderr = on_stdout, on_stderr
        self.on_result, self.on_error = on_result, on_error


class CodeSession:
    """The code contexts of one sandbox. Sandbox.run_code and friends delegate here.

    `start(argv, on_stdout, on_stderr, on_exit) -> Channel` runs an interpreter process;
    the default runs it as an ExecChannel on `sandbox`."""

    def __init__(self, sandbox, *, start=None, max_frame: int = MAX_FRAME,
                 max_results: int = MAX_RESULTS, max_log: int | None = None,
                 default_timeout: float | None = None) -> None:
        self.sandbox = sandbox
        self.start = start or (lambda argv, o, e, x: ExecChannel(sandbox, argv, o, e, x))
        self.max_frame, self.max_results = max_frame, max_results
        self.max_log = max_log if max_log is not None else _plan_value(sandbox, "OutputCap",
                                                                        "bytes", 1 << 20)
        self.default_timeout = (default_timeout if default_timeout is not None
                                else _plan_value(sandbox, "WallClock", "seconds", 60.0))
        #: CPU seconds a cell may use, where the channel can tell (a live sandbox's)
        self.cpu_time = _plan_value(sandbox, "CpuTime", "seconds", None)
        self.max_pending = MAX_PENDING
        #: python contexts' engine unless create_context names one (see there)
        self.engine = "auto"
        self.interrupt_grace = INTERRUPT_GRACE
        self.start_timeout = START_TIMEOUT
        self.contexts: dict[str, _Interp] = {}
        self.defaults: dict[str, str] = {}       # language -> id of its default context
        self.count: dict[str, int] = {}          # bash contexts' execution counts
        self._ids = 0
        self._lock = threading.Lock()

    def next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    # --- contexts ---

    def create_context(self, language: str = "python", cwd: str | None = None, *,
                       engine: str | None = None) -> Context:
        """A new context. `engine` (python): "auto" (the default, `self.engine`): an
        IPython kernel where the image's python3 has ipykernel, else corral's runner;
        "ipykernel" (refused where there is none); "runner"."""
        if language not in LANGUAGES:
            raise ContextError(f"unknown language {language!r}; use one of "
                               f"{', '.join(LANGUAGES)}", field="language")
        engine = self.engine if engine is None else engine
        if engine not in ENGINES:
            raise ContextError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}",
                               field="engine")
        if cwd is not None and (not isinstance(cwd, str) or "\0" in cwd or not cwd):
            raise ContextError("cwd must be a non-empty path inside the sandbox",
                               field="cwd")
        ctx = Context(uuid.uuid4().hex[:16], language, cwd, engine)
        interp = self._spawn(ctx)
        with self._lock:
            self.contexts[ctx.id] = interp
        return ctx

    def _spawn(self, ctx: Context) -> _Interp:
        interp = (_BashInterp if ctx.language == "bash" else _FramedInterp)(self, ctx)
        interp.start()
        return interp

    def list_contexts(self) -> list[Context]:
        with self._lock:
            return [i.ctx for i in self.contexts.values()]

    def _get(self, ctx: Context | str) -> _Interp:
        cid = ctx.id if isinstance(ctx, Context) else ctx
        interp = self.contexts.get(cid)
        if interp is None:
            raise ContextError(f"no code context {str(cid)[:40]!r} in this sandbox (removed, "
                               f"or never created here)", field="context")
        return interp

    def restart_context(self, ctx: Context | str) -> None:
        """A fresh interpreter for the context (same id, language, cwd); its state is gone."""
        old = self._get(ctx)
        old.close("the context was restarted")
        with old.lock:
            new = self._spawn(old.ctx)
            with self._lock:
                self.contexts[old.ctx.id] = new
            self.count.pop(old.ctx.id, None)

    def remove_context(self, ctx: Context | str) -> None:
        interp = self._get(ctx)
        with self._lock:
            self.contexts.pop(interp.ctx.id, None)
            for lang, cid in list(self.defaults.items()):
                if cid == interp.ctx.id:
                    del self.defaults[lang]
        interp.close("the context was removed")

    def close(self) -> None:
        with self._lock:
            interps, self.contexts = list(self.contexts.values()), {}
            self.defaults.clear()
        for i in interps:
            i.close("the sandbox was closed")

    # --- run_code ---

    def run_code(self, code: str, *, language: str | None = None,
                 context: Context | str | None = None, timeout: float | None = None,
                 on_stdout=None, on_stderr=None, on_result=None, on_error=None,
                 env=None) -> Execution:
        if not isinstance(code, str):
            raise TypeError("code must be a str")
        env = _cell_env(env)
        if context is not None and language is not None:
            interp = self._get(context)
            if interp.ctx.language != language:
                raise ContextError(f"language {language!r} given with a {interp.ctx.language}"
                                   f" context; give one or the other", field="language")
        if context is not None:
            interp = self._get(context)
            if interp.dead is not None:
                raise ContextError(f"code context {interp.ctx.id} is dead ({interp.dead}); "
                                   f"restart_context() it or create another",
                                   field="context")
        else:
            interp = self._default(language or "python")
        if timeout is None:
            timeout = self.default_timeout
        if not timeout or timeout <= 0:
            raise ContextError("timeout must be a positive number of seconds",
                               field="timeout")
        ex = Execution()
        cb = _Callbacks(on_stdout, on_stderr, on_result, on_error)
        with interp.lock:
            if interp.dead is not None:
                ex.error = ExecutionError("ContextDied", interp.dead)
                return ex
            ok = False
            try:
                if env:
                    if not isinstance(interp, _FramedInterp):
                        raise ContextError("env: a bash cell takes no variables of its own; "
                                           "export them in the cell", field="env")
                    interp.run(code, ex, float(timeout), cb, env)
                else:
                    interp.run(code, ex, float(timeout), cb)
                ok = True
            finally:
                if not ok:   # a callback raised, or ^C in the caller: the cell is unknown
                    interp.close("run_code was abandoned while a cell ran; the context "
                                 "was killed")
        return ex

    def _default(self, language: str) -> _Interp:
        """The language's default context: made on first use, and made again when its
        interpreter died (an explicit context stays dead until restarted)."""
        if language not in LANGUAGES:
            raise ContextError(f"unknown language {language!r}; use one of "
                               f"{', '.join(LANGUAGES)}", field="language")
        cid = self.defaults.get(language)
        interp = self.contexts.get(cid) if cid else None
        if interp is None:
            ctx = self.create_context(language)
            self.defaults[language] = ctx.id
            return self.contexts[ctx.id]
        if interp.dead is not None:
            self.restart_context(interp.ctx)
            return self.contexts[interp.ctx.id]
        return interp

    # --- bounded keeping ---

    def keep_log(self, ex: Execution, stream: str, text: str, cb: _Callbacks) -> None:
        fn = cb.on_stdout if stream == "stdout" else cb.on_stderr
        if fn is not None:
            fn(text)
        logs = ex.logs.stdout if stream == "stdout" else ex.logs.stderr
        used = getattr(ex, "_" + stream, 0)
        if used >= self.max_log:
            setattr(ex, stream + "_truncated", True)
            return
        if used + len(text) > self.max_log:
            text = text[:self.max_log - used]
            setattr(ex, stream + "_truncated", True)
        setattr(ex, "_" + stream, used + len(text))
        logs.append(text)

    def keep_result(self, ex: Execution, result: CodeResult, cb: _Callbacks) -> None:
        size = sum(len(v) if isinstance(v, str) else len(json.dumps(v))
                   for v in result.to_dict().values() if not isinstance(v, bool))
        used = getattr(ex, "_results", 0)
        if used + size > self.max_results:
            ex.results_truncated = True
            return
        ex._results = used + size
        ex.results.append(result)
        if cb.on_result is not None:
            cb.on_result(result)


#: a cell's own variables: at most this many, each name and value bounded
MAX_CELL_ENV = 256


def _cell_env(env) -> dict[str, str] | None:
    """run_code(env=): a dict of variable names to str values (None or {}: none)."""
    if not env:
        return None
    if not isinstance(env, dict) or len(env) > MAX_CELL_ENV or not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 256
            and len(v) <= 65536 and "=" not in k and "\0" not in k + v
            for k, v in env.items()):
        raise ContextError(f"env is a dict of at most {MAX_CELL_ENV} variables: names "
                           "(no '=' or NUL, 1-256 chars) to str values", field="env")
    return dict(env)
