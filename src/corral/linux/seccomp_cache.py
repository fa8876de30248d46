"""The namespace tier's seccomp program, cached: what a sandbox's start needs of it.

A program is compiled once per host (linux/seccomp.py: the tables and libseccomp) and kept
in a cache file named by a digest of what it is made from (cache_key: the identities of
the files it comes from); a hit reads the file and never loads seccomp.py's tables or
libseccomp (`corral run`'s path imports this module only).
The file is trusted only in a directory of ours that no one else may write or list, as a
regular file with one link, ours, mode 0600 at most, ending in the SHA-256 of its name and
the program (`_read_cache`).
"""

from __future__ import annotations

import os
import stat

from ..errors import BackendUnavailable

#: the profile's version, in the cache's file names (the tables are in seccomp.py, which
#: re-exports it; the key follows that file's identity, so an edit needs no bump)
PROFILE_VERSION = "2"
#: the file whose bytes hold every table and rule of the profile
PROFILE_SOURCE = os.path.join(os.path.dirname(__file__),
                              "seccomp" + os.path.splitext(__file__)[1])


def _binding_file() -> str | None:
    """Where `import seccomp` would load the binding from, found without importlib.util
    (which costs start-up time): the first sys.path entry holding `seccomp` with one of
    this interpreter's extension suffixes, tried in the import system's order. An access()
    of each candidate, not a listing of each directory (~0.3 ms of every `corral run`)."""
    import sys
    from _imp import extension_suffixes  # built in: what importlib.machinery reads

    suffixes = extension_suffixes()
    for d in sys.path:
        for suffix in suffixes:
            path = f"{d or '.'}/seccomp{suffix}"
            if os.access(path, os.F_OK) and os.path.isfile(path):
                return path
    return None


def _identity(path: str) -> tuple[int, ...]:
    """What changes whenever a file's content does: its device and inode (a file written
    anew and renamed into place, as pip and dpkg install), its size, and both its
    modification and its change time (a write in place sets both, and the change time
    cannot be set back by hand, as `touch -d` sets the other)."""
    st = os.stat(path)   # through a link: the file itself
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def cache_key() -> str:
    """A digest of what the program is made from: the profile version, the arch,
    libseccomp's identity and the identities (_identity: device, inode, size, mtime and
    ctime) of seccomp.py (every table and rule is in it) and of this file, so a hit reads
    neither the tables nor libseccomp.

    libseccomp is linked statically into its Python binding (upstream's setup.py links
    libseccomp.a; Debian's python3-seccomp does the same), so the binding file's identity
    stands for the libseccomp version without importing it. The files' identities, not
    their bytes: any edit or reinstall of them changes one (comments included), and three
    stats cost ~10 us where reading and hashing their 35 KB cost ~0.1 ms of every start;
    an unchanged file merely copied elsewhere gives a new key (one compile, a few ms)."""
    origin = _binding_file()
    if origin is None:
        from .seccomp import _libseccomp

        _libseccomp()  # raises BackendUnavailable with the fix
        raise BackendUnavailable("libseccomp's Python binding has no file; reinstall "
                                 "python3-seccomp", field="isolation")
    ident = [PROFILE_VERSION, os.uname().machine, _identity(origin)]
    for path in (PROFILE_SOURCE, __file__):   # the .py, or the .pyc of a sourceless install
        ident.append(_identity(path))
    return _sha256(repr(ident).encode()).hex()[:32]


def _sha256(data: bytes) -> bytes:
    try:   # hashlib's own built-in implementation: hashlib itself loads OpenSSL (~4 ms)
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
    return sha256(data).digest()


#: the program this process built or read, by cache dir: the rules cannot change while it
#: runs, and neither can the libseccomp it would use (it is linked into the binding)
_built: dict[str | None, bytes] = {}

#: a cache file: the program, then the SHA-256 of its file name (which holds the key)
#: and the program; at most a program bwrap takes from the gate pipe in one write
_DIGEST = 32
_MAX_PROGRAM = 4096


def bpf_bytes(cache_dir: str | None) -> bytes:
    """compile_bpf(), cached in cache_dir and in this process. A hit neither imports nor
    runs libseccomp. An unusable cache dir (missing and not creatable, read-only, not ours)
    means: compile."""
    data = _built.get(cache_dir)
    if data is not None:
        return data
    if cache_dir is None:
        data = _compile()
    else:
        path = os.path.join(cache_dir, f"seccomp-{PROFILE_VERSION}-{cache_key()}.bpf")
        data = _read_cache(path)
        if data is None:
            data = _compile()
            _write_cache(cache_dir, path, data)
    _built[cache_dir] = data
    return data


def _compile() -> bytes:
    from .seccomp import compile_bpf  # only on a miss: the tables and libseccomp

    return compile_bpf()


def _file_digest(path: str, data: bytes) -> bytes:
    return _sha256(os.path.basename(path).encode() + b"\0" + data)


def _write_cache(cache_dir: str, path: str, data: bytes) -> None:
    """Store a compiled program atomically (temp file + rename), mode 0600 in a 0700
    directory, followed by its digest; a cache dir that cannot be written is no error: the
    compiled program is just as good."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data + _file_digest(path, data))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def _read_cache(path: str) -> bytes | None:
    """The cached program, or None (then it is compiled and the file written again) unless
    all of these hold: the directory is ours (the effective uid's), a directory, not a
    link, and no one else may write or list it; the file, opened without following a
    link, is a regular file with one link, ours, mode 0600 at most; it ends in the SHA-256
    of its name and the program, and the program is a whole number of BPF instructions of
    at most 4096 bytes. The directory is the trust anchor: only its owner (root, for the
    namespace tier) can put a file there; the digest catches a cut, damaged or renamed one."""
    euid = os.geteuid()
    try:
        dst = os.lstat(os.path.dirname(path))
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not (stat.S_ISDIR(dst.st_mode) and dst.st_uid == euid and not dst.st_mode & 0o077
                and stat.S_ISREG(st.st_mode) and st.st_uid == euid and st.st_nlink == 1
                and not st.st_mode & 0o077):
            return None
        raw = f.read(_MAX_PROGRAM + _DIGEST + 1)
    data, digest = raw[:-_DIGEST], raw[-_DIGEST:]
    if not data or len(data) % 8 or len(data) > _MAX_PROGRAM:
        return None
    if _file_digest(path, data) != digest:
        return None
    return data


def bpf_fd(data: bytes) -> int:
    """An inheritable, sealed memfd holding `data`, positioned at 0, for `bwrap --seccomp
    FD` (pass it with pass_fds). bwrap reads from the current offset: lseek to 0 before
    reusing the fd for another run. The caller closes it."""
    import fcntl

    fd = os.memfd_create("corral-seccomp", os.MFD_ALLOW_SEALING)  # no MFD_CLOEXEC
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
