"""Host-side pieces of a sandbox that more than one tier builds the same way.

    scratch = setup_scratch(run_dir, size, inodes, uid, gid, enforce=True)
    fd = open_source(ws.path, ws.rule, directory=True)   # no symbolic link followed
    src = mount_workspace(run_dir, fd, ws.writable, uid, gid)   # owner -> uid:gid
    events += scratch_events(scratch)                    # after a run: was it full?
    cg = run_cgroup(run_dir, run_id, plan, events, kept=own)   # per exec: the limits' cgroup
    problems = keep_cgroup(cg, own)                      # after it: kept for the next exec
    POOL.note(own); run_dir.remove(); POOL.give(own)     # at close (cgroup v1 reuse)
    ca, ca_file, upstream = egress_files(run_dir, granted, upstream_ca)   # grants' files
    proxy = start_proxy(config_json, listener, attach, uid, gid)   # per exec, with allow
    events += proxy.stop()

Every tier uses these (each where it applies).
No imports from a tier module here, so any tier can import this one.
"""

from __future__ import annotations

import atexit
import os
import stat
import time

from ..errors import SandboxSetupError
from ..linux._sys import MS_NODEV, MS_NOSUID, mount
from ..linux.supervise import kill_pid

#: the directories of the scratch tmpfs: bound at /scratch, /tmp and /dev/shm
SCRATCH_DIRS = (("home", 0o755), ("tmp", 0o1777), ("shm", 0o1777))


def setup_scratch(run_dir, size: int, inodes: int, uid: int, gid: int, *,
                  enforce: bool) -> str:
    """`<run dir>/scratch`: a tmpfs with size= and nr_inodes= caps (when `enforce`, which
    needs root), owned by uid:gid, holding home/ tmp/ shm/. Returns its path; the mount is
    registered with the run dir, which unmounts it on removal."""
    scratch = run_dir.sub("scratch")
    root = os.geteuid() == 0
    if enforce:
        try:
            mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={size},nr_inodes={inodes},mode=0700,uid={uid},gid={gid}")
        except OSError as e:
            raise SandboxSetupError(f"mounting the scratch tmpfs on {scratch}: {e.strerror}",
                                    step="scratch", errno=e.errno) from None
        run_dir.mounts.append(scratch)
    for name, mode in SCRATCH_DIRS:
        p = os.path.join(scratch, name)
        os.mkdir(p)
        os.chmod(p, mode)
        if root:
            os.chown(p, uid, gid)
    if root and not enforce:
        os.chown(scratch, uid, gid)
    return scratch


def open_source(path: str, rule: str, *, directory: bool = False) -> int:
    """An O_PATH fd of a host path the plan mounts (the workspace, a ro_bind), opened
    without following a symbolic link at any component (hostpath.open_nofollow). The
    tier mounts or grants this fd, never the name again: a path swapped for a link after
    the policy was checked is refused here, and one swapped after this open does not
    matter. The caller closes it."""
    from ..linux.hostpath import LinkInPath, open_nofollow

    try:
        return open_nofollow(path, directory=directory)
    except LinkInPath as e:
        raise SandboxSetupError(f"{path} has a symbolic link in it now ({e.link}; it had "
                                f"none when the policy was checked), and corral follows "
                                f"none; name the real path", step="open-host-path",
                                errno=e.errno, field=rule) from None
    except OSError as e:
        raise SandboxSetupError(f"cannot open {path}: {e.strerror}", step="open-host-path",
                                errno=e.errno, field=rule) from None


def mount_workspace(run_dir, fd: int, writable: bool, uid: int, gid: int) -> str:
    """An idmapped bind of the workspace opened as `fd` (open_source; its owner shown as
    uid:gid; nosuid, nodev) at `<run dir>/workspace`, a path of corral's own that the
    tier then binds by name. Returns the mount point. Needs root. The caller's sandbox
    must refuse set-id modes (see idmap.idmapped_bind's setid_blocked)."""
    from ..linux import idmap

    st = os.fstat(fd)
    mp = run_dir.sub("workspace", 0o755)
    idmap.idmapped_bind(fd, mp, uid_map=(st.st_uid, uid), gid_map=(st.st_gid, gid),
                        readonly=not writable, setid_blocked=True)
    run_dir.mounts.append(mp)
    return mp


