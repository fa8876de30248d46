"""Per-sandbox directories on the host, and sweeping what a dead supervisor left behind.

Each live sandbox owns `<base>/<id>/`, holding an flock on `<base>/<id>/lock` for as long as
its supervisor lives. A directory whose lock can be taken belongs to a supervisor that died:
the next corral start unmounts what it mounted there, removes its cgroups and deletes it.
`<base>` is /run/corral for root, else $XDG_RUNTIME_DIR/corral or /tmp/corral-<uid>.
"""

from __future__ import annotations

import fcntl
import os

from ..errors import SandboxSetupError


def state_dir() -> str:
    """corral's state directory (images, the audit store, tokens, caches): $CORRAL_STATE_DIR,
    else /var/lib/corral for root, else $XDG_DATA_HOME/corral (~/.local/share/corral)."""
    d = os.environ.get("CORRAL_STATE_DIR")
    if d:
        return os.path.abspath(d)
    if os.geteuid() == 0:
        return "/var/lib/corral"
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(xdg, "corral")


def base_dir() -> str:
    if os.geteuid() == 0:
        return "/run/corral"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "corral")
    return f"/tmp/corral-{os.geteuid()}"


def _private_mount(base: str) -> None:
    """Root's base dir is a small tmpfs of its own, mount-private, so the scratch and
    workspace mounts made below it never propagate into other mount namespaces (on
    systemd hosts / is a shared mount)."""
    if os.path.ismount(base):
        return
    from . import _sys

    _sys.mount("tmpfs", base, "tmpfs", _sys.MS_NOSUID | _sys.MS_NODEV, "mode=0711,size=64m")
    _sys.mount("none", base, "", _sys.MS_PRIVATE, "")


#: base dirs this process has made or checked (they stay; a check per sandbox is waste)
_checked: set[tuple[str, int]] = set()


def _ensure_base(base: str) -> None:
    if (base, os.getpid()) in _checked:
        return
    try:
        os.makedirs(base, mode=0o711, exist_ok=True)
        st = os.lstat(base)
        if st.st_uid == os.geteuid() and st.st_mode & 0o777 != 0o711:
            os.chmod(base, 0o711)  # sandbox uids must traverse it (not list it)
        if os.geteuid() == 0 and base == "/run/corral":
            _private_mount(base)
            st = os.lstat(base)
    except OSError as e:
        raise SandboxSetupError(f"cannot create {base}: {e.strerror}", step="rundir",
                                errno=e.errno) from None
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not os.path.isdir(base):
        raise SandboxSetupError(f"{base} is not a directory owned by uid {os.geteuid()} "
                                f"and closed to others (mode 0711); remove it", step="rundir")
    _checked.add((base, os.getpid()))


#: a run directory's name: this many hex digits
ID_LEN = 12
#: the directory of <base> where live sandboxes with a supervisor of their own are
#: registered, one `<run dir id>.json` each (runtime/registry.py); the sweep removes the
#: entry of a dead run dir with it
REGISTRY = "sandboxes"
#: the name prefix of a run directory being made (RunDir.__init__)
STAGING = ".new-"
#: a staging directory this old was left by a supervisor that died while making it
STAGING_STALE_S = 60.0


