"""The commands of one sandbox the service holds: each started as a live sandbox's
background command (sb.commands.run(background=True)), its output kept as it comes (at
most the policy's limits.output a stream: supervise() caps what reaches us) for whoever
streams it, its Result once it has ended.

A *foreground* command (POST .../exec without background) is the live sandbox's own
foreground command (sb.commands.run, the policy's limits.timeout its deadline, its stdin
what the request gave, then end of file), run in a thread of FOREGROUND: the request's
coroutine never blocks, no thread pool hop starts it, no thread of its own is started
for it, and the sandbox readies its next command's entrant once it has ended (as
in-process), not while it runs. The route waits for it and kills it when the client goes
away (routes/commands.py; Cmd.cancel). The lean exec path (fastexec.py) starts one from
its event loop instead, where nothing would wait (start's `loop`): no thread at all.
A background command runs on until it exits, is killed or the sandbox ends, whoever
listens. Ended commands are kept for their Result (`wait`), the last KEEP_ENDED of them;
the output chunks of all but the last KEEP_CHUNKS are let go (an output stream of such a
command gives its Result alone, whose stdout and stderr hold the same text): a sandbox's
memory here is bounded by about (KEEP_ENDED + KEEP_CHUNKS) x 2 x limits.output.
"""

from __future__ import annotations

import queue
import threading

from .notify import Notifier

KEEP_ENDED = 16
KEEP_CHUNKS = 4


