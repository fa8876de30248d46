"""One thread of the process's own, for starting children that must live as long as the
process does: a live sandbox's bwrap or runsc, its egress proxy, a background command's
runsc exec.

    pid = spawner.call(spawn, argv[0], argv, env, stdin_fd=fd, pass_fds=())

A parent-death signal (prctl PR_SET_PDEATHSIG, bwrap --die-with-parent, the proxy's own)
fires when the *thread* that forked the child exits, not the process (prctl(2)). A live
sandbox created from a short-lived thread (a pool's filler, a web server's worker, any
`threading.Thread`) would otherwise die the moment that thread returns. Children forked
here die with the process, as intended, and only then. The thread is a daemon made on
first use (again in a forked child of this process, where it does not exist).
"""

from __future__ import annotations

import os
import queue
import threading

_lock = threading.Lock()
_thread: threading.Thread | None = None
_owner = 0
_jobs: queue.SimpleQueue | None = None


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        fn, args, kw, done, box = jobs.get()
        try:
            box["value"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
            box["error"] = e
        done.set()


def call(fn, /, *args, **kw):
    """fn(*args, **kw) run in the spawner thread; its value, or its exception raised here."""
    global _thread, _owner, _jobs
    if threading.current_thread() is _thread and _owner == os.getpid():
        return fn(*args, **kw)
    with _lock:
        if _thread is None or _owner != os.getpid():
            _jobs = queue.SimpleQueue()
            _thread = threading.Thread(target=_serve, args=(_jobs,), daemon=True,
                                       name="corral-spawner")
            _owner = os.getpid()
            _thread.start()
        jobs = _jobs
    done = threading.Event()
    box: dict = {}
    jobs.put((fn, args, kw, done, box))
    while not done.wait(60):   # the fork is on its way; a child is never left unclaimed
        pass
    if "error" in box:
        raise box["error"]
    return box["value"]
