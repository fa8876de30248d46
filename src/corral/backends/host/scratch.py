"""The sandbox's writable places, built on the host: the size-capped scratch tmpfs, the
workspace and read-only binds mounted from fds opened with no symbolic link followed, and
the "scratch full" events read after a run.

    scratch = setup_scratch(run_dir, size, inodes, uid, gid, enforce=True)
    fd = open_source(ws.path, ws.rule, directory=True)   # no symbolic link followed
    src = mount_workspace(run_dir, fd, ws.writable, uid, gid)   # owner -> uid:gid
    events += scratch_events(scratch)                    # after a run: was it full?
"""

from __future__ import annotations

import os
import stat

from ...errors import SandboxSetupError
from ...linux._sys import MS_NODEV, MS_NOSUID, mount

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
    from ...linux.hostpath import LinkInPath, open_nofollow

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
    from ...linux import idmap

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
    out: dict[str, str] = {}
    if not binds:
        return out
    from ...linux import idmap  # not on the path of a run without binds

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
    out: list[dict] = []
    if not (st.f_blocks and st.f_bavail == 0 or st.f_files and st.f_favail == 0):
        return out
    from ...events import LimitEvent  # only for a full scratch

    if st.f_blocks and st.f_bavail == 0:
        out.append(LimitEvent.scratch_full().to_dict())
    if st.f_files and st.f_favail == 0:
        out.append(LimitEvent.scratch_inodes().to_dict())
    return out