class RunDir:
    """A sandbox's host directory, locked for the life of its supervisor."""

    def __init__(self, base: str | None = None) -> None:
        self.base = base or base_dir()
        _ensure_base(self.base)
        self.id = os.urandom(ID_LEN // 2).hex()
        self.path = os.path.join(self.base, self.id)
        # made and locked under a name sweepers pass over, then renamed into place: a
        # sweeper must never find this directory with its lock free (it would delete it)
        staging = os.path.join(self.base, STAGING + self.id)
        try:
            os.mkdir(staging, 0o711)
        except FileNotFoundError:     # the base went away since it was checked: again
            _checked.discard((self.base, os.getpid()))
            _ensure_base(self.base)
            os.mkdir(staging, 0o711)
        self._lock_fd = -1
        try:
            self._lock_fd = os.open(os.path.join(staging, "lock"),
                                    os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            os.rename(staging, self.path)
        except BaseException:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
            _rmtree(staging)
            raise
        #: mount points below path that must be unmounted before removal
        self.mounts: list[str] = []

    def track(self, cg) -> None:
        """Note a run cgroup's directories here, so that whichever corral start finds this
        directory dead can remove them (a sweeper in another cgroup cannot find them)."""
        # one append by os.write: a text file object costs ~4x as much, and a batch job
        # tracks a cgroup at every exec
        data = os.fsencode(_cgroup_lines(cg))
        fd = os.open(os.path.join(self.path, "cgroups"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
        try:
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)

    def retrack(self, cgs) -> None:
        """Replace the record with exactly these cgroups (write, then rename)."""
        path = os.path.join(self.path, "cgroups")
        with open(path + ".new", "w") as f:
            f.write("".join(_cgroup_lines(cg) for cg in cgs))
        os.rename(path + ".new", path)

    def sub(self, name: str, mode: int = 0o700) -> str:
        p = os.path.join(self.path, name)
        os.mkdir(p, mode)
        return p

    def unmount_all_but(self, keep: str) -> bool:
        """Unmount every mount of the run dir but `keep`, the latest first, each dropped
        from `mounts` once gone. True if only `keep` (if it was there) is left; False at
        the first that will not go (remove() then tries it again and says why)."""
        for m in reversed(list(self.mounts)):
            if m != keep:
                if _umount(m):
                    return False
                self.mounts.remove(m)
        return True

    def remove(self) -> list[str]:
        """Unmount, delete, release. Returns problems (for teardown events)."""
        problems = _remove_tree(self.path, self.mounts)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        return problems


def _cgroup_lines(cg) -> str:
    return "".join(f"{cg.version} {cg.run_id} {h} {d}\n" for h, d in cg._dirs.items())


def _umount(path: str) -> str | None:
    from . import _sys

    err = _sys.umount(path)
    return None if err in (0, _sys.EINVAL, _sys.ENOENT) else f"umount {path}: {os.strerror(err)}"


def _remove_tree(path: str, mounts) -> list[str]:
    problems = [p for p in (_umount(m) for m in reversed(list(mounts))) if p]
    if problems:
        return problems
    try:
        _rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        problems.append(f"remove {path}: {e.strerror}")
    return problems


def _rmtree(path: str) -> None:
    """Remove a run directory. Usually it holds only empty mount points and the lock, so
    plain rmdir/unlink do; shutil (slow to import) only for a scratch dir with content."""
    try:
        for name in os.listdir(path):
            p = os.path.join(path, name)
            if os.path.isdir(p) and not os.path.islink(p):
                os.rmdir(p)
            else:
                os.unlink(p)
        os.rmdir(path)
    except OSError:
        import shutil

        shutil.rmtree(path)


def _mounts_below(path: str) -> list[str]:
    prefix = path.rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split(" ", 5)[4].replace("\\040", " ")
            if mp.startswith(prefix):
                found.append(mp)
    return sorted(found, key=len)


def _remove_cgroups(record: str) -> None:
    """Kill and remove the cgroups a dead run noted (RunDir.track)."""
    try:
        with open(record) as f:
            lines = [line.split(" ", 3) for line in f.read().splitlines() if line]
    except OSError:
        return
    runs: dict[tuple[str, str], dict[str, str]] = {}
    for version, run_id, h, d in (x for x in lines if len(x) == 4):
        if os.path.isdir(d):
            runs.setdefault((version, run_id), {})[h] = d
    from ..errors import SandboxSetupError
    from .limits import RunCgroup

    for (version, run_id), dirs in runs.items():
        try:
            RunCgroup(run_id, version, dirs).destroy()
        except SandboxSetupError:
            pass  # stuck processes: the cgroup stays; the next sweep tries again


#: a process sweeps when it opens its first sandbox, then at most this often, and not when
#: any process swept `base` less than this long ago (the stamp's mtime): the sweep only
#: collects what dead supervisors left, and need not cost every start (trying the lock of
#: every live run dir is ~6 us each: 0.6 ms of each `corral run` beside 100 live sandboxes)
SWEEP_EVERY_S = 1.0
#: in <base>, touched by each sweep before it starts (not a run dir: the sweep skips it)
STAMP = "swept"
_last_sweep: dict[tuple[str, int], float] = {}


def sweep_if_due(base: str | None = None, *, off_path=None) -> list[str]:
    """sweep_stale(), unless this process, or another (the stamp), swept `base` less than
    SWEEP_EVERY_S ago. A stamp that is not a regular file of ours is not trusted.

    `off_path`: a function given the sweep (a callable) when one is due, which returns
    True if it will run it on another thread (host/deferred.py's run_soon: the teardown
    thread of a process that has one), so that the run opening a sandbox does not wait
    for it (it tries the lock of every run dir, ~6 us each, and removes the dead ones:
    unmounts and cgroups, milliseconds); False: it is swept here, now. Nothing a new
    sandbox uses depends on the sweep: it only frees what dead supervisors left."""
    import time

    base = base or base_dir()
    key, now = (base, os.getpid()), time.monotonic()
    last = _last_sweep.get(key)
    if last is not None and now - last < SWEEP_EVERY_S:
        return []
    _last_sweep[key] = now
    if off_path is not None and off_path(lambda: _sweep_stamped(base)):
        return []
    return _sweep_stamped(base)


def _sweep_stamped(base: str) -> list[str]:
    """sweep_stale(base), unless another process swept it less than SWEEP_EVERY_S ago
    (the stamp, touched first)."""
    import time

    stamp = os.path.join(base, STAMP)
    try:
        st = os.lstat(stamp)
        if (st.st_uid == os.geteuid() and st.st_mode & 0o170000 == 0o100000
                and 0 <= time.time() - st.st_mtime < SWEEP_EVERY_S):
            return []
    except OSError:
        pass
    _touch(stamp)
    return sweep_stale(base)


def _touch(path: str) -> None:
    """The stamp's mtime set to now (made if missing, never through a link); a stamp that
    cannot be written means the next start sweeps too."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.utime(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_live(run_id: str, base: str | None = None) -> bool:
    """Does a supervisor hold run directory `run_id` (its lock taken)? False when the
    directory is gone or its lock is free (its supervisor died)."""
    if len(run_id) != ID_LEN or not all(c in "0123456789abcdef" for c in run_id):
        return False
    try:
        fd = os.open(os.path.join(base or base_dir(), run_id, "lock"),
                     os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)        # closing it releases a lock we took
    return False


def sweep_stale(base: str | None = None) -> list[str]:
    """Remove the run directories of dead supervisors. Returns the ids removed."""
    base = base or base_dir()
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    dead = []
    for name in names:
        path = os.path.join(base, name)
        if name.startswith(STAGING):
            _sweep_staging(path)
            continue
        if len(name) != ID_LEN:   # the shared etc/ and cache/ are not run dirs
            continue
        lock = os.path.join(path, "lock")
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # alive
        try:
            dead.append(name)
            _remove_cgroups(os.path.join(path, "cgroups"))
            _remove_tree(path, _mounts_below(path))
            try:
                os.unlink(os.path.join(base, REGISTRY, name + ".json"))
            except OSError:
                pass
        finally:
            os.close(fd)
    if dead:
        from . import limits

        limits.RunCgroup.sweep_stale(lambda run_id: run_id.split("-")[0] in dead)
    return dead


def _sweep_staging(path: str) -> None:
    """A staging directory holds nothing but its lock; it is stale once it is old and
    its lock is free (a young one may belong to a RunDir about to lock it)."""
    import time

    try:
        if time.time() - os.lstat(path).st_mtime < STAGING_STALE_S:
            return
        fd = os.open(os.path.join(path, "lock"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _rmtree(path)
    except OSError:
        pass
    finally:
        if fd >= 0:
            os.close(fd)
