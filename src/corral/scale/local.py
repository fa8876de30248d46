"""A batch's job slots on this machine: forked worker processes, each on a socketpair of
its own, each watched through a pidfd.

    for line in run_local(jobs, base, concurrency=4): ...

Before it forks, the driver prepares one NodeRunner (NodeRunner.prepare: the batch's
policy checked, planned and checked against its tier, the receipts' TOML, image digest
and signing key): every worker is a fork of it, so a worker plans, checks and imports
nothing of its own for a job without a policy of its own. A worker moves into a cpu
cgroup of its own (slotcg.py), keeps a warm pool of one sandbox (scale/node.py) and runs
one job at a time.

The link: frames of a 4-byte big-endian length and a pickle, one socketpair a worker.
The driver sends (job, attempt), the worker answers with the job's output line (a dict).
Both ends are this program, forked from one process: what a sandbox printed travels as
strings inside the line, never as pickle opcodes. A worker reads its next job only after
it has sent the last one's line, so of the jobs in flight on a worker (at most
QUEUED_PER_SLOT: one running, one waiting in its socket so it never waits for the
driver) only the first can have started. A job whose frame is over BIG goes only to a
worker with nothing in flight: that worker is waiting to read, so the driver's write
never waits on a worker that is itself writing a large line back; a small one fits in
the socket's buffer (~200 kB) behind the job that runs.

A worker that dies (the OOM killer, a signal) is seen on its pidfd. What it had sent
completely is read first and counts (a job whose line arrived is never run again); then
the first job it had in flight (which it may have started) goes back to the front of the
queue with `attempt` 2 (at a second death it gets an error line instead), the ones
queued behind it (not started) go back as they were, and a new worker is forked if there
is work left. Nothing waits for a dead worker: its socket is dropped and its slot cgroup
swept (slotcg.sweep(): what still runs in it killed) when the batch ends.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import socket
import struct
from collections import deque

from ..errors import CorralError
from .driver import QUEUED_PER_SLOT

#: a job whose frame is longer goes only to a worker with nothing in flight (see above)
BIG = 16 << 10
#: a frame's length at most (a line holds two streams of up to limits.output each and
#: its receipt); a longer header is a broken worker, killed
MAX_FRAME = 1 << 30
#: workers that may die with no job in flight (at start, say) before the jobs left get
#: error lines instead of yet another worker
IDLE_DEATHS_MAX = 4
#: seconds the workers have at the batch's end to close their sandboxes and exit
EXIT_S = 60.0

_HEADER = struct.Struct("!I")


def run_local(jobs, base: dict, concurrency: int):
    """Yield each job's output line as it finishes (scale/driver.run_batch records it):
    `concurrency` worker processes, each with a next job queued."""
    from . import slotcg
    from .node import NodeRunner, node_name

    node = node_name()
    runner = NodeRunner(node, slots=1)
    runner.prepare(base)
    pool = _Pool(runner, base, max(1, min(concurrency, len(jobs))))
    try:
        yield from pool.run(jobs)
    finally:
        pool.close()
        slotcg.sweep()     # the slot cgroups of workers that were killed, what runs in them


class _Worker:
    __slots__ = ("pid", "pidfd", "sock", "inflight", "buf", "open")

    def __init__(self, pid: int, pidfd: int, sock: socket.socket) -> None:
        self.pid, self.pidfd, self.sock = pid, pidfd, sock
        self.inflight: deque = deque()     # [job, attempt, frame], in the order sent
        self.buf = bytearray()
        self.open = True                   # False: its socket broke; its pidfd decides

    def kill(self) -> None:
        """SIGKILL through the pidfd (never a reused pid); an exited worker: nothing."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass

    def reap(self) -> None:
        """Wait for the (dead or dying) worker and close its pidfd."""
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        os.close(self.pidfd)