def mount_binds(run_dir, binds: list) -> dict[str, str]:
    """Each ReadOnlyBind op, opened with open_source() and mounted from that fd (read-only,
    nosuid, nodev, recursive) at `<run dir>/binds/N`, a directory or a file as it is:
    {host path: that mount point}. Needs root. The tier then binds the mount point, a path
    of corral's own that the sandbox's unprivileged uid can reach whatever the modes of
    the bind's parent directories (a checkout in a 0700 `mktemp -d`, say)."""
    from ..linux import idmap

    out: dict[str, str] = {}
    if not binds:
        return out
    base = run_dir.sub("binds", 0o755)
    for i, op in enumerate(binds):
        fd = open_source(op.path, op.rule)
        try:
            mp = os.path.join(base, str(i))
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(mp, 0o755)
            else:
                os.close(os.open(mp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            idmap.readonly_bind(fd, mp, field=op.rule)
            run_dir.mounts.append(mp)
            out[op.path] = mp
        finally:
            os.close(fd)
    return out


def scratch_events(scratch: str) -> list[dict]:
    """"limit" events for a full scratch tmpfs (bytes or inodes)."""
    try:
        st = os.statvfs(scratch)
    except OSError:
        return []
    out = []
    if st.f_blocks and st.f_bavail == 0:
        out.append({"kind": "limit", "limit": "scratch",
                    "message": "/scratch (with /tmp and /dev/shm) is full"})
    if st.f_files and st.f_favail == 0:
        out.append({"kind": "limit", "limit": "scratch_inodes",
                    "message": "/scratch ran out of inodes"})
    return out


def is_unenforced(events: list[dict], op) -> bool:
    """Whether the standing events say this op's rule is not enforced on this host."""
    return any(e.get("kind") == "unenforced" and e.get("rule") == op.rule for e in events)


def run_cgroup(run_dir, run_id: str, plan, events: list[dict], *, pids=lambda n: n,
               kept: list | None = None):
    """The cgroup of one exec with the plan's memory, pids and cpu limits (those not
    unenforced here), noted in the run dir for the stale sweep; None when there is none
    to set. `pids` maps the policy's count to the cgroup's (gvisor adds its own threads).
    Without a usable pids controller the pids limit is left to the tier's RLIMIT_NPROC
    (check() has already reported it where that is not enough).

    `kept`: the sandbox's own idle cgroups (see CgroupPool), reused first; then one of
    the process's pool; else a new one. Give it back with keep_cgroup()."""
    from ..linux import limits
    from ..plan import CpuQuota, MemoryLimit, PidsLimit

    wanted = {type(op): op for op in (*plan.find(MemoryLimit), *plan.find(PidsLimit),
                                      *plan.find(CpuQuota)) if not is_unenforced(events, op)}
    info = limits.detect()
    if not info.pids:
        wanted.pop(PidsLimit, None)
    if not wanted:
        return None
    key = (wanted[MemoryLimit].bytes if MemoryLimit in wanted else None,
           pids(wanted[PidsLimit].count) if PidsLimit in wanted else None,
           wanted[CpuQuota].cpus if CpuQuota in wanted else None)
    if kept is not None and info.version == "v1":
        for cg in list(kept):
            if cg.key != key:
                continue
            try:
                kept.remove(cg)     # atomic: two execs of one sandbox never share one
            except ValueError:
                continue            # another thread's exec took it
            if _renew(cg, max_residue=None):   # its charges are this sandbox's own
                return cg
        cg = POOL.take(key)
        if cg is not None:
            run_dir.track(cg)
            return cg
    cg = limits.RunCgroup.create(run_id, memory=key[0], pids=key[1], cpus=key[2], info=info)
    cg.key = key
    run_dir.track(cg)
    return cg


def keep_cgroup(cg, kept: list | None) -> list[str]:
    """After an exec: keep its emptied cgroup for the sandbox's next exec (cgroup v1), or
    remove it. Returns teardown problems."""
    if kept is not None and cg.version == "v1" and cg._emptied:
        kept.append(cg)
        return []
    return destroy_cgroup(cg)


def destroy_cgroup(cg) -> list[str]:
    """cg.destroy(), its failure returned as teardown problems instead of raised."""
    try:
        cg.destroy()
    except SandboxSetupError as e:
        return [str(e)]
    return []


def _renew(cg, *, max_residue: int | None) -> bool:
    try:
        if cg.renew(max_residue=max_residue):
            return True
    except SandboxSetupError:
        pass
    destroy_cgroup(cg)
    return False


class CgroupPool:
    """This process's emptied run cgroups (cgroup v1), by the limits they were made with,
    for later sandboxes with the same limits: making and removing one costs the kernel about
    1 ms of CPU over its five hierarchies, and the next run's first write into a new
    cgroup is slow too; reusing one is a few small writes (RunCgroup.renew).

    A sandbox keeps the cgroups of its execs while it is open (`kept`: their memory charge
    includes its scratch files, which must not follow them into another sandbox) and gives
    them here when it closes, after its scratch tmpfs is gone. One is reused only if at
    most RESIDUE bytes are still charged to it. The pool notes what it holds in a run dir
    of its own, so if this process dies, the next corral start removes them like any dead
    run's; at a normal exit they are removed. A forked child starts with an empty pool and
    never touches its parent's."""

    SIZE = 8
    RESIDUE = 4 << 20

    def __init__(self) -> None:
        import _thread

        self._lock = _thread.allocate_lock()
        self._pid = os.getpid()
        self._idle: list = []
        self._dir = None          # the pool's RunDir, made on first use
        self._noted: set[str] = set()

    def _mine(self) -> bool:
        """False in a forked child (the parent's cgroups and run dir are not its own)."""
        if os.getpid() == self._pid:
            return True
        self._pid, self._idle, self._dir, self._noted = os.getpid(), [], None, set()
        return False

    def take(self, key):
        with self._lock:
            self._mine()
            for i, cg in enumerate(self._idle):
                if cg.key == key:
                    del self._idle[i]
                    break
            else:
                return None
        return cg if _renew(cg, max_residue=self.RESIDUE) else None

    def note(self, cgs: list) -> None:
        """Record cgroups in the pool's run dir (before the run dir that recorded them goes)."""
        if not cgs:
            return
        with self._lock:
            self._mine()
            if self._dir is None:
                from ..linux import rundir

                self._dir = rundir.RunDir()
            if len(self._noted) > 4 * self.SIZE:
                # the record lists every cgroup ever noted, removed ones too: start it
                # again from what is idle now (those in use are in their sandboxes' records)
                self._dir.retrack([*self._idle, *cgs])
                self._noted = {cg.run_id for cg in (*self._idle, *cgs)}
            for cg in cgs:
                if cg.run_id not in self._noted:
                    self._dir.track(cg)
                    self._noted.add(cg.run_id)

    def give(self, cgs: list) -> list[str]:
        """Keep what fits (note() them first); remove the rest. Returns teardown problems."""
        problems: list[str] = []
        with self._lock:
            if self._mine():
                room = self.SIZE - len(self._idle)
                fits = [cg for cg in cgs if cg.run_id in self._noted][:max(room, 0)]
                self._idle += fits
                cgs = [cg for cg in cgs if all(cg is not f for f in fits)]
        for cg in cgs:
            problems += destroy_cgroup(cg)
        return problems

    def drain(self) -> None:
        """Remove every idle cgroup and the pool's run dir (at exit)."""
        with self._lock:
            if not self._mine():
                return
            idle, self._idle = self._idle, []
            pool_dir, self._dir = self._dir, None
            self._noted = set()
        for cg in idle:
            destroy_cgroup(cg)
        if pool_dir is not None:
            pool_dir.remove()


POOL = CgroupPool()
# registered at import, before any Sandbox registers its own close at exit (sandbox.py):
# atexit runs the latest first, so sandboxes still open give their cgroups to the pool
# before it is drained
atexit.register(POOL.drain)


def usage_of(outcome, cg):
    """(Usage, oom kills) of one exec: wall time from the supervisor; CPU, peak memory and
    the OOM counter from the run's cgroup when there is one."""
    from ..result import Usage

    usage = Usage(wall_s=round(outcome.wall_s, 6))
    if cg is None:
        return usage, 0
    u = cg.usage()
    usage.cpu_s = round(u.cpu_s, 6) if u.cpu_s is not None else None
    usage.memory_peak_bytes = u.memory_peak_bytes
    return usage, u.oom_kills or 0


def egress_files(run_dir, granted: list, upstream_ca: str | None):
    """The files an egress proxy with secret grants needs, in the run dir, readable by the
    sandbox's and the proxy's uids: (ca, ca_file, upstream_ca). `ca` is the run's own CA
    (certificate, key: the key stays here and in the proxy) when secrets are granted, and
    ca_file the bundle the command trusts; upstream_ca is a copy of the caller's file."""
    ca = ca_file = None
    if granted:
        from ..egress.mitm import make_ca
        from ..grants import ca_bundle

        ca = make_ca()
        ca_file = _write_readable(os.path.join(run_dir.path, "ca.pem"), ca_bundle(ca[0]))
    if upstream_ca:
        with open(upstream_ca, "rb") as src:
            data = src.read()
        upstream_ca = _write_readable(os.path.join(run_dir.path, "upstream-ca.pem"), data)
    return ca, ca_file, upstream_ca


def _write_readable(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o644)
    return path


class Proxy:
    """A running egress proxy process of one exec."""

    def __init__(self, pid: int, events_r: int, err_r: int) -> None:
        from ..egress.launch import EventLines

        self.pid, self.events_r, self.err_r = pid, events_r, err_r
        self.lines = EventLines()

    def stop(self) -> list[dict]:
        """SIGTERM, collect the remaining events (it writes those of open connections on
        the way out), reap. Returns its events plus a teardown event if it failed."""
        import select

        try:
            os.kill(self.pid, 15)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 3.0
        open_fds = {self.events_r, self.err_r}
        poller = select.poll()   # not select(): a busy supervisor has fds past 1024
        for fd in open_fds:
            poller.register(fd, select.POLLIN)
        err = b""
        while open_fds and time.monotonic() < deadline:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            for fd, _ in poller.poll(wait_ms):
                data = os.read(fd, 65536)
                if not data:
                    open_fds.discard(fd)
                    poller.unregister(fd)
                elif fd == self.events_r:
                    self.lines(data)
                else:
                    err = (err + data)[-4000:]
        kill_pid(self.pid)
        _, status = os.waitpid(self.pid, 0)
        os.close(self.events_r)
        os.close(self.err_r)
        events = list(self.lines.events)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) not in (0, 143) or (
                os.WIFSIGNALED(status) and os.WTERMSIG(status) not in (9, 15)):
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            events.append({"kind": "teardown", "message": f"the egress proxy failed: {last[0]}"})
        return events


def start_proxy(config_json: str, listener, attach: list[int], uid: int, gid: int) -> Proxy:
    """The egress proxy of one exec, serving `listener` (closed here once handed on):
    it joins the cgroup whose cgroup.procs fds are `attach`, dies with the supervisor and
    drops to uid:gid once loaded (egress/boot.py)."""
    from ..egress.launch import start_proxy as launch
    from ..linux import limits
    from ..linux._sys import set_pdeathsig

    def setup() -> None:
        if attach:
            limits.RunCgroup.attach_self(attach)
        set_pdeathsig(9)   # SIGKILL; boot.py's uid switch clears it, and it asks again

    try:
        pid, events_r, err_r = launch(config_json, listener, uid, gid, setup)
    finally:
        listener.close()
    return Proxy(pid, events_r, err_r)


#: read inside the sandbox: the first 256 bytes of the file a command name resolves to
#: (PATH for a bare name, as execvp looks it up), for interpreter_inside
_HEAD_SCRIPT = ('p=$1; case $p in */*) ;; *) p=$(command -v -- "$p") || exit 3;; esac; '
                'exec head -c 256 -- "$p"')


def interpreter_inside(sb, name: str) -> str | None:
    """The interpreter that a file's #! line names, when exec of `name` said ENOENT inside
    sandbox `sb` although the file is there (what is missing is its interpreter). The file
    is read by a second, short command in the same sandbox (the only safe view of it: its
    mounts, its symlinks, its uid); only on that failure path. None if it cannot tell."""
    from ..linux.supervise import shebang_interpreter

    if getattr(sb, "_looking_up", False):
        return None   # /bin/sh itself was not found: no second level
    sb._looking_up = True
    try:
        r = sb.exec(["/bin/sh", "-c", _HEAD_SCRIPT, "sh", name], timeout=30)
    except Exception:  # noqa: BLE001 - a message only: without it, "not found" stays
        return None
    finally:
        sb._looking_up = False
    if r.verdict != "ok":
        return None
    return shebang_interpreter(r.stdout.encode(errors="surrogateescape")[:256])
