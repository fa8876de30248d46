"""The slow end of a one-shot run's teardown, done by a background thread.

`corral.run()` (runtime/sandbox.py) closes its sandbox as soon as the command's Result is
made. What the Result depends on stays on the caller's thread, in order: bwrap and the
sandbox's init killed and reaped, the run's cgroup killed and checked empty
(namespace.py's _reap_init), the fds closed. What is left then is the removal of resources
nothing uses any more: the dead sandbox's mount namespace, when the run kept it
(host/mountns.py: closing its fd makes the kernel unmount its tree), the unmount of the
scratch tmpfs (an unmount waits for an RCU grace period), the run directory, and the
hand-over of the emptied cgroups to the process's pool (host/cgroups.POOL). `submit()`
queues that work; one thread per process (`corral-teardown`, started on first use, from
`_thread`: nothing is imported for it) does it in order.

Its problems (each a sentence: an unmount or removal that failed) are never dropped:

 - `take_problems(this_thread=True)` hands them to the next run of the thread whose run
   they belong to (the thread that queued the work), whose Result carries them as
   "teardown" events naming the earlier run (runtime/sandbox.py), and the audit store adds
   them to that earlier run's own record. Never to another thread's run: runs of several
   threads at once are often several callers (requests, tenants), and a Result must not
   name another caller's run or carry its problems. A thread that never runs again leaves
   its problems to stderr at exit (or sooner, past MAX_PROBLEMS);
 - at exit, `flush()` waits for what is queued (atexit, before the cgroup pool is drained)
   and writes any problem not handed on to stderr;
 - a process killed with work queued leaves its run directories with their locks free:
   the next corral start sweeps them, cgroups and mounts included (linux/rundir.py), as
   it does for any dead supervisor's.

The same thread runs the periodic sweep of dead supervisors' run directories
(linux/rundir.sweep_if_due, about once a second) once it is running (`run_soon`), so that
the run opening a sandbox does not wait for it.

After such a teardown the thread also makes a run directory ahead for the next sandbox
of the same kind (a uid picked, its scratch tmpfs mounted with the same size and inode
caps: namespace.py's _make_ready), at most READY_MAX of a kind; a sandbox takes one
(`take_ready`) instead of making its own. Each is used once. They are this process's run
dirs like any other (locked: swept if it dies) and removed at exit (`drain_ready`).

A forked child starts with an empty queue and none made ahead; what its parent queued or
made stays the parent's.
"""

from __future__ import annotations

import _thread
import atexit
import os

#: problems kept for the next run at most (older ones go to stderr instead)
MAX_PROBLEMS = 64
#: run dirs (scratch tmpfs mounted, a uid picked) made ahead per kind at most
READY_MAX = 2
#: teardowns queued at most; past it the caller tears down itself (submit)
MAX_PENDING = 4


