"""The root of a run on a layered image: its layers over its base tree, one read-only overlay.

    root = image_root(run_dir, op)             # op: a resolved ImageRoot with layers
    bwrap --ro-bind root /                     (runsc: bound on the bundle's rootfs)

An image without layers needs none of this: the tiers bind the store's tree itself. With
layers, overlayfs is mounted on the host with only lower directories (top layer first, the
base tree last): such an overlay has no upper directory, so it is read-only whatever is
mounted over it, and it writes nothing to the store. The layers' whiteouts (0/0 character
devices) and opaque directories are the ones tree.py made from OCI `.wh.` names; no
redirects, no index, no metacopy are followed.

The overlay is shared: mounted once per set of layers at `<run base>/images/KEY` (KEY: the
sha256 of the lower directories' paths; /run/corral is a mount-private tmpfs), kept for
the next runs, and bound into each sandbox like a tree. A fresh overlay per run would cost
its mount and, more, a cold overlay dentry cache for every path the run's start walks (the
dynamic loader, libc, python's imports): about 3 ms of a 6 ms start. `KEY.lowers` beside
it lists its lower directories (path, device, inode); a shared overlay whose lower
directories are gone or were replaced (the image removed: `corral image rm` and `gc` call
sweep_shared; or removed and stored again) is detached and, when wanted, mounted anew
(each sandbox keeps its own bind of it until it ends).

Mounting an overlay needs root here (bookworm's bubblewrap, 0.8, cannot mount one itself);
the namespace tier refuses a layered image without root, naming the rule.
"""

from __future__ import annotations

import os

from ...errors import SandboxSetupError
from ...linux._sys import mount

#: the overlay's options besides the layers: nothing the lower layers could redirect to
OVERLAY_OPTIONS = "redirect_dir=nofollow,index=off,metacopy=off,xino=off"
#: the directory of the run base where the shared overlays are (not a run dir: the
#: sweep of dead run dirs passes over it)
SHARED = "images"
LAYERED_NEEDS_ROOT = ("an image with layers is an overlay corral mounts on the host, which "
                      "needs root; run corral as root")


def image_root(run_dir, op) -> str:
    """The shared read-only overlay of op.layers over op.tree, mounted if it is not yet;
    returns its path."""
    import fcntl
    import hashlib
    import json

    lowers = [*reversed(op.layers), op.tree]
    for p in lowers:
        if any(c in p for c in ",:\\\n"):   # the option string's separators
            raise SandboxSetupError(f"the image store's path {p!r} holds a ',', ':' or '\\'; "
                                    "an overlay cannot name it (set CORRAL_STATE_DIR to a "
                                    "plain path)", step="image")
    shared = os.path.join(run_dir.base, SHARED)
    path = os.path.join(shared, hashlib.sha256("\0".join(lowers).encode()).hexdigest()[:32])
    if os.path.ismount(path) and _current(path):
        return path
    os.makedirs(shared, 0o711, exist_ok=True)
    fd = os.open(os.path.join(shared, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.path.ismount(path) and _current(path):   # another run mounted it meanwhile
            return path
        _sweep(shared)   # this one too, if its directories were replaced
        os.makedirs(path, 0o755, exist_ok=True)
        ids = [_ident(p) for p in lowers]
        try:
            mount("overlay", path, "overlay", 0, f"lowerdir={':'.join(lowers)},{OVERLAY_OPTIONS}")
        except OSError as e:
            raise SandboxSetupError(f"mounting the image's layers on {path}: {e.strerror}",
                                    step="image", errno=e.errno) from None
        with open(path + ".lowers", "w") as f:
            json.dump([[p, *i] for p, i in zip(lowers, ids)], f)
        return path
    finally:
        os.close(fd)


def _ident(p: str) -> list[int]:
    st = os.stat(p)
    return [st.st_dev, st.st_ino]


def _current(path: str) -> bool:
    """Whether the shared overlay at path still lies on the very directories it was
    mounted on (an image removed and stored again has new ones, under the same names)."""
    import json

    try:
        with open(path + ".lowers") as f:
            lowers = json.load(f)
        return bool(lowers) and all(_ident(p) == [dev, ino] for p, dev, ino in lowers)
    except (OSError, ValueError, TypeError):
        return False


def sweep_shared(base: str | None = None) -> list[str]:
    """Detach the shared overlays whose lower directories are gone; returns their paths."""
    import fcntl

    from ...linux.rundir import base_dir

    shared = os.path.join(base or base_dir(), SHARED)
    if not os.path.isdir(shared):
        return []
    fd = os.open(os.path.join(shared, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _sweep(shared)
    finally:
        os.close(fd)


def _sweep(shared: str) -> list[str]:
    from ...linux._sys import umount

    gone = []
    for e in sorted(os.listdir(shared)):
        path = os.path.join(shared, e)
        if e.startswith(".") or e.endswith(".lowers") or (os.path.ismount(path)
                                                          and _current(path)):
            continue
        while os.path.ismount(path):   # stacked by a race: every one
            if umount(path):
                break
        for p in (path + ".lowers",):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(path)
        except OSError:
            pass
        gone.append(path)
    return gone
