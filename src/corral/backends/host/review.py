"""The host side of a workspace in review mode: an overlay whose writes stay in the sandbox.

    review = mount_review(run_dir, fd, scratch, uid, gid, path)   # fd: open_source()'s
    bwrap --bind review.merged /workspace     (runsc: the same path as a rw bind)
    review.discard()                          # between execs: upper emptied, overlay anew

The layers, all in corral's run dir (none reachable from inside but through the overlay):

    <run>/review         a bind of that (empty) directory on itself, holding the two mounts
                         below: close() detaches all three with one umount2(MNT_DETACH),
                         which waits for one RCU grace period instead of one per mount
    <run>/review/lower   the workspace as opened without following a link (the fd), cloned
                         read-only, nosuid, nodev and idmapped owner -> the sandbox's uid,
                         as a rw workspace would be (idmap.idmapped_bind)
    <scratch>/.review/upper, work
                         overlayfs's upper and work directories on the sandbox's scratch
                         tmpfs: what the sandbox writes is held there, counted against
                         limits.scratch (bytes and inodes), gone when the sandbox closes
    <run>/review/workspace
                         the overlay (nosuid, nodev, redirect_dir=off, index=off,
                         metacopy=off, xino=off), which the tier binds at /workspace

Files the sandbox writes land in upper owned by its uid; a copied-up file keeps the
lower's mode and the (mapped) owner. Nothing ever writes to the host directory except
runtime/changes.py's apply, on the caller's say-so. Overlayfs over an idmapped lower layer
needs Linux 5.19+ (checked on 6.18); both mounts need root, so review mode needs corral to
run as root (the tiers' check() says so). redirect_dir=off makes a rename of a directory
that came from the workspace fail with EXDEV inside, so mv and friends copy and delete
instead: every change is then a plain added, deleted or modified path, and the upper layer
holds no redirect xattrs to interpret.

With one long-lived sandbox process (a live sandbox that binds the overlay once), discard()
replaces the host's mount but not the sandbox's copy of it: that sandbox must bind
`merged` again afterwards (or refuse discard while it runs).

Standard library and corral.linux only; not imported on `corral run`'s path unless the
policy asks for review mode.
"""

from __future__ import annotations

import os
import shutil
import time

from ...errors import SandboxSetupError
from ...linux._sys import MS_NODEV, MS_NOSUID, mount, umount

#: mount(2)'s MS_BIND
MS_BIND = 0x1000

#: the overlay's options besides the layers: no redirects, no index, no metacopy, no inode
#: number tricks, so the upper layer is a plain tree plus whiteouts and opaque markers
OVERLAY_OPTIONS = "redirect_dir=off,index=off,metacopy=off,xino=off"
#: clock_gettime's CLOCK_REALTIME_COARSE (Linux; the time module does not name it): the
#: clock file timestamps come from (or a finer one, never behind it)
CLOCK_REALTIME_COARSE = 5
#: host changes up to this long before the sandbox opened count as made while it ran (the
#: safe side), for filesystems that round timestamps to a few milliseconds
CTIME_SLACK_NS = 10_000_000


