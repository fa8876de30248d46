"""A cpu cgroup of its own for each local job slot (a batch's worker process), so that the
slot's sandboxes weigh with the scheduler as much as one ordinary process.

Every corral sandbox's cgroup lives below `<own>/corral` (linux/limits.py), and in the cpu
hierarchy that parent is one scheduling entity: all sandboxes of the host, however many
run at once, share the CPU weight of a single process against everything else on the
machine. A pool of P plain processes (raw bwrap) weighs P. On a host that other work keeps
busy, a batch of P slots then got ~1/P of the CPU share a process pool of the same width
gets (measured with bench/batch.py: 0.4x to 0.6x of raw bwrap at load 5 to 12, while
the CPU each job costs differed by under 10%).

So a worker moves itself, as it starts, into `<own cpu cgroup>/corral-slot-<pid>` (cgroup
v1 only, the cpu hierarchy only: memory, pids and the rest stay where they were) before
its first sandbox: its sandboxes' cgroups are made below that one, which weighs as one
process, as a raw pool's worker does. The limits of each sandbox are unchanged (its own
cgroup below, its CFS quota). At the worker's end it moves back and removes the
directory; the driver removes those of workers that were killed (sweep()). A Ray
node's actor, which runs its slots in threads, does the same with a cgroup that weighs
as many processes as it has slots. Anything that
fails here leaves the worker where it was (the old weighting), never a job unrun.
cgroup v2 (root: sandboxes under `<v2 root>/corral`, whatever the supervisor's own
cgroup) is left as it is.
"""

from __future__ import annotations

import os

PREFIX = "corral-slot-"
#: the cpu.shares of one ordinary process (cgroup v1's default), and how many slots one
#: cgroup may weigh as at most
SHARES = 1024
MAX_SLOTS = 256


def _own_cpu_dir() -> str | None:
    from ..linux import limits

    try:
        with open("/proc/self/mountinfo") as f:
            mounts = limits._parse_mountinfo(f.read())
        with open("/proc/self/cgroup") as f:
            loc = limits._locate(mounts, f.read())
    except OSError:
        return None
    if loc.version != "v1":
        return None
    return loc.own.get("cpu")


def enter(slots: int = 1) -> tuple[str, str] | None:
    """Move this process into a cpu cgroup of its own (see the module's docstring), that
    weighs as `slots` processes (cpu.shares; a Ray node's actor runs its slots in
    threads); returns (its directory, the one it left) for leave(), or None."""
    from ..linux import limits

    home = _own_cpu_dir()
    if home is None or os.path.basename(home).startswith(PREFIX):
        return None
    d = os.path.join(home, f"{PREFIX}{os.getpid()}")
    try:
        os.mkdir(d, 0o755)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        if slots > 1:
            with open(os.path.join(d, "cpu.shares"), "w") as f:
                f.write(str(SHARES * min(slots, MAX_SLOTS)))
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        _rmdir(d)
        return None
    limits._detected = None      # looked up again: the run cgroups go below `d` now
    return d, home


def leave(moved: tuple[str, str] | None) -> None:
    """Back to the cpu cgroup enter() left, and `d` removed (once its sandboxes' cgroups
    are gone: call it after closing them)."""
    if moved is None:
        return
    d, home = moved
    try:
        with open(os.path.join(home, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return
    from ..linux import limits

    limits._detected = None
    _rmdir(d)


def sweep() -> None:
    """Remove the slot cgroups of worker processes that are gone (killed before leave()).

    Everything in a dead worker's slot is that worker's: helpers it forked (they stay in
    the slot itself, and may hold the locks of its run directories for a moment after it
    died) and its sandboxes' processes (in run cgroups below). They are killed first, so
    that corral's stale sweep (rundir.py: a dead supervisor's run directories and the
    cgroups they recorded, in every hierarchy) finds those run directories unlocked, and
    then the slot is removed; a run cgroup left there that no record names (the worker
    died between making it and noting it) is removed from the slot too."""
    home = _own_cpu_dir()
    if home is None:
        return
    try:
        names = [n for n in os.listdir(home) if n.startswith(PREFIX)]
    except OSError:
        return
    dead = [os.path.join(home, n) for n in names
            if n[len(PREFIX):].isdigit() and not os.path.exists(f"/proc/{n[len(PREFIX):]}")]
    left = [d for d in dead if not _rmdir(d)]
    if not left:
        return
    for d in left:
        _kill_all(d)
    from ..errors import CorralError
    from ..linux import rundir

    try:
        rundir.sweep_stale()
    except (OSError, CorralError):
        pass         # another run's trouble: this slot is still removed below
    for d in left:
        if not _rmdir(d):
            _rmdir_below(d)
            _rmdir(d)


def _procs(d: str) -> set[int]:
    """The processes in the cpu cgroup `d` and every cgroup below it."""
    found: set[int] = set()
    for root, _dirs, _files in os.walk(d):        # never follows a symlink
        try:
            with open(os.path.join(root, "cgroup.procs")) as f:
                found.update(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return found


def _kill_all(d: str, timeout: float = 3.0) -> bool:
    """SIGKILL every process in `d`'s subtree (through pidfds: a pid still listed after
    its pidfd was opened is that process, never a recycled one) until it is empty or
    `timeout` seconds passed; whether it is empty."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    delay = 0.001
    while pids := _procs(d):
        if time.monotonic() > deadline:
            return False
        fds: dict[int, int] = {}
        for pid in pids:
            try:
                fds[pid] = os.pidfd_open(pid)
            except OSError:
                pass
        still = _procs(d)
        for pid, fd in fds.items():
            try:
                if pid in still:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def _rmdir_below(d: str) -> None:
    """Remove the empty cgroups below `d`, deepest first."""
    for root, dirs, _files in os.walk(d, topdown=False):
        for name in dirs:
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass


def _rmdir(d: str) -> bool:
    """Remove the slot cgroup `d` (and its `corral` below) if empty; whether it is gone."""
    for p in (os.path.join(d, "corral"), d):
        try:
            os.rmdir(p)
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return True
