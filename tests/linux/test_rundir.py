"""Run directories and the stale sweep, against a real filesystem and real flocks."""

import multiprocessing
import os
import time

from corral.linux import rundir


def _sweep_forever(base, stop):
    while not stop.is_set():
        rundir.sweep_stale(base)


def test_a_sweeper_never_deletes_a_run_dir_being_made(tmp_path):
    """Every RunDir is locked before its name can be seen: sweepers running flat out in
    another process never remove one (they did, ~1 in 1000, when the lock came second)."""
    base = str(tmp_path / "base")
    os.makedirs(base, mode=0o711)
    stop = multiprocessing.Event()
    sweepers = [multiprocessing.Process(target=_sweep_forever, args=(base, stop))
                for _ in range(2)]
    for p in sweepers:
        p.start()
    lost = 0
    try:
        for _ in range(1500):
            d = rundir.RunDir(base)
            if not os.path.exists(os.path.join(d.path, "lock")):
                lost += 1
            try:
                d.sub("scratch")
            except FileNotFoundError:
                lost += 1
            d.remove()
    finally:
        stop.set()
        for p in sweepers:
            p.join(10)
    assert lost == 0
    assert os.listdir(base) == []


def test_staging_dirs_are_left_alone_while_young_and_swept_when_dead(tmp_path):
    base = str(tmp_path / "base")
    os.makedirs(base, mode=0o711)
    young = os.path.join(base, rundir.STAGING + "young")
    old = os.path.join(base, rundir.STAGING + "old")
    for d in (young, old):
        os.mkdir(d)
        open(os.path.join(d, "lock"), "w").close()
    past = time.time() - rundir.STAGING_STALE_S - 5
    os.utime(old, (past, past))
    assert rundir.sweep_stale(base) == []
    assert sorted(os.listdir(base)) == [rundir.STAGING + "young"]


def _dead_run(base: str) -> str:
    """A run dir whose supervisor (a child process) has exited: its lock is free."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, rundir.RunDir(base).id.encode())
        finally:
            os._exit(0)
    os.close(w)
    run_id = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return run_id


def runs_in(base: str) -> list[str]:
    return sorted(n for n in os.listdir(base) if n != rundir.STAMP)


def test_sweep_if_due_sweeps_once_per_interval(tmp_path, monkeypatch):
    """Opening a sandbox sweeps (sweep_if_due): the first time in a process, then at most
    every SWEEP_EVERY_S; a dead run left in between waits for the next due sweep."""
    base = str(tmp_path / "base")
    os.makedirs(base, mode=0o711)
    monkeypatch.setattr(rundir, "_last_sweep", {})
    first = _dead_run(base)
    assert rundir.sweep_if_due(base) == [first]
    second = _dead_run(base)
    assert rundir.sweep_if_due(base) == []          # swept just now: not due
    assert runs_in(base) == [second]
    monkeypatch.setattr(rundir, "SWEEP_EVERY_S", 0.05)
    time.sleep(0.1)
    assert rundir.sweep_if_due(base) == [second]
    assert runs_in(base) == []


def _sweep_in_child(base: str) -> list[str]:
    """sweep_if_due() in a new process of this uid (its own _last_sweep)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            rundir._last_sweep.clear()
            os.write(w, " ".join(rundir.sweep_if_due(base)).encode())
        finally:
            os._exit(0)
    os.close(w)
    out = os.read(r, 1000).decode().split()
    os.close(r)
    os.waitpid(pid, 0)
    return out


def test_another_process_s_sweep_counts(tmp_path, monkeypatch):
    """A sweep by any process in the last SWEEP_EVERY_S (the stamp) lets a new process skip
    its own; once that is over, the next start sweeps what was left meanwhile. A stamp
    that is not a regular file of ours (a link, another uid's) is not trusted."""
    base = str(tmp_path / "base")
    os.makedirs(base, mode=0o711)
    monkeypatch.setattr(rundir, "_last_sweep", {})
    first = _dead_run(base)
    assert _sweep_in_child(base) == [first]         # another process swept
    second = _dead_run(base)
    assert rundir.sweep_if_due(base) == []          # so this one, new to it, skips
    assert runs_in(base) == [second]
    monkeypatch.setattr(rundir, "SWEEP_EVERY_S", 0.05)
    time.sleep(0.1)
    assert _sweep_in_child(base) == [second]        # due again
    stamp = os.path.join(base, rundir.STAMP)
    third = _dead_run(base)
    os.unlink(stamp)
    os.symlink(os.path.join(base, "elsewhere"), stamp)   # a fresh link: not a stamp
    assert _sweep_in_child(base) == [third]
    assert os.path.islink(stamp) and not os.path.exists(os.path.join(base, "elsewhere"))
    os.unlink(stamp)
    with open(stamp, "w"):
        pass
    os.chown(stamp, 65534, 65534)                   # another uid's: not trusted
    fourth = _dead_run(base)
    assert _sweep_in_child(base) == [fourth]
