"""A one-shot run's sandbox mount namespace, kept past the sandbox's end.

A mount namespace is torn down when its last reference goes: by default in the exit of
the last process in it, the sandbox's pid 1. That teardown unmounts the sandbox's whole
tree and then waits for an (expedited) RCU grace period, inside pid 1's exit, which a run
waits for before its Result (namespace.py's _reap_init: every process reaped, the cgroup
checked empty). On an idle core it is a few hundred microseconds; on busy cores it was the
one wait of corral's own with a tail (docs/reliability.md, "The soak's `true` tail").

corral.run()'s one-shot sandbox (namespace.py: `one_shot`) therefore keeps an fd of the
namespace, taken from pid 1's pidfd while it lives (before the seccomp gate is filled),
and its teardown thread (host/deferred.py) closes it before it unmounts the scratch
tmpfs: the kernel then frees the dead tree there, off the run's path. Only as root, and
only when the run dir has no mount but the scratch tmpfs (no workspace, review overlay,
bind, image root or devpts): a kept namespace keeps what is mounted in it, and nothing of
the caller's may stay mounted anywhere after run() returns. A supervisor killed before the
close loses the fd with its life (the kernel frees the namespace then). A kernel without
PIDFD_GET_MNT_NAMESPACE (Linux < 6.11): nothing is kept, the teardown stays in pid 1's exit.
"""

from __future__ import annotations

import os

#: ioctl(pidfd, PIDFD_GET_MNT_NAMESPACE): an fd (O_CLOEXEC) of the process's mount
#: namespace (linux/pidfd.h: _IO(PIDFS_IOCTL_MAGIC 0xFF, 3); Linux 6.11)
PIDFD_GET_MNT_NAMESPACE = 0xFF03


def keep(pidfd: int) -> tuple[int, ...]:
    """(an fd of the mount namespace of the process behind pidfd,), or () when the kernel
    cannot give one (then nothing is kept)."""
    import fcntl

    try:
        return (fcntl.ioctl(pidfd, PIDFD_GET_MNT_NAMESPACE),)
    except OSError:
        return ()


def release(fds: tuple[int, ...]) -> list[str]:
    """Close what keep() returned (the kernel then unmounts the dead tree). Returns
    teardown problems: none, closing an fd of ours does not fail."""
    for fd in fds:
        os.close(fd)
    return []
