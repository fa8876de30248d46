"""The registry of live sandboxes that have a supervisor process of their own, so that
another process on the host can find them (`Sandbox.connect(id)`, `corral sandbox ls`).

    <base>/sandboxes/            0700, owned by corral's uid (base: linux/rundir.base_dir())
    <base>/sandboxes/<id>.json   one entry per sandbox: {"id", "pid", "socket", "created",
                                 "ends", "isolation", "policy_digest", "metadata"}

Entries are written atomically (a temporary name made with O_EXCL | O_NOFOLLOW in the
same directory, then rename) and read without following a symbolic link, only when owned
by corral's uid, not writable by others and at most MAX_ENTRY bytes; a malformed entry is
skipped. An entry whose supervisor is gone (its run directory's lock is free, or the run
directory is missing) is stale: `entries()` leaves it out and removes it, and the run
directory sweep (rundir.sweep_stale) removes it with the rest of a dead sandbox.
"""

from __future__ import annotations

import fcntl
import json
import os
import re

from ..errors import SandboxClosed, UsageError
from ..linux import rundir

#: bytes of one entry: room for the largest metadata Sandbox.create takes (64 keys of 128
#: characters to values of 1024, each character at most 12 bytes as JSON escapes it) and
#: the rest; it was 64 KiB, less than valid metadata could need
MAX_ENTRY = 1 << 20
ID_RE = re.compile(f"[0-9a-f]{{{rundir.ID_LEN}}}")


def registry_dir(base: str | None = None, *, create: bool = False) -> str:
    """The registry directory, checked: a real directory (no link), corral's, mode 0700."""
    base = base or rundir.base_dir()
    path = os.path.join(base, rundir.REGISTRY)
    if create:
        rundir._ensure_base(base)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(path)
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxClosed(f"{path} is not a directory owned by uid {os.geteuid()} with "
                            f"mode 0700; remove it")
    return path


def check_id(sandbox_id) -> str:
    if not isinstance(sandbox_id, str) or not ID_RE.fullmatch(sandbox_id):
        raise UsageError(f"{sandbox_id!r} is not a sandbox id ({rundir.ID_LEN} hex digits, "
                         f"as `corral sandbox ls` shows)", field="id")
    return sandbox_id


def write_entry(entry: dict, base: str | None = None) -> str:
    d = registry_dir(base, create=True)
    sid = check_id(entry["id"])
    data = json.dumps(entry, sort_keys=True).encode()
    if len(data) > MAX_ENTRY:
        raise ValueError("registry entry too large")
    tmp = os.path.join(d, f".{sid}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    final = os.path.join(d, sid + ".json")
    os.rename(tmp, final)
    return final


def remove_entry(sandbox_id: str, base: str | None = None) -> None:
    try:
        os.unlink(os.path.join(base or rundir.base_dir(), rundir.REGISTRY,
                               check_id(sandbox_id) + ".json"))
    except FileNotFoundError:
        pass


def read_entry(sandbox_id: str, base: str | None = None) -> dict | None:
    """The entry, or None if absent, malformed, not ours or stale."""
    sid = check_id(sandbox_id)
    base = base or rundir.base_dir()
    try:
        d = registry_dir(base)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(os.path.join(d, sid + ".json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > MAX_ENTRY:
            return None
        data = os.read(fd, MAX_ENTRY + 1)
    finally:
        os.close(fd)
    entry = _parse(data, sid)
    if entry is None:
        return None
    if not _alive(base, sid):
        remove_entry(sid, base)
        return None
    return entry


def _parse(data: bytes, sid: str) -> dict | None:
    try:
        e = json.loads(data)
    except ValueError:
        return None
    want = {"id": str, "pid": int, "socket": str, "created": (int, float),
            "ends": (int, float), "isolation": str, "policy_digest": str, "metadata": dict}
    if not isinstance(e, dict) or set(e) != set(want) or e["id"] != sid:
        return None
    for k, t in want.items():
        if not isinstance(e[k], t) or isinstance(e[k], bool):
            return None
    return e


def _alive(base: str, sid: str) -> bool:
    """Whether the sandbox's supervisor holds its run directory's lock."""
    try:
        fd = os.open(os.path.join(base, sid, "lock"), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True      # held: alive
    finally:
        os.close(fd)
    return False


def entries(base: str | None = None) -> list[dict]:
    """Every live entry, oldest first."""
    base = base or rundir.base_dir()
    try:
        names = os.listdir(registry_dir(base))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        sid, dot, ext = name.partition(".")
        if dot and ext == "json" and ID_RE.fullmatch(sid):
            e = read_entry(sid, base)
            if e is not None:
                out.append(e)
    return sorted(out, key=lambda e: e["created"])
