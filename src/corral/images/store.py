"""The image store: content-addressed, read-only root trees under corral's state directory.

    STATE/images/
      trees/HEX/        the tree of image sha256:HEX, every mode `& 0o555` (read-only), owned
                        by whoever runs corral (root, normally)
      meta/HEX.json     its metadata: names, created, size, source, env, workdir, base,
                        layers, lock, sbom
      meta/HEX.manifest the manifest its digest is the sha256 of (tree.py)
      names.json        name -> digest
      tmp/              builds in progress; nothing here is an image
      .lock             flock held while the store changes

STATE is $CORRAL_STATE_DIR, else /var/lib/corral for root, else $XDG_DATA_HOME/corral
(~/.local/share/corral). A build unpacks into tmp/, computes the digest, makes the tree
read-only, renames it to trees/HEX and then writes meta/HEX.json (the rename is the moment
the tree appears; the metadata the moment it is an image): nothing half-built is ever
listed, and `gc` removes trees without metadata and stale tmp/ entries.

Sandboxes see a tree only through read-only binds (namespace: bwrap --ro-bind; gvisor: a
read-only OCI root) and as an unprivileged uid that owns nothing in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

from ..errors import ImageError
from .tree import Limits, TreeBuilder, digest_of

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
META_MAX = 64 << 20     # bytes of one metadata file read back


def state_dir() -> str:
    d = os.environ.get("CORRAL_STATE_DIR")
    if d:
        return os.path.abspath(d)
    if os.geteuid() == 0:
        return "/var/lib/corral"
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(xdg, "corral")


def check_name(name: str, field: str = "--name") -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name == "host":
        raise ImageError(f"{name!r} is not an image name: lower-case letters, digits, '.', "
                         "'_' and '-', at most 63, not 'host'", field=field)
    return name


class Store:
    def __init__(self, root: str | None = None) -> None:
        self.root = os.path.join(root or state_dir(), "images")
        self.trees = os.path.join(self.root, "trees")
        self.meta = os.path.join(self.root, "meta")
        self.tmp = os.path.join(self.root, "tmp")
        self.names_file = os.path.join(self.root, "names.json")

    # -- layout and locking ----------------------------------------------------------------
    def ensure(self) -> None:
        for d, mode in ((self.root, 0o711), (self.trees, 0o711), (self.meta, 0o700),
                        (self.tmp, 0o700)):
            os.makedirs(d, mode, exist_ok=True)
            os.chmod(d, mode)

    def lock(self):
        import fcntl

        self.ensure()
        fd = os.open(os.path.join(self.root, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _Held(fd)

    def tempdir(self, prefix: str) -> str:
        import tempfile

        self.ensure()
        return tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=self.tmp)

    # -- names ---------------------------------------------------------------------------------
    def names(self) -> dict[str, str]:
        try:
            with open(self.names_file, "rb") as f:
                data = json.loads(f.read(META_MAX))
        except FileNotFoundError:
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)}

    def _write_json(self, path: str, data) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def tag(self, name: str, digest: str) -> None:
        check_name(name)
        with self.lock():
            names = self.names()
            names[name] = digest
            self._write_json(self.names_file, names)

    # -- lookup --------------------------------------------------------------------------------
    def resolve(self, ref: str, field: str = "image") -> str:
        """The digest a name or digest refers to; ImageError when it is not in the store."""
        if ref.startswith("sha256:"):
            if not DIGEST_RE.fullmatch(ref):
                raise ImageError(f"{ref!r} is not a digest (sha256: and 64 hex digits)",
                                 field=field)
            if not os.path.exists(self._meta_path(ref)):
                raise ImageError(f"no image {ref} in the store ({self.root}); corral image ls "
                                 "lists them", field=field)
            return ref
        digest = self.names().get(ref)
        if digest is None or not os.path.exists(self._meta_path(digest)):
            from .catalogue import CATALOGUE

            hint = (f"build it with: corral image build {ref}" if ref in CATALOGUE
                    else "corral image build FILE --name NAME or corral image import FILE "
                         "--name NAME makes one")
            raise ImageError(f"no image named {ref!r} in the store ({self.root}); {hint}",
                             field=field)
        return digest

    def _hex(self, digest: str) -> str:
        return digest.split(":", 1)[1]

    def _meta_path(self, digest: str) -> str:
        return os.path.join(self.meta, self._hex(digest) + ".json")

    def tree(self, digest: str) -> str:
        return os.path.join(self.trees, self._hex(digest))

    def info(self, digest: str) -> dict:
        with open(self._meta_path(digest), "rb") as f:
            meta = json.loads(f.read(META_MAX))
        meta["names"] = sorted(n for n, d in self.names().items() if d == digest)
        return meta

    def manifest(self, digest: str) -> bytes:
        with open(os.path.join(self.meta, self._hex(digest) + ".manifest"), "rb") as f:
            return f.read()

    def images(self) -> list[dict]:
        out = []
        try:
            entries = sorted(os.listdir(self.meta))
        except FileNotFoundError:
            return []
        for e in entries:
            if e.endswith(".json") and DIGEST_RE.fullmatch("sha256:" + e[:-5]):
                out.append(self.info("sha256:" + e[:-5]))
        return out

    # -- adding ----------------------------------------------------------------------------------
    def new_tree(self, limits: Limits | None = None) -> tuple[str, TreeBuilder]:
        """A temporary directory for one build, and a TreeBuilder on its `tree`."""
        work = self.tempdir("build")
        tree = os.path.join(work, "tree")
        os.mkdir(tree, 0o755)
        return work, TreeBuilder(tree, limits)

    def commit(self, work: str, builder: TreeBuilder, meta: dict,
               name: str | None = None) -> str:
        """Finish the tree in `work`, move it into place and record it; returns its digest.
        `work` is removed either way."""
        try:
            builder.add_mount_points()
            manifest, size = builder.finish()
            digest = digest_of(manifest)
            hexd = self._hex(digest)
            meta = {**meta, "digest": digest, "size": size,
                    "created": meta.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime())}
            with self.lock():
                dest = self.tree(digest)
                if not os.path.exists(dest):
                    os.chmod(builder.path, 0o555)
                    os.rename(builder.path, dest)
                mpath = os.path.join(self.meta, hexd + ".manifest")
                if not os.path.exists(mpath):
                    with open(mpath + ".tmp", "wb") as f:
                        f.write(manifest)
                    os.replace(mpath + ".tmp", mpath)
                if os.path.exists(self._meta_path(digest)):
                    old = self.info(digest)
                    meta["created"] = old.get("created", meta["created"])
                meta.pop("names", None)
                self._write_json(self._meta_path(digest), meta)
                if name:
                    names = self.names()
                    names[name] = digest
                    self._write_json(self.names_file, names)
            return digest
        finally:
            builder.close()
            remove_tree(work)

    # -- removing --------------------------------------------------------------------------------
    def remove(self, ref: str) -> list[str]:
        """Remove a name (the image goes when no name is left) or a digest (the image and
        every name of it). Returns what was removed."""
        with self.lock():
            names = self.names()
            if ref.startswith("sha256:"):
                digest = self.resolve(ref)
                gone = [n for n, d in names.items() if d == digest]
                for n in gone:
                    del names[n]
            else:
                digest = self.resolve(ref)
                del names[ref]
                gone = [ref]
            self._write_json(self.names_file, names)
            removed = [f"name {n}" for n in gone]
            if digest not in names.values():
                self._drop(digest)
                removed.append(digest)
            return removed

    def _drop(self, digest: str) -> None:
        hexd = self._hex(digest)
        for p in (self._meta_path(digest), os.path.join(self.meta, hexd + ".manifest")):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        t = self.tree(digest)
        if os.path.lexists(t):
            remove_tree(t)

    def gc(self) -> list[str]:
        """Remove unnamed images, trees without metadata, and tmp/ entries whose builder is
        gone. Returns what went."""
        out = []
        with self.lock():
            named = set(self.names().values())
            for meta in self.images():
                if meta["digest"] not in named:
                    self._drop(meta["digest"])
                    out.append(meta["digest"])
            for e in sorted(os.listdir(self.trees)):
                if not os.path.exists(os.path.join(self.meta, e + ".json")):
                    remove_tree(os.path.join(self.trees, e))
                    out.append(f"tree {e}")
            for e in sorted(os.listdir(self.tmp)):
                pid = e.split("-")[1] if e.count("-") >= 2 else ""
                if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
                    continue   # a build in progress
                remove_tree(os.path.join(self.tmp, e))
                out.append(f"tmp {e}")
        return out


class _Held:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def remove_tree(path: str) -> None:
    """rmtree for read-only trees: write permission is given back to each directory first
    (only the owner, corral, can), never following a link."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    for dirpath, dirnames, _ in os.walk(path, followlinks=False):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
    shutil.rmtree(path)


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