class ReviewMount:
    """One sandbox's review overlay: where its layers are, and the state apply needs.

    `host_fd`: an O_PATH fd of the host workspace as it was opened (no link followed), kept
    for the sandbox's life: apply works only relative to it. `upper_fd`: an O_PATH fd of
    the upper directory. `opened_ns`: the kernel's coarse wall clock just before the
    overlay was mounted, less CTIME_SLACK_NS; a host file whose ctime is not before it was
    changed while the sandbox ran (the kernel stamps ctime on every change from that clock
    or a finer one, and no process can set it back; a filesystem whose timestamps are
    coarser than CTIME_SLACK_NS, such as ext4 with 128-byte inodes, could hide a change
    made in the same second).
    `applied`: {path: (st_ino, st_ctime_ns)} of what apply wrote, so a later apply does not
    take corral's own writes for the host's."""

    def __init__(self, run_dir, host_fd: int, host_path: str, scratch: str, uid: int,
                 gid: int) -> None:
        self.run_dir = run_dir
        self.host_fd = host_fd
        self.host_path = host_path
        self.uid, self.gid = uid, gid
        st = os.fstat(host_fd)
        self.owner = (st.st_uid, st.st_gid)
        self.root_mode = st.st_mode & 0o1777   # never set-id: the overlay's root is upper's
        self.base = os.path.join(scratch, ".review")
        self.upper = os.path.join(self.base, "upper")
        self.work = os.path.join(self.base, "work")
        self.home = os.path.join(run_dir.path, "review")
        self.lower = os.path.join(self.home, "lower")
        self.merged = os.path.join(self.home, "workspace")
        self.upper_fd = -1
        #: bytes apply (or a patch) may copy out in all: the scratch tmpfs's size. What
        #: upper holds is capped by it, but hard links and sparse files could make its
        #: apparent size far larger on the host
        self.budget = 0
        self.opened_ns = 0
        self.applied: dict[str, tuple[int, int]] = {}
        self.mounted = False

    def setup(self) -> None:
        from ...linux import idmap

        st = os.statvfs(os.path.dirname(self.base))
        self.budget = st.f_blocks * st.f_frsize
        os.mkdir(self.base, 0o711)
        os.mkdir(self.home, 0o755)
        os.mkdir(self.lower, 0o700)
        os.mkdir(self.merged, 0o755)
        try:
            mount(self.home, self.home, "", MS_BIND, "")
        except OSError as e:
            raise SandboxSetupError(f"cannot bind {self.home} on itself: {e.strerror}",
                                    step="review-overlay", errno=e.errno) from None
        # the run dir unmounts only this one: the lower layer and the overlay, mounted
        # below it, go with it (MNT_DETACH takes the whole tree)
        self.run_dir.mounts.append(self.home)
        idmap.idmapped_bind(self.host_fd, self.lower, uid_map=(self.owner[0], self.uid),
                            gid_map=(self.owner[1], self.gid), readonly=True)
        self._fresh_layers()
        self._mount()

    def _fresh_layers(self) -> None:
        # upper's root is the overlay's root: the workspace's mode, the sandbox's owner
        os.mkdir(self.upper, 0o700)
        os.chown(self.upper, self.uid, self.gid)
        os.chmod(self.upper, self.root_mode)
        os.mkdir(self.work, 0o700)
        if self.upper_fd >= 0:
            os.close(self.upper_fd)
        self.upper_fd = os.open(self.upper, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                                | os.O_CLOEXEC)

    def _mount(self) -> None:
        for p in (self.lower, self.upper, self.work):
            if any(c in p for c in ",:\\\n"):   # the option string's separators
                raise SandboxSetupError(f"corral's run dir path {p!r} has a character an "
                                        f"overlay option cannot hold", step="review-overlay")
        self.opened_ns = time.clock_gettime_ns(CLOCK_REALTIME_COARSE) - CTIME_SLACK_NS
        try:
            mount("overlay", self.merged, "overlay", MS_NOSUID | MS_NODEV,
                  f"lowerdir={self.lower},upperdir={self.upper},workdir={self.work},"
                  f"{OVERLAY_OPTIONS}")
        except OSError as e:
            raise SandboxSetupError(
                f"cannot mount the review overlay of the workspace: {e.strerror} (overlayfs "
                f"over an idmapped layer needs Linux 5.19+); use mode \"ro\" or \"rw\"",
                step="review-overlay", errno=e.errno, field="filesystem.workspace.mode"
            ) from None
        self.mounted = True

    def discard(self) -> None:
        """Forget every change: unmount the overlay, empty upper and work, mount it again
        (the next exec binds the new one). No command may be running."""
        if self.mounted:
            err = umount(self.merged)
            if err:
                raise SandboxSetupError(f"cannot unmount the review overlay: "
                                        f"{os.strerror(err)}", step="review-overlay",
                                        errno=err)
            self.mounted = False
        # corral's own directories on the sandbox's scratch; rmtree never follows a link
        shutil.rmtree(self.upper)
        shutil.rmtree(self.work)
        self.applied.clear()
        self._fresh_layers()
        self._mount()

    def close(self) -> None:
        """Close the fds (the run dir unmounts and removes the layers)."""
        for name in ("upper_fd", "host_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


def mount_review(run_dir, fd: int, scratch: str, uid: int, gid: int, path: str
                 ) -> ReviewMount:
    """The review overlay of the workspace opened as `fd` (host/scratch.open_source), mounted
    at `<run dir>/workspace`; the ReviewMount keeps `fd` (and closes it in close()).
    Needs root."""
    review = ReviewMount(run_dir, fd, path, scratch, uid, gid)
    try:
        review.setup()
    except BaseException:
        review.close()
        raise
    return review
