"""What a supervisor leaves behind: the counts bench/soak.py and bench/concurrency.py take
before and after their runs (and tests/linux/test_faults.py after a killed supervisor).

The machine is shared (other supervisors run sandboxes at the same time), so every count
that could see another supervisor's sandboxes is scoped to what this process made: the run
directories it created (their ids, noted by `Tracker`) and the sandbox uids those runs
used. The host-wide figures are printed beside them for information only.

    counts = Tracker(); counts.install()    # before the first run
    before = counts.snapshot(); ...; after = counts.snapshot()
    grown = leaks.grown(before, after)
"""

from __future__ import annotations

import os
import re

from corral.linux import limits, rundir

_HEX_ID = re.compile(rb"[0-9a-f]{%d}" % rundir.ID_LEN)


def _read(path: str, mode: str = "rb"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def _procs():
    """(pid, ppid, real uid, cmdline bytes) of every host process."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        status = _read(f"/proc/{pid}/status")
        if status is None:
            continue
        uid = ppid = -1
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                uid = int(line.split()[1])
            elif line.startswith(b"PPid:"):
                ppid = int(line.split()[1])
        yield int(pid), ppid, uid, _read(f"/proc/{pid}/cmdline") or b""


def _cgroup_dirs() -> list[tuple[str, str]]:
    """(hierarchy, directory) of every cgroup below corral's parents: each v1 hierarchy
    corral uses (memory, pids, cpu, cpuacct, freezer) and the v2 tree (also on a hybrid
    host, where it holds no controller)."""
    parents = {(h, p) for h, p in limits.detect().parents}
    for line in (_read("/proc/self/mountinfo", "r") or "").splitlines():
        f = line.split(" ")
        sep = f.index("-")
        if f[sep + 1] == "cgroup2":
            parents.add(("v2", os.path.join(f[4], limits.PARENT)))
    found = []
    for h, parent in sorted(parents):
        for top, dirs, _ in os.walk(parent):
            found += [(h, os.path.join(top, d)) for d in dirs]
    return found


class Tracker:
    """Notes the run directories (and so the cgroups, mounts and processes) this process
    makes, by wrapping RunDir.__init__ (a bench-side hook: corral itself is unchanged)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.uids: set[int] = set()
        self.pid = os.getpid()

    def install(self) -> Tracker:
        real = rundir.RunDir.__init__
        ids = self.ids

        def init(rd, *a, **kw):
            real(rd, *a, **kw)
            ids.add(rd.id)
        rundir.RunDir.__init__ = init
        from corral.backends.host import ids as uidmod
        real_free, real_pick = uidmod.free_uids, uidmod.pick
        uids = self.uids

        def free_uids(n):
            got = real_free(n)
            uids.update(got)
            return got

        def pick(base=uidmod.UID_BASE, span=uidmod.UID_SPAN):
            got = real_pick(base, span)
            uids.add(got)
            if (base, span) == (0, 1 << 32):     # the process tier: uid and proxy uid
                uids.update(uidmod.UID_BASE + (got + i) % uidmod.UID_SPAN for i in (0, 1))
            return got
        # before the tiers import them (gvisor and microvm take free_uids by name)
        uidmod.free_uids, uidmod.pick = free_uids, pick
        return self

    def _ours(self, text: bytes) -> bool:
        return any(m.decode() in self.ids for m in _HEX_ID.findall(text))

    def snapshot(self) -> dict[str, int]:
        """The counts; keys starting "host " are host-wide (information, not judged)."""
        base = rundir.base_dir()
        mounts = (_read("/proc/self/mountinfo") or b"").splitlines()
        mine = [m for m in mounts
                if m.split(b" ")[4].startswith(base.encode() + b"/")
                and self._ours(m.split(b" ")[4])]
        procs = list(_procs())
        kids: dict[int, list[int]] = {}
        for pid, ppid, _, _ in procs:
            kids.setdefault(ppid, []).append(pid)
        below, todo = set(), [self.pid]
        while todo:
            for k in kids.get(todo.pop(), []):
                if k not in below:
                    below.add(k)
                    todo.append(k)
        from corral.backends.host import zygote
        zpid = zygote.zygote_pid()
        z = zygote._zygote
        keep = {zpid, z.spare if z is not None else None}   # the zygote and its spare proxy
        from corral.linux import enter
        if enter._zygote_now and enter._zygote_now[0] is not None:
            keep.add(enter._zygote_now[0].pid)   # the entrants' zygote (live sandboxes)
        below -= keep
        sandbox_uid = [p for p, _, uid, _ in procs if p not in keep
                       and (uid in self.uids or (p in below and uid >= 1_500_000_000))]
        proxies = [p for p, ppid, _, cmd in procs if p not in keep
                   and (ppid == zpid or (p in below and b"corral.egress" in cmd))]
        qemu = [p for p, _, _, cmd in procs if b"qemu-system" in cmd
                and (p in below or self._ours(cmd))]
        runsc = [p for p, _, _, cmd in procs if b"runsc" in cmd
                 and (p in below or self._ours(cmd))]
        cgroups = _cgroup_dirs()
        #: the pids behind the process counts, for a report of what grew
        self.pids = {"sandbox-uid processes": sandbox_uid, "processes below the supervisor":
                     sorted(below), "proxies (not the zygote)": proxies,
                     "runsc processes": runsc, "qemu processes": qemu}
        try:
            entries = os.listdir(base)
        except OSError:
            entries = []
        try:
            registry = os.listdir(os.path.join(base, rundir.REGISTRY))
        except OSError:
            registry = []
        return {
            "sandbox-uid processes": len(sandbox_uid),
            "processes below the supervisor": len(below),
            "proxies (not the zygote)": len(proxies),
            "runsc processes": len(runsc),
            "qemu processes": len(qemu),
            "mounts under the run dir": len(mine),
            "idmapped mounts": sum(1 for m in mine if b"idmapped" in m),
            **{f"cgroups ({h})": sum(1 for hh, c in cgroups if hh == h
                                     and self._ours(os.path.basename(c).encode()))
               for h in sorted({h for h, _ in cgroups} | {"memory", "pids", "cpu", "v2"})},
            "run dirs": sum(1 for e in entries if e in self.ids),
            "registry entries": sum(1 for e in registry if e[:rundir.ID_LEN] in self.ids),
            "supervisor fds": len(os.listdir("/proc/self/fd")),
            "host cgroups below corral (all hierarchies)": len(cgroups),
            "host mounts under the run dir": sum(
                1 for m in mounts if m.split(b" ")[4].startswith(base.encode() + b"/")),
            "host idmapped mounts": sum(1 for m in mounts if b"idmapped" in m),
            "host run dirs": sum(1 for e in entries if len(e) == rundir.ID_LEN),
        }


def grown(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The judged counts that grew (host-wide ones are not judged)."""
    return [k for k in after if not k.startswith("host ") and after[k] > before.get(k, 0)]


def settle(tracker: Tracker, before: dict[str, int], seconds: float = 10.0) -> dict[str, int]:
    """The counts once nothing is left growing, waiting up to `seconds` for the last
    teardowns (a reaper, a proxy exiting) to finish."""
    import time

    from corral.backends.host.cgroups import POOL
    from corral.backends.host.deferred import DEFERRED

    DEFERRED.flush(seconds)   # one-shot runs' teardown left to its thread: done first
    DEFERRED.drain_ready()    # and the run dirs it made ahead are the supervisor's
    POOL.drain()        # the idle cgroups kept for reuse (v1) are the supervisor's, not leaks
    deadline = time.monotonic() + seconds
    while True:
        after = tracker.snapshot()
        if not grown(before, after) or time.monotonic() > deadline:
            return after
        time.sleep(0.2)


def show(before: dict[str, int], after: dict[str, int]) -> list[str]:
    bad = grown(before, after)
    print(f"  {'count':34} {'before':>8} {'after':>8}")
    for k in after:
        mark = "  GREW" if k in bad else ("  (host-wide, not judged)" if k.startswith("host ")
                                          else "")
        print(f"  {k:34} {before.get(k, 0):8} {after[k]:8}{mark}")
    return bad


def describe(tracker: Tracker, keys: list[str]) -> None:
    """ps-like lines for the processes behind the counts that grew."""
    for k in keys:
        for pid in tracker.__dict__.get("pids", {}).get(k, [])[:10]:
            cmd = (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ")[:160]
            st = {ln.split(b":")[0]: ln.split(b":", 1)[1].strip() for ln in
                  (_read(f"/proc/{pid}/status") or b"").splitlines() if b":" in ln}
            print(f"    {k}: pid {pid} ({st.get(b'Name', b'?').decode()}, "
                  f"{st.get(b'State', b'?').decode()}, ppid {st.get(b'PPid', b'?').decode()}, "
                  f"uid {st.get(b'Uid', b'?').decode().split()[0]}): "
                  f"{cmd.decode(errors='replace')}")