class Threads:
    """Daemon threads kept for the next job once one is done (a new one only when none
    is idle): a job never waits for another's end, and the process's exit never waits
    for a job (concurrent.futures' pool joins its threads at exit)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._mu = threading.Lock()
        self._idle = 0

    def submit(self, fn, *args) -> None:
        with self._mu:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._q.put((fn, args))
        if spawn:
            threading.Thread(target=self._work, daemon=True, name=self._name).start()

    def _work(self) -> None:
        while True:
            fn, args = self._q.get()
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a job reports its own failure
                pass
            with self._mu:
                self._idle += 1


#: the threads foreground commands wait in; a token's max_concurrent bounds how many of
#: its commands run at once
FOREGROUND = Threads("svc-fg")


class Cmd:
    """One command: its handle, what it printed so far, and its Result once ended."""

    def __init__(self, background: bool, raw: bool = False) -> None:
        self.background = background
        self.handle = None
        self.pid = 0
        #: ("stdout" | "stderr", text), or the bytes as the command wrote them when `raw`
        #: (started for a client that asked for its output as bytes: output_encoding)
        self.chunks: list[tuple[str, str | bytes]] = []
        self.raw = raw
        self.trimmed = False                         # chunks let go (the Result has them)
        self.result = None
        #: what ended a foreground command that never gave a Result (the sandbox closed,
        #: its setup failed): the route raises it
        self.error: BaseException | None = None
        self.started = threading.Event()     # running (a handle), or failed to start
        self.done = threading.Event()
        self.notifier = Notifier()
        self._mu = threading.Lock()
        self._cancelled = False
        #: started and watched by the caller's event loop (CommandTable.start's `loop`)
        self.here = False

    def cancel(self) -> None:
        """Kill it (the client went away, the drain's deadline came), also if it is only
        about to start: it is killed as soon as it has a handle."""
        with self._mu:
            self._cancelled = True
            h = self.handle
        if h is not None:
            h.kill()

    def _set_handle(self, h) -> None:
        with self._mu:
            self.handle, self.pid = h, h.pid
            cancelled = self._cancelled
        if cancelled:
            h.kill()

    def _out(self, stream: str, data: str | bytes) -> None:
        with self._mu:
            self.chunks.append((stream, data))
        self.notifier.notify()

    def chunks_since(self, i: int) -> list[tuple[str, str | bytes]]:
        """The chunks from `i` on as kept: text, or bytes for a `raw` command."""
        with self._mu:
            return [] if self.trimmed else self.chunks[i:]

    def output_since(self, i: int) -> list[tuple[str, str]]:
        """The chunks from `i` on as text (a raw command's each decoded on its own, bad
        bytes and a sequence split between two chunks as U+FFFD)."""
        out = self.chunks_since(i)
        if self.raw:
            out = [(s, d.decode("utf-8", errors="replace")) for s, d in out]
        return out

    def trim(self) -> None:
        with self._mu:
            self.chunks, self.trimmed = [], True

    def info(self) -> dict:
        h = self.handle
        return {"pid": self.pid, "cmd": list(h.cmd) if h else [],
                "background": self.background, "started": h.started if h else None,
                "running": not self.done.is_set(),
                "verdict": self.result.verdict if self.result is not None else None}


class CommandTable:
    def __init__(self, entry) -> None:
        self._entry = entry
        self._mu = threading.Lock()
        self._by_pid: dict[int, Cmd] = {}
        self._ended: list[int] = []

    def start(self, argv: list[str], *, env=None, cwd=None, stdin: bytes | None = None,
              timeout: float | None = None, background: bool = False, on_end=None,
              user: str | None = None, raw: bool = False, loop=None, defer=None) -> Cmd:
        """Start argv in the sandbox. Background: started when this returns (it blocks:
        call it off the event loop). Foreground: handed to a FOREGROUND thread, so this
        returns at once; `cmd.started` is set once it runs (or could not: `cmd.error`),
        `cmd.done` once its Result is in (or `cmd.error`). `on_end(cmd)` is called (from
        another thread) after its Result is in. raw=True: its output chunks are kept as
        the bytes it wrote (Cmd.chunks_since), not decoded. `loop` (the caller's event
        loop, on its thread): a foreground command whose start waits on nothing but its
        entrant's answer (a namespace-tier sandbox with an entrant ready) is started here
        and watched by that loop (CommandHandle._watch_on), no thread involved
        (`cmd.here`); `defer`: CommandHandle._watch_on's."""
        from ..runtime.sandbox import TextChunks

        c = Cmd(background, raw)
        if raw:
            out, err = _Raw(c, "stdout"), _Raw(c, "stderr")
        else:
            out = TextChunks(lambda t: c._out("stdout", t))
            err = TextChunks(lambda t: c._out("stderr", t))
        if not background:
            quick = getattr(self._entry.sandbox, "_quick_start", None)
            if (loop is not None and user is None and quick is not None and quick()
                    and self._foreground_here(c, argv, env, cwd, stdin, timeout, out, err,
                                              on_end, loop, defer)):
                return c
            FOREGROUND.submit(self._foreground, c, argv, env, cwd, stdin, timeout, out, err,
                              on_end, user)
            return c
        h = self._entry.sandbox.commands.run(argv, env=env, cwd=cwd, stdin=stdin,
                                             timeout=timeout, on_stdout=out, on_stderr=err,
                                             background=True, **_as(user))
        self._running(c, h)

        def watch():
            r = h.wait()
            self._finished(c, r, out, err, on_end)

        threading.Thread(target=watch, daemon=True, name=f"svc-cmd-{c.pid}").start()
        return c

    def _running(self, c: Cmd, h) -> None:
        c._set_handle(h)
        with self._mu:
            self._by_pid[c.pid] = c
        self._entry.events.add("command.started", {"pid": c.pid, "cmd": list(h.cmd),
                                                   "background": c.background})
        c.started.set()
        c.notifier.notify()

    def _foreground(self, c: Cmd, argv, env, cwd, stdin, timeout, out, err, on_end,
                    user=None) -> None:
        try:
            r = self._entry.sandbox.commands.run(
                argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, on_stdout=out,
                on_stderr=err, on_start=lambda h: self._running(c, h), **_as(user))
        except BaseException as e:  # noqa: BLE001 - the route raises it
            self._failed(c, e)
            return
        self._foreground_ended(c, argv, r, out, err, on_end)

    def _foreground_here(self, c: Cmd, argv, env, cwd, stdin, timeout, out, err, on_end,
                         loop, defer=None) -> bool:
        """_foreground's work from the event loop's thread, which never waits: the
        request sent to the sandbox's entrant, its answer read once `loop` sees it come,
        the command then watched by `loop`. Returns once the request is sent; False,
        nothing started, when the sandbox is busy (its lock held): the caller then runs
        the command in a thread, as _foreground."""
        commands = self._entry.sandbox.commands
        try:
            got = commands._begin(argv, env=env, cwd=cwd, stdin=stdin,
                                  timeout=timeout, on_stdout=out, on_stderr=err)
        except BaseException as e:  # noqa: BLE001 - the route raises it
            c.here = True
            self._failed(c, e)
            return True
        if got is None:
            return False
        c.here = True
        fd, pending = got

        def then(r, error) -> None:
            if error is not None:
                self._failed(c, error)
            else:
                self._foreground_ended(c, argv, r, out, err, on_end)

        def answered() -> None:
            loop.remove_reader(fd)
            try:
                h = commands._started(pending, on_start=lambda h: self._running(c, h))
            except BaseException as e:  # noqa: BLE001 - the route raises it
                self._failed(c, e)
                return
            if h._done.is_set():     # its exec failed: its Result, no process
                then(h._result, None)
                return
            h._watch_on(loop, then, defer)

        loop.add_reader(fd, answered)
        return True

    def _failed(self, c: Cmd, e: BaseException) -> None:
        c.error = e
        c.started.set()
        c.done.set()
        c.notifier.notify()

    def _foreground_ended(self, c: Cmd, argv, r, out, err, on_end) -> None:
        if not c.started.is_set():     # its exec failed: a Result, no process
            self._entry.events.add("command.started", {"pid": 0, "cmd": list(argv),
                                                       "background": False})
            c.started.set()
        self._finished(c, r, out, err, on_end)

    def _finished(self, c: Cmd, r, out, err, on_end) -> None:
        out.close()
        err.close()
        c.result = r
        # its event, the table's bookkeeping and on_end (the metrics) before the waiters
        # wake: a client that has the Result sees them, and the request's event loop,
        # woken last, does not wait for this thread's GIL while they run
        try:
            self._entry.events.add("command.ended", {"pid": c.pid, "verdict": r.verdict,
                                                     "exit_code": r.exit_code})
            self._ended_one(c.pid)
            if on_end is not None:
                on_end(c)
        finally:
            c.done.set()
            c.notifier.notify()

    def _ended_one(self, pid: int) -> None:
        with self._mu:
            self._ended.append(pid)
            while len(self._ended) > KEEP_ENDED:
                old = self._ended.pop(0)
                c = self._by_pid.get(old)
                if c is not None and c.done.is_set():
                    del self._by_pid[old]
            if len(self._ended) > KEEP_CHUNKS:
                c = self._by_pid.get(self._ended[-KEEP_CHUNKS - 1])
                if c is not None and c.done.is_set():
                    c.trim()

    def get(self, pid: int) -> Cmd | None:
        with self._mu:
            return self._by_pid.get(pid)

    def by_run(self, run_id: str) -> Cmd | None:
        """The command kept here whose audit record is `run_id` (the dashboard's run
        page shows its output while the sandbox holds it)."""
        with self._mu:
            cmds = list(self._by_pid.values())
        return next((c for c in cmds if getattr(c.handle, "run_id", None) == run_id), None)

    def running(self) -> list[Cmd]:
        with self._mu:
            return [c for c in self._by_pid.values() if not c.done.is_set()]

    def close(self) -> None:
        """The sandbox ended: wake every listener (their commands are gone with it)."""
        with self._mu:
            cmds = list(self._by_pid.values())
        for c in cmds:
            c.notifier.notify()


class _Raw:
    """An on_stdout / on_stderr callback keeping the command's bytes as they come."""

    def __init__(self, c: Cmd, stream: str) -> None:
        self._c, self._stream = c, stream

    def __call__(self, data: bytes) -> None:
        self._c._out(self._stream, bytes(data))

    def close(self) -> None:
        pass


def _as(user: str | None) -> dict:
    """commands.run's user= only when one is asked for (every tier's run takes none)."""
    return {"user": user} if user is not None else {}
