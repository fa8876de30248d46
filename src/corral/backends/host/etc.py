"""The sandbox's /etc, built once per host and shared read-only by every sandbox.

    path, binds = ensure_etc(base, prebind=os.geteuid() == 0)
    # the sandbox binds `path` at /etc, then each of `binds` (host dirs) at its own path

It holds a few generated files (passwd, group, hosts, resolv.conf, ...) and what
plan.ETC_BINDS names from the host's /etc:

- regular files (ld.so.cache, services, mime.types, ...): copied, if world-readable (a
  file only root may read is left out). Every call compares each source's inode, mtime and
  size with those of its copy and copies again what changed (write, then rename), so a
  package update that rewrites one reaches the next sandbox;
- symlinks into /usr (localtime): the same symlink;
- directories (ssl, alternatives, python3, ...): bound. As root (`prebind`) corral binds
  them into the shared tree once, read-only, nosuid, nodev, and a sandbox then needs one
  recursive bind for all of /etc; otherwise each sandbox binds them itself.

One bind instead of sixteen matters: bubblewrap re-reads /proc/self/mountinfo for every
bind it makes, and those sixteen took ~1.1 ms of a 6.8 ms `/bin/true` here (bench/).

A change in which sources exist, or in their kind or a link's target, gives a tree of
another name (its hash); older trees stay until the base tmpfs goes (a reboot).
"""

from __future__ import annotations

import binascii
import os
import stat

from ...plan import ETC_BINDS, SYSTEM_PATHS

HOSTNAME = "corral"
VERSION = "3"
#: generated files; `corral-ca.pem` is the mount point of a run's CA bundle (grants)
FILES = {
    "passwd": "root:x:0:0:sandbox:/scratch:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": f"{HOSTNAME}\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
                     "networks: files\nprotocols: files\nservices: files\n",
    "resolv.conf": "# no resolver inside a corral sandbox\n",
    "corral-ca.pem": "",
}
#: trees whose directory binds this process has seen in place
_bound: set[str] = set()
#: a check is good for this long (seconds): a package update reaches sandboxes started a
#: second later, and a busy supervisor does not stat sixteen files per sandbox
RECHECK_S = 1.0
_last: dict[tuple, tuple[float, tuple[str, tuple[str, ...]]]] = {}


def _sources(sources) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """(layout, fingerprints): layout lists (path, kind, link target) of every source as
    it is now, kind one of dir, file, link or absent; fingerprints maps each file source to
    its inode, mtime and size."""
    layout, prints = [], {}
    for p in sources:
        try:
            st = os.lstat(p)
            link = stat.S_ISLNK(st.st_mode)
            if link:
                st = os.stat(p)
        except OSError:
            layout.append((p, "absent", ""))
            continue
        target = ""
        if stat.S_ISDIR(st.st_mode):
            kind = "dir"
        elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o004:
            real = os.path.realpath(p) if link else p
            if real != p and real.startswith("/usr/"):
                kind, target = "link", real
            else:
                kind = "file"
                prints[p] = f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
        else:
            kind = "absent"   # not world-readable, or not a file: left out
        layout.append((p, kind, target))
    return layout, prints


def ensure_etc(base: str, *, prebind: bool, sources=ETC_BINDS,
               root: str = "/etc") -> tuple[str, tuple[str, ...]]:
    """The shared /etc tree below `base`, up to date: (its path, the host directories a
    sandbox must still bind at their own paths: none once `prebind` has bound them).
    `sources` are host paths below `root` (tests point them elsewhere)."""
    import time

    key = (base, prebind, sources, root, os.getpid())
    now = time.monotonic()
    last = _last.get(key)
    if last is not None and now - last[0] < RECHECK_S:
        return last[1]
    found = _ensure(base, prebind, sources, root)
    _last[key] = (now, found)
    return found


def _ensure(base: str, prebind: bool, sources, root: str) -> tuple[str, tuple[str, ...]]:
    layout, prints = _sources(sources)
    digest = f"{binascii.crc32(repr(layout).encode()):08x}"
    path = os.path.join(base, f"etc-v{VERSION}-{digest}")
    dirs = tuple(p for p, kind, _ in layout if kind == "dir")
    state = _state_text(prints)
    try:
        with open(path + ".state") as f:
            fresh = f.read() == state
    except OSError:
        fresh = False
    if fresh and prebind and path not in _bound and _all_bound(path, root, dirs):
        _bound.add(path)   # another process made and bound it: nothing to lock or write
    if not fresh or prebind and path not in _bound:
        _update(base, path, root, layout, prints, state, dirs if prebind else ())
        if prebind:
            _bound.add(path)
    return path, () if prebind else dirs


