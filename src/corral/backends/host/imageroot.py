"""The root of a run on a layered image: its layers over its base tree, one read-only overlay.

    root = mount_image_root(run_dir, op)       # op: a resolved ImageRoot with layers
    bwrap --ro-bind root /                     (runsc: the bundle's rootfs, at `target`)

An image without layers needs none of this: the tiers bind the store's tree itself. With
layers, overlayfs is mounted on the host, in corral's run dir (or on the gvisor bundle's
rootfs directory), with only lower directories (top layer first, the base tree last): such
an overlay has no upper directory, so it is read-only whatever is mounted over it, and it
writes nothing to the store. The layers' whiteouts (0/0 character devices) and opaque
directories are the ones tree.py made from OCI `.wh.` names; no redirects, no index, no
metacopy are followed. The mount goes with the run dir (run_dir.mounts).

Mounting an overlay needs root here (bookworm's bubblewrap, 0.8, cannot mount one itself);
the namespace tier refuses a layered image without root, naming the rule.
"""

from __future__ import annotations

import os

from ...errors import SandboxSetupError
from ...linux._sys import mount

#: the overlay's options besides the layers: nothing the lower layers could redirect to
OVERLAY_OPTIONS = "redirect_dir=nofollow,index=off,metacopy=off,xino=off"
LAYERED_NEEDS_ROOT = ("an image with layers is an overlay corral mounts on the host, which "
                      "needs root; run corral as root")


def mount_image_root(run_dir, op, target: str | None = None) -> str:
    """Mount the overlay of op.layers over op.tree at `target` (default: a directory of the
    run dir made here); returns the mount point."""
    lowers = [*reversed(op.layers), op.tree]
    for p in lowers:
        if any(c in p for c in ",:\\\n"):   # the option string's separators
            raise SandboxSetupError(f"the image store's path {p!r} holds a ',', ':' or '\\'; "
                                    "an overlay cannot name it (set CORRAL_STATE_DIR to a "
                                    "plain path)", step="image")
    if target is None:
        target = os.path.join(run_dir.path, "image-root")
        os.mkdir(target, 0o755)
    try:
        mount("overlay", target, "overlay", 0,
              f"lowerdir={':'.join(lowers)},{OVERLAY_OPTIONS}")
    except OSError as e:
        raise SandboxSetupError(f"mounting the image's layers on {target}: {e.strerror}",
                                step="image", errno=e.errno) from None
    run_dir.mounts.append(target)
    return target
