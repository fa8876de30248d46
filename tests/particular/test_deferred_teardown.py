"""corral.run()'s deferred teardown on the namespace tier (backends/host/deferred.py): what
the Result depends on is done before it returns, the removal of the emptied run dir goes
to a thread, its problems reach the next run's Result, and nothing is left at exit."""

import os
import subprocess
import sys

import pytest
from conftest import mountinfo

import corral
from corral.backends.host.deferred import DEFERRED
from corral.linux import rundir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the root path: /run/corral")


@pytest.fixture
def run_dirs(monkeypatch):
    """The run directories made while the test runs, none made ahead before it: the
    first is its first sandbox's."""
    DEFERRED.flush(30)
    assert DEFERRED.drain_ready() == []
    made = []
    real = rundir.RunDir.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        made.append(self)
    monkeypatch.setattr(rundir.RunDir, "__init__", init)
    return made


def _cgroup_pids(run_id: str) -> list[str]:
    from corral.linux import limits

    found = []
    for _, parent in limits.detect().parents:
        for name in os.listdir(parent) if os.path.isdir(parent) else ():
            if name.startswith(run_id + "-"):
                with open(os.path.join(parent, name, "cgroup.procs")) as f:
                    found += f.read().split()
    return found


def _unbusy(busy: str, path: str) -> None:
    """Undo a test's busy mount and remove the run dir whose teardown it made fail; its
    lock is free, so the sweep of any corral process on the host may have removed it."""
    subprocess.run(["umount", busy], check=False)
    try:
        rundir._rmtree(path)
    except FileNotFoundError:
        pass


def test_a_one_shot_run_is_over_when_it_returns_and_its_run_dir_goes_after(run_dirs):
    r = corral.run(["/bin/sh", "-c", "(setsid sleep 300 > /dev/null 2>&1 &); "
                    "echo x > /scratch/f; echo done"])
    assert r.verdict == "ok" and r.stdout == "done\n", r
    d = run_dirs[0]
    assert _cgroup_pids(d.id) == []      # the daemon died with the run, before it returned
    assert DEFERRED.flush(30)
    assert not os.path.exists(d.path)
    assert not [m for m in mountinfo() if d.path in m]
    assert DEFERRED.take_problems() == []
    # one made ahead (besides the cgroup pool's own run dir), its scratch mounted, for
    # the next run
    (ahead,) = [m for m in run_dirs[1:] if os.path.exists(m.path + "/scratch")]
    assert [m for m in mountinfo() if ahead.path + "/scratch" in m]
    r = corral.run(["/bin/sh", "-c", "ls -A /scratch /tmp; echo ok"])
    assert r.verdict == "ok" and r.stdout == "/scratch:\n\n/tmp:\nok\n", r   # empty
    assert DEFERRED.flush(30) and not os.path.exists(ahead.path)


def test_a_sandbox_closed_by_hand_is_torn_down_before_close_returns(run_dirs):
    with corral.Sandbox() as sb:
        assert sb.exec(["/bin/true"]).verdict == "ok"
    (d,) = run_dirs       # and none made ahead
    assert not os.path.exists(d.path)     # no deferral outside corral.run()


def test_a_failed_deferred_teardown_reaches_the_next_result_and_names_its_run(run_dirs):
    import threading

    hold = threading.Event()
    DEFERRED.submit(None, "test-hold", lambda: hold.wait(30) and [])  # the thread waits
    try:
        first = corral.run(["/bin/true"])
        d = run_dirs[0]
        assert first.verdict == "ok" and os.path.isdir(d.path)
        # a mount of its own in the run dir: its removal fails (EBUSY), as it would if
        # anything kept a part of it
        busy = os.path.join(d.path, "busy")
        os.mkdir(busy)
        subprocess.run(["mount", "-t", "tmpfs", "none", busy], check=True)
    finally:
        hold.set()
    try:
        assert DEFERRED.flush(30)
        second = corral.run(["/bin/true"])
        events = [e for e in second.events if e["kind"] == "teardown"]
        assert len(events) == 1, second.events
        assert d.id in events[0]["message"] and "earlier run" in events[0]["message"]
        assert first is not second and not [e for e in first.events if e["kind"] == "teardown"]
    finally:
        _unbusy(busy, d.path)
    assert DEFERRED.flush(30)
    assert DEFERRED.take_problems() == []


EXIT_SCRIPT = """
import corral
from corral.linux import rundir
made = []
real = rundir.RunDir.__init__
def init(self, *a, **kw):
    real(self, *a, **kw)
    made.append(self.path)
rundir.RunDir.__init__ = init
for _ in range(5):
    assert corral.run(["/bin/true"]).verdict == "ok"
print(" ".join(made), flush=True)
"""


