"""What of a sandbox the host can reach as plain host directories: the mounts that outlive
each exec (scratch, the workspace), for the files API over a sandbox that has no process
to take a root from (today's per-exec Sandbox, and gVisor, whose root is in its own
kernel). Each as (mount point inside, O_PATH fd of the host directory, writable); the
caller closes the fds. The directories are corral's own (the run dir's scratch tmpfs, the
workspace mount made from a no-follow fd), opened without following a link."""

from __future__ import annotations

import os

from ...errors import UnsupportedRule
from ...plan import SCRATCH, WorkspaceMount

#: scratch's directories and where the namespace and gvisor tiers mount them
SCRATCH_MOUNTS = (("home", SCRATCH), ("tmp", "/tmp"), ("shm", "/dev/shm"))
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def persistent_mounts(live) -> list[tuple[str, int, bool]]:
    """The scratch and workspace mounts of a namespace or gvisor LiveSandbox, or what a
    LiveSandbox with a `file_mounts()` of its own gives (the wasm tier: /scratch and the
    workspace, the guest's preopens)."""
    name = type(live).__name__
    own = getattr(live, "file_mounts", None)   # a tier that says what of it is reachable
    if own is not None:
        return own()
    if name not in ("NamespaceSandbox", "GvisorSandbox", "GvisorLive"):
        raise UnsupportedRule(f"the files API is not built for {name}'s tier (its sandbox "
                              "sees host paths); use the namespace or gvisor tier",
                              field="isolation")
    out: list[tuple[str, int, bool]] = []
    try:
        for sub, dest in SCRATCH_MOUNTS:
            out.append((dest, os.open(os.path.join(live.scratch, sub), _DIR), True))
        for op in live.plan.find(WorkspaceMount):
            src = getattr(live, "workspace_src", None)
            if src is not None:
                fd = os.open(src, _DIR)
            else:   # the namespace tier without root: the no-follow fd it binds
                fd = os.dup(live.fds[""])
            out.append((op.dest, fd, op.writable))
    except BaseException:
        for _, fd, _ in out:
            os.close(fd)
        raise
    return out
