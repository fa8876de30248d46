"""The image store: content-addressed, read-only root trees under corral's state directory.

    STATE/images/
      trees/HEX/        the tree of image sha256:HEX, every mode `& 0o555` (read-only), owned
                        by whoever runs corral (root, normally)
      meta/HEX.json     its metadata: names, created, size, source, env, workdir, base,
                        layers, lock, sbom
      meta/HEX.manifest the manifest its digest is the sha256 of (tree.py)
      meta/HEX.run      what a run needs of it, small (tree, layers, env, workdir): read on
                        `corral run`'s path instead of the metadata and the manifest
      layers/LHEX/      a layer: what an install (or an imported OCI layer) put over its
                        base, with overlayfs whiteouts; read-only like the trees
      meta/LHEX.layer   the layer's manifest (tree.py); LHEX is its sha256
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

An image is a base tree and zero or more layers over it, in order. A base tree's digest is
its manifest's; an image of a base and one more layer has the digest
`sha256(LAYERED_V1 || "base " BASE_DIGEST "\n" || "layer " LAYER_DIGEST "\n")`, so the same
base and the same layer give the same image, and a layer is stored once whatever image
uses it. A run mounts the layers over the base tree as one read-only overlay
(backends/host/imageroot.py; `corral image rm` and `gc` detach the overlays of what they
removed). `rm` and `gc` keep every image another kept image is built on, and every layer
a kept image has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

from ..errors import ImageError
from ..linux.rundir import state_dir  # noqa: F401 - also this module's face
from .tree import Limits, TreeBuilder, digest_of

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
META_MAX = 64 << 20     # bytes of one metadata file read back
LAYERED_V1 = b"corral layered image v1\n"


def layered_digest(base: str, layer: str) -> str:
    """The digest of the image that is `base` (an image digest) plus one layer."""
    import hashlib

    data = LAYERED_V1 + f"base {base}\nlayer {layer}\n".encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


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
        self.layers = os.path.join(self.root, "layers")
        self.names_file = os.path.join(self.root, "names.json")

    # -- layout and locking ----------------------------------------------------------------
    def ensure(self) -> None:
        for d, mode in ((self.root, 0o711), (self.trees, 0o711), (self.meta, 0o700),
                        (self.tmp, 0o700), (self.layers, 0o711)):
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
        """The manifest of a base tree (an image without layers, or a layered one's root)."""
        with open(os.path.join(self.meta, self._hex(digest) + ".manifest"), "rb") as f:
            return f.read()

    def layer_path(self, layer: str) -> str:
        return os.path.join(self.layers, self._hex(layer))

    def layer_manifest(self, layer: str) -> bytes:
        with open(os.path.join(self.meta, self._hex(layer) + ".layer"), "rb") as f:
            return f.read()

    def run_info(self, digest: str) -> dict:
        """What a run on the image needs: {"root": base tree digest, "layers": [layer
        digests, bottom first], "env": [...], "workdir": a directory of the image or ""}.
        Read from meta/HEX.run (small); made from the metadata once when missing."""
        path = os.path.join(self.meta, self._hex(digest) + ".run")
        try:
            with open(path, "rb") as f:
                return json.loads(f.read(META_MAX))
        except FileNotFoundError:
            pass
        meta = self.info(digest)
        info = self._run_info(digest, meta)
        try:
            self._write_json(path, info)   # a store made before run files: once
        except OSError:
            pass                           # a store this user cannot write: every time
        return info

    def _run_info(self, digest: str, meta: dict) -> dict:
        layers = meta.get("layers") if isinstance(meta.get("layers"), list) else []
        info = {"root": meta.get("root") or digest, "layers": layers,
                "env": meta.get("env") or [], "workdir": ""}
        workdir = meta.get("workdir") or ""
        if workdir.startswith("/") and self._has_entry(info, workdir, "d"):
            info["workdir"] = os.path.normpath(workdir)
        return info

    def has_entry(self, digest: str, path: str, kind: str | None = None) -> bool:
        """Whether the image (its layers over its base) has `path`, of `kind` (d, f, l)
        when given: looked up in the manifests, never by following the tree's links."""
        return self._has_entry(self.run_info(digest), path, kind)

    def _has_entry(self, info: dict, path: str, kind: str | None = None) -> bool:
        from .tree import manifest_entry

        parts = os.path.normpath(path).strip("/").split("/")
        for layer in reversed(info["layers"]):
            verdict = _in_layer(self.layer_manifest(layer), parts, kind)
            if verdict is not None:
                return verdict
        got = manifest_entry(self.manifest(info["root"]), "/".join(parts))
        return got is not None and (kind is None or got[0] == kind)

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
                self._record(digest, meta, name)
            return digest
        finally:
            builder.close()
            remove_tree(work)

    def _record(self, digest: str, meta: dict, name: str | None) -> None:
        """Write an image's metadata (and run info), and its name; the lock is held."""
        if os.path.exists(self._meta_path(digest)):
            old = self.info(digest)
            meta["created"] = old.get("created", meta["created"])
        meta.pop("names", None)
        self._write_json(self._meta_path(digest), meta)
        self._write_json(os.path.join(self.meta, self._hex(digest) + ".run"),
                         self._run_info(digest, meta))
        if name:
            names = self.names()
            names[name] = digest
            self._write_json(self.names_file, names)

    def new_layer(self, limits: Limits | None = None) -> tuple[str, TreeBuilder]:
        """A temporary directory for one layer, and a layer TreeBuilder on its `tree`."""
        work = self.tempdir("layer")
        tree = os.path.join(work, "tree")
        os.mkdir(tree, 0o755)
        return work, TreeBuilder(tree, limits, layer=True)

    def commit_layer(self, work: str, builder: TreeBuilder, base: str, meta: dict,
                     name: str | None = None) -> str:
        """Finish the layer in `work`, store it and record the image `base` + that layer;
        returns the image's digest. `work` is removed either way."""
        try:
            builder.check_layer_mount_points()
            manifest, size = builder.finish()
            layer = digest_of(manifest)
            digest = layered_digest(base, layer)
            with self.lock():
                if not os.path.exists(self._meta_path(base)):
                    raise ImageError(f"the base image {base} was removed from the store "
                                     "meanwhile; nothing was stored", field="image")
                bmeta = self.info(base)
                dest = self.layer_path(layer)
                if not os.path.exists(dest):
                    os.chmod(builder.path, 0o555)
                    os.rename(builder.path, dest)
                mpath = os.path.join(self.meta, self._hex(layer) + ".layer")
                if not os.path.exists(mpath):
                    with open(mpath + ".tmp", "wb") as f:
                        f.write(manifest)
                    os.replace(mpath + ".tmp", mpath)
                layers = bmeta.get("layers") if isinstance(bmeta.get("layers"), list) else []
                meta = {**meta, "digest": digest, "base": base,
                        "root": bmeta.get("root") or base, "layers": [*layers, layer],
                        "layer_size": size, "size": bmeta.get("size", 0) + size,
                        "created": meta.get("created") or time.strftime(
                            "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                self._record(digest, meta, name)
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
                users = self._kept(names)
                if digest in users:
                    removed.append(f"kept {digest}: {users[digest]} is built on it")
                else:
                    self._drop(digest)
                    removed.append(digest)
                    removed += self._sweep_layers()
            return removed

    def discard(self, digests) -> None:
        """Remove images a failed import made (those no name or kept image needs)."""
        if not digests:
            return
        with self.lock():
            kept = self._kept(self.names())
            for d in digests:
                if d not in kept:
                    self._drop(d)
            self._sweep_layers()

    def _kept(self, names: dict[str, str]) -> dict[str, str]:
        """Every image to keep: the named ones, and those a kept image is built on (its
        base, and the base tree its layers lie on), with the image that needs it."""
        metas = {m["digest"]: m for m in self.images()}
        kept: dict[str, str] = {}
        todo = [(d, n) for n, d in sorted(names.items()) if d in metas]
        while todo:
            d, user = todo.pop()
            if d in kept:
                continue
            kept[d] = user
            m = metas[d]
            for ref in (m.get("base"), m.get("root")):
                if ref in metas and ref not in kept:
                    todo.append((ref, user))
        return kept

    def _sweep_layers(self) -> list[str]:
        used = set()
        for m in self.images():
            if isinstance(m.get("layers"), list):
                used.update(self._hex(x) for x in m["layers"])
        out = []
        for e in sorted(os.listdir(self.layers)) if os.path.isdir(self.layers) else []:
            if e not in used:
                remove_tree(os.path.join(self.layers, e))
                out.append(f"layer {e}")
        for e in sorted(os.listdir(self.meta)):
            if e.endswith(".layer") and e[:-6] not in used:
                os.unlink(os.path.join(self.meta, e))
        return out

    def _drop(self, digest: str) -> None:
        hexd = self._hex(digest)
        for p in (self._meta_path(digest), os.path.join(self.meta, hexd + ".manifest"),
                  os.path.join(self.meta, hexd + ".run")):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        t = self.tree(digest)
        if os.path.lexists(t):
            remove_tree(t)

    def gc(self) -> list[str]:
        """Remove unnamed images no kept image is built on, trees and layers without
        metadata, and tmp/ entries whose builder is gone. Returns what went."""
        out = []
        with self.lock():
            kept = self._kept(self.names())
            for meta in self.images():
                if meta["digest"] not in kept:
                    self._drop(meta["digest"])
                    out.append(meta["digest"])
            for e in sorted(os.listdir(self.trees)):
                if not os.path.exists(os.path.join(self.meta, e + ".json")):
                    remove_tree(os.path.join(self.trees, e))
                    out.append(f"tree {e}")
            out += self._sweep_layers()
            for e in sorted(os.listdir(self.tmp)):
                pid = e.split("-")[1] if e.count("-") >= 2 else ""
                if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
                    continue   # a build in progress
                remove_tree(os.path.join(self.tmp, e))
                out.append(f"tmp {e}")
        return out


def _in_layer(manifest: bytes, parts: list[str], kind: str | None) -> bool | None:
    """Whether a layer decides that the path is there (True), is not (False), or leaves
    it to the layers below (None). A layer holds the directories above each entry."""
    from .tree import manifest_entry

    def there(got) -> bool:
        return got is not None and got[0] != "w" and (kind is None or got[0] == kind)

    for i in range(1, len(parts)):
        got = manifest_entry(manifest, "/".join(parts[:i]))
        if got is None:
            return None
        if got[0] != "d":
            return False   # a whiteout, a file or a link where a directory was below
        if got[1] == "opaque":
            return there(manifest_entry(manifest, "/".join(parts)))
    got = manifest_entry(manifest, "/".join(parts))
    return None if got is None else there(got)


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