def _all_bound(path: str, root: str, dirs: tuple[str, ...]) -> bool:
    """Is every directory bind of the tree in place? A mount point shows another device
    than the tree's own directory (the tree is on root's base tmpfs, never on a host
    /etc's filesystem); False when in doubt, and _update() looks properly (ismount)."""
    try:
        dev = os.lstat(path).st_dev
        return all(os.lstat(os.path.join(path, _below(p, root))).st_dev != dev for p in dirs)
    except OSError:
        return False


def _below(p: str, root: str) -> str:
    """os.path.relpath(p, root), without its two abspath()s for the usual case: a source
    path that is `root`, a slash, and a name with no `.`, `..` or empty part."""
    head = root.rstrip("/") + "/"
    rest = p[len(head):]
    if root and p.startswith(head) and rest and not {"", ".", ".."} & set(rest.split("/")):
        return rest
    return os.path.relpath(p, root)


def _state_text(prints: dict[str, str]) -> str:
    return "".join(f"{p} {v}\n" for p, v in sorted(prints.items()))


def _update(base: str, path: str, root: str, layout, prints: dict[str, str], state: str,
            bind_dirs: tuple[str, ...]) -> None:
    """Build or refresh the tree, under a lock shared with other supervisors."""
    import fcntl

    lock = os.open(os.path.join(base, "etc.lock"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC,
                   0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(path):
            _build(path, root, layout)
        try:
            with open(path + ".state") as f:
                old = dict(line.split(" ", 1) for line in f.read().splitlines())
        except OSError:
            old = {}
        for p, fp in prints.items():
            if old.get(p) != fp:
                _copy(p, os.path.join(path, os.path.relpath(p, root)))
        for p in bind_dirs:
            _bind_ro(p, os.path.join(path, os.path.relpath(p, root)))
        _write_atomic(path + ".state", state.encode(), 0o644)
    finally:
        os.close(lock)


def _build(path: str, root: str, layout) -> None:
    import shutil

    tmp = f"{path}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o755)
    for name, text in FILES.items():
        _write_atomic(os.path.join(tmp, name), text.encode(), 0o644)
    for p, kind, target in layout:
        dst = os.path.join(tmp, os.path.relpath(p, root))
        os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
        if kind == "dir":
            os.mkdir(dst, 0o755)          # a mount point
        elif kind == "link":
            os.symlink(target, dst)
        # files are copied by the caller, with their fingerprints
    os.chmod(tmp, 0o755)
    os.rename(tmp, path)


def _copy(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        data = f.read()
    _write_atomic(dst, data, 0o644)


def _write_atomic(dst: str, data: bytes, mode: int) -> None:
    tmp = f"{dst}.{os.getpid()}.new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.rename(tmp, dst)


def _bind_ro(src: str, dst: str) -> None:
    """src bound at dst, read-only, nosuid, nodev (once: a mount point is left alone)."""
    if os.path.ismount(dst):
        return
    from ...linux._sys import MS_NODEV, MS_NOSUID, mount

    MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
    mount(src, dst, "", MS_BIND | MS_REC, "")
    mount("none", dst, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, "")


#: system_binds()'s answer, with when it was found: the host's /usr, /bin, /lib... as
#: they are (a directory bound, a link made again) are looked at again after
#: SYSTEM_RECHECK_S (a usr-merge conversion reaches the sandboxes started a second later;
#: seven lstats and readlinks per start are waste)
SYSTEM_RECHECK_S = 1.0
_system: tuple[float, tuple[str, ...]] | None = None


def system_binds() -> list[str]:
    """bwrap's options for SYSTEM_PATHS: each directory bound read-only at its own path,
    each symbolic link made again inside."""
    import time

    global _system
    now = time.monotonic()
    if _system is None or now - _system[0] >= SYSTEM_RECHECK_S:
        a: list[str] = []
        for p in SYSTEM_PATHS:   # one lstat each: what islink() and (not a link) isdir() say
            try:
                mode = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                a += ["--symlink", os.readlink(p), p]
            elif stat.S_ISDIR(mode):
                a += ["--ro-bind", p, p]
        _system = (now, tuple(a))
    return list(_system[1])
