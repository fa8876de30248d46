"""Import and export of images as tarballs: an OCI image layout, or `docker save` output.

Import reads the outer tarball without extracting it: index.json (OCI) or manifest.json
(docker) -> the image manifest -> the config (env, working directory) and the layers, each
layer's bytes hashed while they stream into the TreeBuilder (tree.py: hostile members
refused, whiteouts applied), and the hash compared with the digest the manifest names
before anything is committed. Gzip layers are read; zstd ones are refused.

Export writes an OCI image layout with one uncompressed layer for the image's base tree and
one for each of its layers (members sorted, owners 0:0, the recorded modes, the tree's
mtimes; a layer's whiteouts and opaque directories as `.wh.` members), and a config with
the image's env and working directory. Import makes the first layer a base tree and each
later one a layer over it (store.py), so importing an export gives back the same digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import zlib

from ..errors import ImageError
from .tree import open_tar, parse_manifest

JSON_MAX = 4 << 20
OUTER_MEMBERS_MAX = 100_000   # blobs, manifests, configs of one tarball
MAX_LAYERS = 16               # layers kept as layers over the base tree; the rest merged in
LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar",
               "application/vnd.oci.image.layer.v1.tar+gzip",
               "application/vnd.docker.image.rootfs.diff.tar.gzip",
               "application/vnd.docker.image.rootfs.diff.tar")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")


class _Hashing(io.RawIOBase):
    """A read-only stream that hashes what passes through it."""

    def __init__(self, src) -> None:
        self.src = src
        self.h = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.src.read(len(b))
        self.h.update(data)
        b[:len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.src.read(1 << 20):
            pass


class _Outer:
    """The outer tarball: members looked up by normalised name, read with bounds."""

    def __init__(self, path: str) -> None:
        try:
            self.tf = open_tar(path, "r:*")
            self.members: dict[str, tarfile.TarInfo] = {}
            while (m := self.tf.next()) is not None:
                self.tf.members.clear()   # ours are indexed by name below, and bounded
                if len(self.members) >= OUTER_MEMBERS_MAX:
                    raise ImageError(f"{path!r} has more than {OUTER_MEMBERS_MAX} members; "
                                     "an image layout has a few", field="FILE")
                self.members[os.path.normpath(m.name).lstrip("/")] = m
        except FileNotFoundError:
            raise ImageError(f"{path!r} does not exist", field="FILE") from None
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ImageError(f"{path!r} is not a tar archive ({e})", field="FILE") from None

    def has(self, name: str) -> bool:
        return name in self.members

    def open(self, name: str):
        m = self.members.get(os.path.normpath(name).lstrip("/"))
        if m is None or not m.isreg():
            raise ImageError(f"the archive has no file {name!r}", field="FILE")
        return self.tf.extractfile(m), m.size

    def json(self, name: str):
        f, size = self.open(name)
        if size > JSON_MAX:
            raise ImageError(f"{name!r} is {size} bytes, over {JSON_MAX} for a JSON document",
                             field="FILE")
        try:
            return json.loads(f.read())
        except ValueError:
            raise ImageError(f"{name!r} is not valid JSON", field="FILE") from None

    def blob(self, digest: str) -> str:
        if not isinstance(digest, str) or not digest.startswith("sha256:") or \
                len(digest) != 71 or any(c not in "0123456789abcdef" for c in digest[7:]):
            raise ImageError(f"blob digest {digest!r} is not sha256:HEX", field="FILE")
        return f"blobs/sha256/{digest[7:]}"


def _pick_manifest(outer: _Outer, index: dict) -> dict:
    for _ in range(4):   # nested indexes, a few levels at most
        ms = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(ms, list) or not ms:
            raise ImageError("index.json lists no manifests", field="FILE")
        pick = ms[0]
        for m in ms:
            plat = m.get("platform") or {}
            if plat.get("os") == "linux" and plat.get("architecture") == "amd64":
                pick = m
                break
        doc = outer.json(outer.blob(pick.get("digest")))
        if pick.get("mediaType") in INDEX_TYPES or doc.get("mediaType") in INDEX_TYPES:
            index = doc
            continue
        return doc
    raise ImageError("index.json nests indexes too deep", field="FILE")


def import_tar(store, path: str, name: str | None = None, progress=None) -> str:
    """Import an OCI layout or docker-save tarball into the store; returns the digest."""
    outer = _Outer(path)
    before = {m["digest"] for m in store.images()}
    made: list[str] = []
    work, builder = store.new_tree()
    try:
        if outer.has("index.json") and outer.has("oci-layout"):
            man = _pick_manifest(outer, outer.json("index.json"))
            config = outer.json(outer.blob((man.get("config") or {}).get("digest")))
            layers = []
            for layer in man.get("layers") or []:
                mt = layer.get("mediaType", "")
                if mt not in LAYER_TYPES:
                    raise ImageError(f"layer media type {mt!r} is not supported (tar or "
                                     "tar+gzip only)", field="FILE")
                layers.append((outer.blob(layer.get("digest")), layer.get("digest")))
            source = "oci-layout"
        elif outer.has("manifest.json"):
            man = outer.json("manifest.json")
            if not isinstance(man, list) or not man or not isinstance(man[0], dict):
                raise ImageError("manifest.json is not a docker save manifest", field="FILE")
            config = outer.json(man[0].get("Config", ""))
            diff_ids = ((config or {}).get("rootfs") or {}).get("diff_ids") or []
            layer_paths = man[0].get("Layers") or []
            if len(diff_ids) != len(layer_paths):
                raise ImageError(f"the config lists {len(diff_ids)} diff_ids for "
                                 f"{len(layer_paths)} layers", field="FILE")
            layers = list(zip(layer_paths, diff_ids))
            source = "docker-save"
        else:
            raise ImageError(f"{path!r} is neither an OCI image layout (oci-layout, "
                             "index.json) nor a docker save tarball (manifest.json)",
                             field="FILE")
        cfg = (config or {}).get("config") or {}
        env = [e for e in cfg.get("Env") or [] if isinstance(e, str) and "=" in e]
        meta = {"source": {"kind": source, "file": os.path.abspath(path)},
                "env": env, "workdir": cfg.get("WorkingDir") or "", "oci_layers": len(layers)}
        if not layers:
            raise ImageError("the image lists no layers", field="FILE")
        # the first layer is the base tree, each later one a layer of the store over it
        # (whiteouts kept as overlayfs whiteouts): the same layers give the same digest.
        # Beyond MAX_LAYERS, the lowest are applied into the base tree instead (an overlay
        # takes a bounded list of directories)
        digest = None
        flat = max(1, len(layers) - MAX_LAYERS)
        for i, (member, want) in enumerate(layers, 1):
            if i > flat:
                prev = builder
                work, builder = store.new_layer(prev.limits)
                builder.members, builder.bytes = prev.members, prev.bytes   # over all layers
            _apply_layer(outer, builder, i, len(layers), member, want, source, progress)
            last = i == len(layers)
            if i < flat:
                continue
            if i == flat:
                digest = store.commit(work, builder, meta, name if last else None)
            else:
                digest = store.commit_layer(work, builder, digest, meta, name if last else None)
            if digest not in before:
                made.append(digest)
            work = None
        return digest
    except BaseException:
        builder.close()
        from .store import remove_tree

        if work:
            remove_tree(work)
        store.discard(made)   # nothing of a refused archive stays in the store
        raise


def _apply_layer(outer, builder, i: int, n: int, member: str, want, source: str,
                 progress) -> None:
    """Stream one layer into the builder, and check its bytes against its digest."""
    f, size = outer.open(member)
    if progress:
        progress(f"layer {i}/{n}: {size} bytes")
    if source == "docker-save" and f.read(2) == b"\x1f\x8b":
        # a diff_id is the digest of the uncompressed layer: hash what gzip gives
        f.seek(0)
        f = gzip.GzipFile(fileobj=f, mode="rb")
    else:
        f.seek(0)
    hs = _Hashing(f)
    try:
        builder.apply_tar(io.BufferedReader(hs, 1 << 16), whiteouts=True)
        hs.drain()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ImageError(f"layer {i} is not a readable tar or gzip stream ({e})",
                         field="FILE") from None
    if want is not None and "sha256:" + hs.h.hexdigest() != want:
        raise ImageError(f"layer {i} does not match its digest {want}: the archive is "
                         "corrupt or was altered", field="FILE")


def export_tar(store, digest: str, out_path: str) -> None:
    """An OCI image layout tarball of the image, written to out_path (via a temp file):
    its base tree as the first layer, each of its layers as one more."""
    meta = store.info(digest)
    info = store.run_info(digest)
    work = store.tempdir("export")
    try:
        parts = [(store.tree(info["root"]), store.manifest(info["root"]))]
        parts += [(store.layer_path(x), store.layer_manifest(x)) for x in info["layers"]]
        _export(meta, digest, parts, out_path, work)
    finally:
        from .store import remove_tree

        remove_tree(work)


def _export(meta: dict, digest: str, parts, out_path: str, work: str) -> None:
    layers = []
    for i, (tree, tree_manifest) in enumerate(parts):
        layer = os.path.join(work, f"layer{i}.tar")
        _layer_tar(tree, tree_manifest, layer)
        h = hashlib.sha256()
        with open(layer, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        layers.append((layer, "sha256:" + h.hexdigest(), os.path.getsize(layer)))
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": meta.get("env") or [], "WorkingDir": meta.get("workdir") or ""},
        "rootfs": {"type": "layers", "diff_ids": [x[1] for x in layers]},
    }, sort_keys=True).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPES[0], "digest": d, "size": n}
                   for _, d, n in layers],
        "annotations": {"org.corral.tree.digest": digest},
    }, sort_keys=True).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    ann = {"org.corral.tree.digest": digest}
    if meta.get("names"):
        ann["org.opencontainers.image.ref.name"] = meta["names"][0]
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": len(manifest),
                       "platform": {"os": "linux", "architecture": "amd64"},
                       "annotations": ann}],
    }, sort_keys=True).encode()
    files = [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", index),
             (f"blobs/sha256/{manifest_digest[7:]}", manifest),
             (f"blobs/sha256/{config_digest[7:]}", config)]
    tmp = f"{out_path}.{os.getpid()}.tmp"
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
            for d in ("blobs", "blobs/sha256"):
                ti = tarfile.TarInfo(d)
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            for n, data in files:
                ti = tarfile.TarInfo(n)
                ti.size, ti.mode = len(data), 0o644
                tf.addfile(ti, io.BytesIO(data))
            for layer, layer_digest, _ in layers:
                tf.add(layer, f"blobs/sha256/{layer_digest[7:]}", recursive=False,
                       filter=_plain_member)
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _plain_member(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mode = 0o644
    return ti


def _layer_tar(tree: str, manifest: bytes, out: str) -> None:
    """One layer of the whole tree in `out`, entries in manifest order with its modes."""
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for rel, kind, mode, size, data in parse_manifest(manifest):
            p = os.path.join(tree, rel)
            st = os.lstat(p)
            ti = tarfile.TarInfo(rel)
            ti.mode, ti.uid, ti.gid, ti.mtime = mode, 0, 0, int(st.st_mtime)
            if kind == "w":   # a layer's whiteout: the OCI `.wh.` name, an empty file
                head, _, leaf = rel.rpartition("/")
                ti.name = f"{head}/.wh.{leaf}" if head else f".wh.{leaf}"
                tf.addfile(ti)
            elif kind == "d":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
                if data == "opaque":   # a layer's opaque directory: its OCI marker after it
                    wh = tarfile.TarInfo(f"{rel}/.wh..wh..opq")
                    wh.mtime = ti.mtime
                    tf.addfile(wh)
            elif kind == "l":
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                tf.addfile(ti)
            else:
                if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                    raise ImageError(f"/{rel} in the store no longer matches the image's "
                                     "manifest; the store was altered", field="image")
                ti.size = size
                with open(p, "rb") as f:
                    tf.addfile(ti, f)