def test_what_is_queued_is_done_before_the_process_exits():
    p = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    paths = p.stdout.split()
    assert len(paths) >= 5
    assert [path for path in paths if os.path.exists(path)] == []


def test_runs_in_many_threads_never_queue_more_than_the_bound(run_dirs):
    import threading

    from corral.backends.host import deferred

    seen, bad = [], []

    def runs():
        for _ in range(10):
            r = corral.run(["/bin/true"])
            seen.append(DEFERRED.pending())
            if r.verdict != "ok":
                bad.append(r)
    threads = [threading.Thread(target=runs) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == [] and len(seen) == 40
    assert max(seen) <= deferred.MAX_PENDING
    assert DEFERRED.flush(60) and DEFERRED.take_problems() == []
    assert DEFERRED.drain_ready() == []
    assert [d.path for d in run_dirs if os.path.exists(d.path)] == []


def test_a_failed_teardown_reaches_only_its_own_threads_results(run_dirs):
    """Runs in two threads at once: the failed teardown of thread A's run (its run dir
    made busy by a mount of its own) must never show in a Result of thread B's, which runs
    while it fails; A's next run gets it."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    a = ThreadPoolExecutor(max_workers=1)   # one thread: A's runs
    hold = threading.Event()
    DEFERRED.submit(None, "test-hold", lambda: hold.wait(30) and [])  # the thread waits
    busy = None
    try:
        first = a.submit(corral.run, ["/bin/true"]).result(60)
        d = run_dirs[0]
        assert first.verdict == "ok" and os.path.isdir(d.path)
        busy = os.path.join(d.path, "busy")
        os.mkdir(busy)
        subprocess.run(["mount", "-t", "tmpfs", "none", busy], check=True)
        b_results, stop = [], threading.Event()

        def b_runs():
            while not stop.is_set() or len(b_results) < 8:
                b_results.append(corral.run(["/bin/true"]))
        b = threading.Thread(target=b_runs)
        b.start()
        hold.set()                       # A's teardown fails while B runs
        assert DEFERRED.flush(30)
        stop.set()
        b.join(120)
        assert not b.is_alive()
        assert [r.verdict for r in b_results] == ["ok"] * len(b_results)
        assert [e for r in b_results for e in r.events if e["kind"] == "teardown"] == []
        second = a.submit(corral.run, ["/bin/true"]).result(60)
        events = [e for e in second.events if e["kind"] == "teardown"]
        assert len(events) == 1, second.events
        assert d.id in events[0]["message"] and "earlier run" in events[0]["message"]
    finally:
        hold.set()
        a.shutdown()
        if busy is not None:
            _unbusy(busy, run_dirs[0].path)
    assert DEFERRED.flush(30)
    assert DEFERRED.take_problems() == []


def test_a_due_sweep_runs_on_the_teardown_thread_not_the_callers(run_dirs, monkeypatch):
    """Once the teardown thread runs, the periodic sweep of dead supervisors' run dirs
    (rundir.sweep_if_due) goes to it: the run that opens a sandbox does not wait for it,
    and what a dead supervisor left is removed all the same."""
    import threading

    monkeypatch.setattr(rundir, "SWEEP_EVERY_S", 0.0)    # due at every open
    swept_by = []
    real = rundir.sweep_stale

    def sweep(*a, **kw):
        swept_by.append(threading.get_ident())
        return real(*a, **kw)
    monkeypatch.setattr(rundir, "sweep_stale", sweep)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:       # a supervisor that dies with its run dir made (and a tmpfs in it)
        try:
            d = rundir.RunDir()
            os.mkdir(d.path + "/m")
            subprocess.run(["mount", "-t", "tmpfs", "none", d.path + "/m"], check=True)
            os.write(w, d.path.encode())
        finally:
            os._exit(0)
    os.close(w)
    dead = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert os.path.isdir(dead)
    assert corral.run(["/bin/true"]).verdict == "ok"     # the thread is running now
    swept_by.clear()
    for _ in range(3):
        assert corral.run(["/bin/true"]).verdict == "ok"
    assert DEFERRED.flush(30)
    assert swept_by and threading.get_ident() not in swept_by
    assert not os.path.exists(dead) and not [m for m in mountinfo() if dead in m]
    assert DEFERRED.take_problems() == []


def test_a_review_workspace_is_unmounted_before_run_returns_its_scratch_after(
        run_dirs, tmp_path):
    """A one-shot run with a workspace in review mode: the overlay and the workspace's
    clone (the host's directory) are unmounted before corral.run() returns; only the
    removal of the scratch tmpfs and the run dir is left to the teardown thread."""
    import threading

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    os.chmod(ws, 0o755)
    os.chmod(tmp_path, 0o755)
    hold = threading.Event()
    DEFERRED.submit(None, "test-hold", lambda: hold.wait(30) and [])  # the thread waits
    try:
        r = corral.run(["/bin/sh", "-c", "echo x > /workspace/new.txt; cat keep.txt"],
                       {"filesystem": {"workspace": {"path": str(ws), "mode": "review"}}})
        assert r.verdict == "ok" and r.stdout == "kept\n", r
        d = run_dirs[0]
        mounted = [m.split()[4] for m in mountinfo() if d.path in m]
        assert mounted == [d.path + "/scratch"]   # what is left for the thread
        assert os.listdir(ws) == ["keep.txt"]
    finally:
        hold.set()
    assert DEFERRED.flush(30)
    assert not os.path.exists(d.path) and not [m for m in mountinfo() if d.path in m]
    assert DEFERRED.take_problems() == []


def test_a_run_dir_that_would_not_go_keeps_its_cgroups_out_of_the_pool(run_dirs):
    """A run dir whose removal failed is left with its lock free, so the next sweep (of
    any corral process) takes it for a dead supervisor's and removes the cgroups named
    after it: those must not be in the pool for later runs to take."""
    import threading

    from corral.backends.host.cgroups import POOL

    hold = threading.Event()
    DEFERRED.submit(None, "test-hold", lambda: hold.wait(30) and [])  # the thread waits
    busy = None
    try:
        first = corral.run(["/bin/true"])
        d = run_dirs[0]
        assert first.verdict == "ok" and os.path.isdir(d.path)
        busy = os.path.join(d.path, "busy")
        os.mkdir(busy)
        subprocess.run(["mount", "-t", "tmpfs", "none", busy], check=True)
        hold.set()
        assert DEFERRED.flush(30)
        assert [p for _, dir_id, p in DEFERRED.take_problems() if dir_id == d.id]
        # its lock is free: swept as dead (here, or by another corral process first)
        assert d.id in rundir.sweep_stale() or not os.path.exists(d.path)
        assert not [cg for cg in POOL._idle if cg.run_id.startswith(d.id)]
        results = [corral.run(["/bin/true"]) for _ in range(POOL.SIZE + 2)]
        assert [r.verdict for r in results] == ["ok"] * len(results)
    finally:
        hold.set()
        if busy is not None:
            _unbusy(busy, d.path)
    assert DEFERRED.flush(30)


def _mount_ns_fds() -> dict[str, str]:
    """This process's fds of mount namespaces: fd -> "mnt:[inode]"."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("mnt:"):
            found[fd] = target
    return found


def test_a_one_shot_runs_mount_namespace_is_freed_by_the_teardown_thread(run_dirs):
    """The dead sandbox's mount namespace is kept (an fd) past corral.run()'s return, so
    that its teardown (an unmount of its tree, an RCU grace period) is not in the exit of
    the sandbox's last process, which the run waits for; the teardown thread frees it.
    Every process of the run is gone when it returns all the same."""
    import threading

    ours = os.readlink("/proc/self/ns/mnt")
    before = _mount_ns_fds()
    hold = threading.Event()
    DEFERRED.submit(None, "test-hold", lambda: hold.wait(30) and [])  # the thread waits
    try:
        r = corral.run(["/bin/sh", "-c", "(setsid sleep 300 > /dev/null 2>&1 &); echo ok"])
        assert r.verdict == "ok" and r.stdout == "ok\n", r
        d = run_dirs[0]
        assert _cgroup_pids(d.id) == []
        kept = {fd: t for fd, t in _mount_ns_fds().items() if fd not in before}
        assert len(kept) == 1 and ours not in kept.values(), kept
    finally:
        hold.set()
    assert DEFERRED.flush(30)
    assert _mount_ns_fds() == before
    assert not os.path.exists(d.path) and not [m for m in mountinfo() if d.path in m]
    assert DEFERRED.take_problems() == []


def test_no_mount_namespace_is_kept_with_a_workspace_nor_by_an_open_sandbox(run_dirs,
                                                                            tmp_path):
    """A kept namespace keeps what is mounted in it: never when the caller's directory is
    (a workspace, in any mode), nor for a Sandbox's execs (they are many)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o755)
    os.chmod(tmp_path, 0o755)
    before = _mount_ns_fds()
    for mode in ("rw", "review"):
        r = corral.run(["/bin/sh", "-c", "echo x > /workspace/f; echo ok"],
                       {"filesystem": {"workspace": {"path": str(ws), "mode": mode}}})
        assert r.verdict == "ok" and r.stdout == "ok\n", r
        assert _mount_ns_fds() == before, mode
    with corral.Sandbox() as sb:
        for _ in range(3):
            assert sb.exec(["/bin/true"]).verdict == "ok"
            assert _mount_ns_fds() == before
    assert DEFERRED.flush(30) and DEFERRED.take_problems() == []