class _Pool:
    def __init__(self, runner, base: dict, slots: int) -> None:
        self.runner, self.base, self.slots = runner, base, slots
        self.node = runner.node
        self.sel = selectors.DefaultSelector()
        self.workers: dict[int, _Worker] = {}       # pid -> worker
        self.idle_deaths = 0
        self.todo: deque = deque()
        self.out: deque = deque()                   # lines ready to yield

    # -- the driver's loop --
    def run(self, jobs):
        self.todo.extend([job, 1, None] for job in jobs)
        while self.todo or any(w.inflight for w in self.workers.values()):
            self._staff()
            self._dispatch()
            while self.out:
                yield self.out.popleft()
            if not self.workers:            # none could be started: the rest failed
                continue
            for key, _ in self.sel.select():
                w, what = key.data
                if what == "sock":
                    self._read(w)
                else:
                    self._died(w)
            while self.out:
                yield self.out.popleft()

    def _staff(self) -> None:
        """Workers up to the slots the work left needs; if none can be started (fork
        fails, or they keep dying idle) the jobs left get error lines."""
        want = min(self.slots, len(self.todo) + sum(len(w.inflight)
                                                     for w in self.workers.values()))
        while len(self.workers) < want:
            why = None
            if self.idle_deaths >= IDLE_DEATHS_MAX:
                why = (f"worker processes keep dying ({self.idle_deaths} with no job in "
                       f"flight); not run")
            else:
                try:
                    self._spawn()
                    continue
                except OSError as e:
                    why = f"no worker process could be started ({e.strerror}); not run"
            if self.workers:
                return              # the live ones carry on
            while self.todo:
                job, attempt, _ = self.todo.popleft()
                self.out.append(self._error(job, attempt, why))
            return

    def _dispatch(self) -> None:
        """Jobs to workers, in order: each to an idle worker first, else (a small one) to
        the least busy with room; a big one waits for an idle worker."""
        live = [w for w in self.workers.values() if w.open]
        while self.todo and live:
            item = self.todo[0]
            if item[2] is None:
                job, attempt, _ = item
                data = pickle.dumps((job.to_wire(), attempt), pickle.HIGHEST_PROTOCOL)
                item[2] = _HEADER.pack(len(data)) + data
            w = min(live, key=lambda w: len(w.inflight))
            n = len(w.inflight)
            if n >= QUEUED_PER_SLOT or (n and len(item[2]) > BIG):
                return
            self.todo.popleft()
            w.inflight.append(item)
            try:
                w.sock.sendall(item[2])
            except OSError:          # it is dying: its pidfd says when, and requeues
                self._broken(w)
                live.remove(w)

    # -- workers --
    def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:                                        # the worker
            code = 1
            try:
                # ^C reaches the whole process group: the driver stops the workers. A
                # handler, not SIG_IGN: an ignored signal stays ignored across exec, so
                # the sandbox's start (supervise.spawn) would take its slow path to reset it
                signal.signal(signal.SIGINT, _no_op)
                ours.close()
                self.sel.close()
                for w in self.workers.values():             # the other workers' links
                    w.sock.close()
                    os.close(w.pidfd)
                _worker(theirs, self.runner, self.base)
                code = 0
            except BaseException:  # noqa: BLE001 - said on stderr; the driver retries
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        theirs.close()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:             # cannot watch it: it gets no job
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            ours.close()
            raise
        ours.setblocking(True)
        w = _Worker(pid, pidfd, ours)
        self.workers[pid] = w
        self.sel.register(ours, selectors.EVENT_READ, (w, "sock"))
        self.sel.register(pidfd, selectors.EVENT_READ, (w, "pidfd"))

    def _read(self, w: _Worker) -> None:
        """What the worker sent: each whole line answers its first job in flight."""
        try:
            data = w.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._broken(w)
            return
        w.buf += data
        self._lines(w)

    def _lines(self, w: _Worker) -> None:
        buf = w.buf
        while len(buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(buf)
            if n > MAX_FRAME or not w.inflight:
                self._broken(w)
                return
            if len(buf) < _HEADER.size + n:
                return
            try:
                line = pickle.loads(memoryview(buf)[_HEADER.size:_HEADER.size + n])
            except Exception:  # noqa: BLE001 - a broken worker, killed
                self._broken(w)
                return
            del buf[:_HEADER.size + n]
            job, attempt, _ = w.inflight.popleft()
            if not isinstance(line, dict) or line.get("id") != job.id:
                line = self._error(job, attempt, "its worker process answered with "
                                   "something else than its line; not run again")
            self.out.append(line)

    def _broken(self, w: _Worker) -> None:
        """Its link is gone, or it broke the protocol: it gets no more jobs and is killed
        (a worker closes its socket only as it dies); its pidfd reports the death, which
        requeues what it had."""
        if not w.open:
            return
        w.open = False
        self.sel.unregister(w.sock)
        w.kill()

    def _died(self, w: _Worker) -> None:
        if w.open:                   # what it sent before it died counts
            w.sock.setblocking(False)
            while w.open:
                try:
                    data = w.sock.recv(1 << 20)
                except OSError:
                    data = b""
                if not data:
                    break
                w.buf += data
                self._lines(w)
            self._broken(w)
        self.sel.unregister(w.pidfd)
        w.reap()
        w.sock.close()
        del self.workers[w.pid]
        left = list(w.inflight)
        w.inflight.clear()
        if not left:
            self.idle_deaths += 1
            return
        first, *rest = left
        job, attempt, frame = first
        if attempt >= 2:
            self.out.append(self._error(job, attempt, "a worker process died twice while "
                                        "it had the job (killed, perhaps by the OOM "
                                        "killer); not run again"))
            again = []
        else:
            again = [[job, attempt + 1, None]]
        self.todo.extendleft(reversed(again + rest))

    def _error(self, job, attempt: int, why: str) -> dict:
        from .node import error_line

        return error_line(job.id, self.node, attempt, CorralError(why, field="job"))

    def close(self) -> None:
        """Every worker told to finish (its socket closed: it closes its sandboxes and
        exits); one still running a job (the batch was stopped) is killed; all waited
        for, at most EXIT_S seconds, then killed."""
        import select
        import time

        for w in self.workers.values():
            if w.inflight:
                w.kill()
            w.sock.close()
        end = time.monotonic() + EXIT_S
        for w in list(self.workers.values()):
            left = max(0.0, end - time.monotonic())
            if not select.select([w.pidfd], [], [], left)[0]:
                w.kill()
            w.reap()
        self.workers.clear()
        self.sel.close()


# -- the worker process --
def _no_op(_sig, _frame) -> None:
    pass


def _worker(sock: socket.socket, runner, base: dict) -> None:
    from ..backends.host.cgroups import POOL
    from . import slotcg

    moved = slotcg.enter()     # this slot's sandboxes weigh as one process (slotcg.py)
    try:
        while True:
            task = _recv(sock)
            if task is None:
                return              # the driver is done with it
            wire, attempt = task
            data = pickle.dumps(_run(runner, wire, base, attempt), pickle.HIGHEST_PROTOCOL)
            if len(data) > MAX_FRAME:
                data = pickle.dumps(_failed(runner, wire, attempt, CorralError(
                    f"the job's line is over {MAX_FRAME} bytes; lower limits.output",
                    field="limits.output")), pickle.HIGHEST_PROTOCOL)
            try:
                sock.sendall(_HEADER.pack(len(data)) + data)
            except OSError:
                return              # the driver is gone (killed, or it stopped the batch)
    finally:
        runner.close()
        POOL.drain()
        slotcg.leave(moved)


def _recv(sock: socket.socket):
    head = _exactly(sock, _HEADER.size)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes from the driver")
    body = _exactly(sock, n)
    if body is None:
        return None
    return pickle.loads(body)


def _exactly(sock: socket.socket, n: int) -> bytearray | None:
    """n bytes, or None at the end of the stream (before or within them)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:])
        except ConnectionResetError:
            return None
        if not k:
            return None
        got += k
    return buf


def _run(runner, wire: dict, base: dict, attempt: int) -> dict:
    try:
        return runner.run(wire, base, attempt)
    except Exception as e:  # noqa: BLE001 - one job's failure is its own line
        return _failed(runner, wire, attempt, CorralError(
            f"the job failed on this node: {type(e).__name__}: {e}", field="job"))


def _failed(runner, wire: dict, attempt: int, e: CorralError) -> dict:
    from .node import error_line

    return error_line(wire.get("id") if isinstance(wire, dict) else None, runner.node,
                      attempt, e)


__all__ = ["BIG", "QUEUED_PER_SLOT", "run_local"]
