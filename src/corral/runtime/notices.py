"""Notices `corral run` prints at most once a day per host (and user).

A tier's standing gaps (the process tier has no namespaces) do not change from run to run,
so repeating a 300-character line on every run only buries the output; `--json` keeps the
event in every Result. Whether a notice was shown is a stamp file in corral's cache
directory (`<run dir base>/cache`, see rundir.py): owner-only, opened without following
symlinks at any step, its mtime the time it was last shown. Any doubt (the directory
missing or not ours, a stamp that is not a plain file of ours) means: show it.

Loaded by the CLI only when a run reported such an event.
"""

from __future__ import annotations

import os
import time

#: how long a shown notice stays quiet
QUIET_S = 86400.0


def cache_dir() -> str:
    from ..linux.rundir import base_dir

    return os.path.join(base_dir(), "cache")


def due(key: str, directory: str | None = None, now: float | None = None) -> bool:
    """True (and the stamp renewed) when the notice `key` was not shown in the last
    QUIET_S seconds here. `key` is a file name: [A-Za-z0-9._-] only."""
    if not key or not all(c.isalnum() or c in "._-" for c in key) or key.startswith("."):
        raise ValueError(f"bad notice key {key!r}")
    now = time.time() if now is None else now
    name = f"notice-{key}"
    try:
        dfd = _open_dir(directory or cache_dir())
    except OSError:
        return True
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and _ours(st) and 0 <= now - st.st_mtime < QUIET_S:
            return False
        if st is not None and not _ours(st):
            os.unlink(name, dir_fd=dfd)   # a symlink or a stranger's file: replace it
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            os.fchmod(fd, 0o600)
            os.utime(fd, (now, now))
        finally:
            os.close(fd)
    except OSError:
        pass   # an unwritable stamp only means the notice shows again next time
    finally:
        os.close(dfd)
    return True


def _ours(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _open_dir(path: str) -> int:
    """An fd of `path`, made (0700) if missing, reached without following a symlink at
    any component, and refused unless it is ours and closed to others."""
    if not os.path.isabs(path):
        raise OSError(f"{path} is not absolute")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    try:
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            if part in (".", ".."):
                raise OSError(f"{path} has a {part} component")
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if i != len(parts) - 1:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                nfd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nfd
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise OSError(f"{path} is not ours alone")
    except BaseException:
        os.close(fd)
        raise
    return fd


def standing(e: dict) -> bool:
    """An unenforced part of the tier itself (e.g. the process tier's missing namespaces):
    no policy key names it, so no policy changes it, and it is the same on every run."""
    from ..policy.schema import SECTIONS

    rule = e.get("rule") or ""
    return e["kind"] == "unenforced" and rule.split(".")[0] not in (
        *SECTIONS, "isolation", "secrets")


def due_event(e: dict) -> bool:
    """Whether a standing notice (an event) is due on stderr: once a day per host and user."""
    import zlib

    key = f"{e.get('tier')}-{e['rule']}-{zlib.crc32(str(e.get('reason')).encode()):08x}"
    try:
        return due(key)
    except ValueError:   # a name unfit for a file name: show it every time
        return True