class Deferred:
    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._wake = _thread.allocate_lock()   # held while there is nothing to do
        self._wake.acquire()
        self._idle = _thread.allocate_lock()   # held while work is queued or running
        self._pid = os.getpid()
        self._queue: list = []
        self._thread = False
        #: (owner: the queuing thread's token, run id or None, run dir id, problem)
        self._problems: list[tuple[object, str | None, str, str]] = []
        #: (key, (run dir, uid, scratch)): run dirs made ahead for the next sandboxes
        self._ready: list = []

    def _mine(self) -> bool:
        if os.getpid() == self._pid:
            return True
        self.__init__()      # a forked child: the parent's queue and thread are not its own
        return False

    def submit(self, run_id: str | None, dir_id: str, work, ready=None) -> bool:
        """Queue `work()` (returns a list of problems) for the teardown thread; `ready`:
        (key, make), after it the thread makes one run dir ahead with `make()` unless
        READY_MAX of that key are waiting (take_ready). False, and nothing queued, when
        MAX_PENDING are waiting already (runs in many threads outpace the one teardown
        thread): the caller then does the work itself, as if there were no thread.
        Its problems belong to the calling thread (take_problems)."""
        owner = _owner()
        if ready is not None:
            key, make = ready
            inner = work

            def work():
                problems = inner()
                self._make_ready(key, make)
                return problems
        with self._lock:
            self._mine()
            if len(self._queue) >= MAX_PENDING:
                return False
            if not self._queue:
                self._idle.acquire()
            self._queue.append((owner, run_id, dir_id, work))
            if not self._thread:
                self._thread = True
                _thread.start_new_thread(self._loop, ())
            if self._wake.locked():
                self._wake.release()
        return True

    def run_soon(self, fn) -> bool:
        """Queue `fn()` (its return value unused) for the teardown thread if the thread
        runs already and the queue has room; False, and nothing queued, otherwise (the
        caller runs it itself). For the periodic sweep of dead run dirs
        (linux/rundir.sweep_if_due), which need not hold up the sandbox being opened; an
        error of it is a problem of the calling thread's, as a teardown's is (its next
        run's Result says so) instead of failing the run that opened a sandbox."""
        def work():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - reported, as a teardown's problem
                return [f"the sweep of dead supervisors' run dirs: {type(e).__name__}: {e}"]
            return []
        with self._lock:
            if not self._mine() or not self._thread or len(self._queue) >= MAX_PENDING:
                return False
        return self.submit(None, "sweep", work)

    def _loop(self) -> None:
        while True:
            self._wake.acquire()
            while True:
                with self._lock:
                    if not self._queue:
                        break
                    owner, run_id, dir_id, work = self._queue[0]
                self._run(owner, run_id, dir_id, work)
                with self._lock:
                    self._queue.pop(0)
                    if not self._queue:
                        self._idle.release()

    def _run(self, owner, run_id, dir_id, work) -> None:
        try:
            problems = work()
        except Exception as e:  # noqa: BLE001 - a teardown never raises into nothing
            problems = [f"teardown of run dir {dir_id}: {type(e).__name__}: {e}"]
        if problems:
            with self._lock:
                self._problems += [(owner, run_id, dir_id, p) for p in problems]
                spill = self._problems[:-MAX_PROBLEMS]
                del self._problems[:-MAX_PROBLEMS]
            _to_stderr([x[1:] for x in spill])

    def _make_ready(self, key, make) -> None:
        with self._lock:
            if sum(k == key for k, _ in self._ready) >= READY_MAX:
                return
        try:
            item = make()
        except Exception:  # noqa: BLE001 - the next sandbox makes its own, and says why
            return
        with self._lock:
            if self._mine():
                self._ready.append((key, item))
                return
        item[0].remove()   # pragma: no cover - forked meanwhile

    def take_ready(self, key):
        """A run dir made ahead for `key` (what make() returned), or None."""
        with self._lock:
            if not self._mine():
                return None
            for i, (k, item) in enumerate(self._ready):
                if k == key:
                    del self._ready[i]
                    return item
        return None

    def drain_ready(self) -> list[str]:
        """Remove the run dirs made ahead (at exit; bench/leaks.py before it counts).
        Returns problems."""
        with self._lock:
            if not self._mine():
                return []
            ready, self._ready = self._ready, []
        problems: list[str] = []
        for _, item in ready:
            problems += item[0].remove()
        return problems

    def pending(self) -> int:
        with self._lock:
            return len(self._queue) if self._mine() else 0

    def flush(self, timeout: float = -1) -> bool:
        """Wait until everything queued is done (at most `timeout` seconds; -1: no bound).
        False if it is not done by then."""
        if not self._mine():
            return True
        if self._idle.acquire(True, timeout):
            self._idle.release()
            return True
        return False

    def take_problems(self, *, this_thread: bool = False) -> list[tuple[str | None, str, str]]:
        """The problems of finished teardowns not handed on yet: (run id, run dir id,
        sentence). this_thread=True: only those of work the calling thread queued (what
        run() hands to its Result); False: all (at exit)."""
        me = _owner() if this_thread else None
        with self._lock:
            if not self._mine() or not self._problems:
                return []
            out = [x for x in self._problems if me is None or x[0] is me]
            if out:
                self._problems = [x for x in self._problems if not (me is None or x[0] is me)]
        return [x[1:] for x in out]


_local = _thread._local()


def _owner() -> object:
    """The calling thread's token, whose problems go to its own runs only (a token held
    by a queued problem is never another thread's, as a recycled thread id could be)."""
    token = getattr(_local, "token", None)
    if token is None:
        token = _local.token = object()
    return token


def _to_stderr(problems) -> None:
    for run_id, dir_id, p in problems:
        try:
            os.write(2, f"corral: teardown of an earlier run (run {run_id or '-'}, run dir "
                        f"{dir_id}): {p}\n".encode(errors="replace"))
        except OSError:
            pass


DEFERRED = Deferred()
# a child forked while the thread held the lock must not inherit it locked: it starts
# afresh at once (the parent's queue, thread and run dirs made ahead are not its own)
os.register_at_fork(after_in_child=DEFERRED.__init__)


def _at_exit() -> None:
    DEFERRED.flush()
    _to_stderr([(None, "made ahead", p) for p in DEFERRED.drain_ready()])
    _to_stderr(DEFERRED.take_problems())


# host/cgroups.py registered POOL.drain at its import (above, through namespace.py's
# imports); atexit runs the latest first, so what is queued gives its cgroups to the pool
# before the pool is drained
from .cgroups import POOL  # noqa: E402,F401  (imported for its atexit: POOL.drain registered first)

atexit.register(_at_exit)
