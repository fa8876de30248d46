"""The image store: OCI / docker-save import with a hostile-tar unpacker, export round trip,
the reproducible digest, read-only trees, rm and gc. Real tarballs, the real CLI."""

import contextlib
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile

import pytest
from conftest import CORRAL


def _member(tf, name, kind="f", data=b"", mode=None, link="", mtime=1_600_000_000):
    ti = tarfile.TarInfo(name)
    ti.mtime = mtime
    if kind == "d":
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755 if mode is None else mode
        tf.addfile(ti)
    elif kind == "l":
        ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, link, 0o777
        tf.addfile(ti)
    elif kind == "h":
        ti.type, ti.linkname = tarfile.LNKTYPE, link
        tf.addfile(ti)
    elif kind == "c":
        ti.type, ti.devmajor, ti.devminor, ti.mode = tarfile.CHRTYPE, 1, 3, 0o666
        tf.addfile(ti)
    else:
        ti.size, ti.mode = len(data), 0o644 if mode is None else mode
        tf.addfile(ti, io.BytesIO(data))


def layer_bytes(members, gz=False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tf:
        for m in members:
            _member(tf, *m) if isinstance(m, tuple) else _member(tf, **m)
    return buf.getvalue()


def oci_tar(path, layers, env=("PATH=/usr/bin",), workdir="/w", gz=False):
    """An OCI image layout tarball with these layers (lists of member tuples)."""
    blobs = {}

    def blob(data):
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return d

    raw = [m if isinstance(m, bytes) else layer_bytes(m, gz) for m in layers]   # bytes: as is
    lds = [(blob(b), len(b)) for b in raw]
    config = json.dumps({"config": {"Env": list(env), "WorkingDir": workdir}}).encode()
    cd = blob(config)
    man = json.dumps({"schemaVersion": 2, "config": {"digest": cd, "size": len(config)},
                      "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar"
                                  + ("+gzip" if gz else ""), "digest": d, "size": n}
                                 for d, n in lds]}).encode()
    md = blob(man)
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
         "size": len(man)}]}).encode()
    with tarfile.open(path, "w") as tf:
        for n, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                        ("index.json", index)] + [
                (f"blobs/sha256/{d[7:]}", b) for d, b in blobs.items()]:
            _member(tf, n, data=data)
    return path


def docker_tar(path, layers, gz=False, diff_ids=None):
    """A docker save tarball; diff_ids are the digests of the uncompressed layers (the
    layers themselves gzipped when gz, as some tools write them)."""
    config = json.dumps({"config": {"Env": ["A=1"]}, "rootfs": {"diff_ids": diff_ids or [
        "sha256:" + hashlib.sha256(layer_bytes(m)).hexdigest() for m in layers]}}).encode()
    with tarfile.open(path, "w") as tf:
        names = []
        for i, m in enumerate(layers):
            names.append(f"l{i}/layer.tar")
            _member(tf, names[-1], data=layer_bytes(m, gz))
        _member(tf, "cfg.json", data=config)
        _member(tf, "manifest.json", data=json.dumps(
            [{"Config": "cfg.json", "RepoTags": ["x:1"], "Layers": names}]).encode())
    return path


BASE = [("etc", "d"), ("etc/os-release", "f", b"ID=toy\n"), ("usr", "d"), ("usr/bin", "d"),
        ("usr/bin/tool", "f", b"#!/bin/sh\necho hi\n", 0o4755), ("bin", "l", b"", None, "usr/bin"),
        ("usr/share", "d"), ("usr/share/doc", "d"), ("usr/share/doc/a", "f", b"a"),
        ("usr/share/doc/b", "f", b"b"), ("opt", "d"), ("opt/x", "f", b"x"),
        ("usr/bin/tool2", "h", b"", None, "usr/bin/tool")]
TOP = [("usr/share/doc/.wh..wh..opq", "f"), ("usr/share/doc/c", "f", b"c"),
       ("opt/.wh.x", "f"), ("etc/os-release", "f", b"ID=top\n")]


@pytest.fixture
def state(tmp_path):
    return str(tmp_path / "state")


def corral(state, *args, check=True):
    env = dict(os.environ, CORRAL_STATE_DIR=state)
    p = subprocess.run([CORRAL, *args], capture_output=True, text=True, env=env, timeout=300,
                       check=False)
    if check:
        assert p.returncode == 0, (p.returncode, p.stderr)
    return p


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def tree_of(state, digest):
    return os.path.join(state, "images", "trees", digest[7:])


def run_info(state, digest):
    with open(os.path.join(state, "images", "meta", digest[7:] + ".run")) as f:
        return json.load(f)


@contextlib.contextmanager
def merged(state, digest, tmp_path):
    """The image as a run sees it: its base tree, or its layers over it mounted the way the
    tiers do (backends/host/imageroot.py: a read-only overlay, lower directories only)."""
    from corral.backends.host.imageroot import image_root
    from corral.plan import ImageRoot

    info = run_info(state, digest)
    op = ImageRoot(rule="image", ref=digest, digest=digest, tree=tree_of(state, info["root"]),
                   layers=tuple(os.path.join(state, "images", "layers", x[7:])
                                for x in info["layers"]))
    if not op.layers:
        yield op.tree
        return

    class RunDir:
        base = str(tmp_path / "run")

    root = image_root(RunDir, op)
    try:
        assert image_root(RunDir, op) == root   # shared: mounted once
        yield root
    finally:
        subprocess.run(["umount", root], check=True)
        os.unlink(root + ".lowers")


def test_oci_import_applies_layers_and_whiteouts(state, tmp_path):
    tar = oci_tar(str(tmp_path / "img.tar"), [BASE, TOP])
    digest = corral(state, "image", "import", tar, "--name", "toy").stdout.strip()
    assert digest.startswith("sha256:") and len(digest) == 71
    info = run_info(state, digest)
    assert len(info["layers"]) == 1 and info["root"] != digest
    base, layer = tree_of(state, info["root"]), os.path.join(state, "images", "layers",
                                                              info["layers"][0][7:])
    # the base tree is the first layer as it was; the second is a layer of its own, its
    # whiteout an overlayfs whiteout and its opaque marker the directory's xattr
    assert read(os.path.join(base, "etc/os-release")) == "ID=toy\n"
    assert read(os.path.join(base, "opt/x")) == "x"
    st = os.lstat(os.path.join(layer, "opt/x"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert os.getxattr(os.path.join(layer, "usr/share/doc"), "trusted.overlay.opaque") == b"y"
    assert sorted(os.listdir(layer)) == ["etc", "opt", "usr"]   # only what the layer has
    with merged(state, digest, tmp_path) as t:   # what a run sees
        assert read(os.path.join(t, "etc/os-release")) == "ID=top\n"
        assert sorted(os.listdir(os.path.join(t, "usr/share/doc"))) == ["c"]   # opaque dir
        assert not os.path.exists(os.path.join(t, "opt/x"))                     # whiteout
        assert os.readlink(os.path.join(t, "bin")) == "usr/bin"
        assert read(os.path.join(t, "usr/bin/tool")) == "#!/bin/sh\necho hi\n"
        for mp in ("proc", "dev", "tmp", "scratch", "workspace"):                # mount points
            assert os.path.isdir(os.path.join(t, mp))
    assert os.path.samefile(os.path.join(base, "usr/bin/tool"),
                            os.path.join(base, "usr/bin/tool2"))
    # read-only on disk: no write bit anywhere, the set-uid bit gone (kept in the manifest)
    for top in (base, layer):
        for dirpath, dirs, files in os.walk(top):
            for n in dirs + files + ["."]:
                st = os.lstat(os.path.join(dirpath, n))
                if not stat.S_ISLNK(st.st_mode):
                    assert st.st_mode & 0o7222 == 0, os.path.join(dirpath, n)
    man = read(os.path.join(state, "images", "meta", info["root"][7:] + ".manifest"), "rb")
    assert hashlib.sha256(man).hexdigest() == info["root"][7:]
    assert b"usr/bin/tool\0f\x004755\0" in man
    lman = read(os.path.join(state, "images", "meta", info["layers"][0][7:] + ".layer"), "rb")
    assert hashlib.sha256(lman).hexdigest() == info["layers"][0][7:]
    assert b"opt/x\0w\x000000\x000\0\n" in lman and b"usr/share/doc\0d\x000755\x000\0opaque\n" in lman
    # the image's digest: over the base's digest and the layer's
    want = hashlib.sha256(b"corral layered image v1\n" + f"base {info['root']}\nlayer "
                          f"{info['layers'][0]}\n".encode()).hexdigest()
    assert digest == "sha256:" + want
    ls = corral(state, "image", "ls").stdout
    assert "toy" in ls and digest[:19] in ls
    show = json.loads(corral(state, "image", "show", "toy", "--json").stdout)
    assert show["env"] == ["PATH=/usr/bin"] and show["workdir"] == "/w"
    assert show["base"] == info["root"] and show["layers"] == info["layers"]


def test_export_rm_import_round_trip_gives_the_same_digest(state, tmp_path):
    digest = corral(state, "image", "import", oci_tar(str(tmp_path / "a.tar"), [BASE, TOP],
                                                      gz=True), "--name", "toy").stdout.strip()
    info = run_info(state, digest)
    out = str(tmp_path / "out.tar")
    corral(state, "image", "export", "toy", out)
    with tarfile.open(out) as tf:   # the base and the layer, each an OCI layer of its own
        index = json.load(tf.extractfile("index.json"))
        man = json.load(tf.extractfile("blobs/sha256/" + index["manifests"][0]["digest"][7:]))
        assert len(man["layers"]) == 2
        top = tarfile.open(fileobj=tf.extractfile("blobs/sha256/" + man["layers"][1]["digest"][7:]))
        names = top.getnames()
        assert "opt/.wh.x" in names and "usr/share/doc/.wh..wh..opq" in names
        assert "usr/bin/tool" not in names   # the base's files are not in the layer
    corral(state, "image", "rm", "toy")
    corral(state, "image", "gc")   # the base, unnamed, goes with the last image on it
    assert not os.path.exists(tree_of(state, info["root"]))
    assert os.listdir(os.path.join(state, "images", "layers")) == []
    assert corral(state, "image", "ls").stdout == ""
    again = corral(state, "image", "import", out, "--name", "back").stdout.strip()
    assert again == digest
    assert json.loads(corral(state, "image", "show", "back", "--json").stdout)["workdir"] == "/w"


def test_gc_and_rm_keep_a_base_a_layered_image_is_built_on(state, tmp_path):
    layered = corral(state, "image", "import", oci_tar(str(tmp_path / "a.tar"), [BASE, TOP]),
                     "--name", "toy").stdout.strip()
    base = run_info(state, layered)["root"]
    assert base not in corral(state, "image", "gc").stdout   # unnamed, but toy is on it
    assert os.path.isdir(tree_of(state, base))
    corral(state, "image", "tag", base, "b")
    out = corral(state, "image", "rm", "b").stdout
    assert out == f"removed name b\nkept {base}: toy is built on it\n", out
    with merged(state, layered, tmp_path) as t:
        assert read(os.path.join(t, "etc/os-release")) == "ID=top\n"
    out = corral(state, "image", "rm", "toy").stdout.splitlines()
    assert out[:2] == ["removed name toy", f"removed {layered}"] and out[2].startswith(
        "removed layer "), out
    gone = corral(state, "image", "gc").stdout
    assert base in gone and not os.path.exists(tree_of(state, base))


@pytest.mark.parametrize("layer, why", [
    ([(".wh.tmp", "f")], "the layer removes /tmp, where corral mounts"),
    ([("etc", "d"), ("etc/corral-ca.pem", "l", b"", None, "/x")],
     "the layer replaces /etc/corral-ca.pem"),
    ([(".wh..wh..opq", "f")], "an opaque marker at the root of a layer"),
])
def test_a_layer_may_not_remove_corrals_mount_points(state, tmp_path, layer, why):
    p = corral(state, "image", "import", oci_tar(str(tmp_path / "a.tar"), [BASE, layer]),
               check=False)
    assert p.returncode == 4 and why in p.stderr, p.stderr
    assert os.listdir(os.path.join(state, "images", "trees")) == []


def test_a_shared_overlay_on_replaced_directories_is_mounted_anew(state, tmp_path):
    """The overlay of a layered image is shared by the runs; removed and imported again
    (the same paths, new directories), the image gets a fresh overlay, not the stale one."""
    from corral.backends.host.imageroot import image_root, sweep_shared
    from corral.plan import ImageRoot

    tar = oci_tar(str(tmp_path / "a.tar"), [BASE, TOP])

    class RunDir:
        base = str(tmp_path / "run")

    def op(digest):
        info = run_info(state, digest)
        return ImageRoot(rule="image", ref=digest, digest=digest,
                         tree=tree_of(state, info["root"]),
                         layers=tuple(os.path.join(state, "images", "layers", x[7:])
                                      for x in info["layers"]))

    digest = corral(state, "image", "import", tar, "--name", "toy").stdout.strip()
    root = image_root(RunDir, op(digest))
    try:
        assert read(os.path.join(root, "etc/os-release")) == "ID=top\n"
        corral(state, "image", "rm", "toy")
        corral(state, "image", "gc")
        assert corral(state, "image", "import", tar, "--name", "toy").stdout.strip() == digest
        assert image_root(RunDir, op(digest)) == root
        # paths no run looked up before: a stale overlay (on the removed directories)
        # would not find them
        assert read(os.path.join(root, "usr/share/doc/c")) == "c"
        assert read(os.path.join(root, "usr/bin/tool")) == "#!/bin/sh\necho hi\n"
    finally:
        for _ in range(3):
            subprocess.run(["umount", root], check=False, capture_output=True)
    assert sweep_shared(RunDir.base) == [root]   # unmounted: its entry goes


def test_a_layer_opaque_above_a_mount_point_gets_it_back(state, tmp_path):
    digest = corral(state, "image", "import", oci_tar(
        str(tmp_path / "a.tar"), [BASE, [("etc", "d"), ("etc/.wh..wh..opq", "f"),
                                         ("etc/hostname", "f", b"h")]])).stdout.strip()
    with merged(state, digest, tmp_path) as t:
        assert sorted(os.listdir(os.path.join(t, "etc"))) == ["corral-ca.pem", "hostname"]


def test_digest_ignores_mtimes_and_member_order(state, tmp_path):
    a = corral(state, "image", "import", oci_tar(str(tmp_path / "a.tar"), [BASE])).stdout
    # children before their parents, other mtimes, the hard link as a plain copy
    keys = ("name", "kind", "data", "mode", "link")
    later = [dict(zip(keys, m), mtime=1_700_000_000) for m in reversed(BASE[:-1])]
    later.append(("usr/bin/tool2", "f", b"#!/bin/sh\necho hi\n", 0o4755))
    b = corral(state, "image", "import", oci_tar(str(tmp_path / "b.tar"), [later])).stdout
    assert a == b
    # and one changed byte or mode bit gives another
    other = BASE[:1] + [("etc/os-release", "f", b"ID=toz\n")] + BASE[2:]
    c = corral(state, "image", "import", oci_tar(str(tmp_path / "c.tar"), [other])).stdout
    assert c != a


def test_docker_save_import(state, tmp_path):
    digest = corral(state, "image", "import", docker_tar(str(tmp_path / "d.tar"), [BASE, TOP]),
                    "--name", "dk").stdout.strip()
    with merged(state, digest, tmp_path) as t:
        assert read(os.path.join(t, "etc/os-release")) == "ID=top\n"
    assert json.loads(corral(state, "image", "show", "dk", "--json").stdout)["env"] == ["A=1"]


def test_docker_save_gzipped_layers_are_checked_against_their_uncompressed_diff_ids(
        state, tmp_path):
    digest = corral(state, "image", "import", docker_tar(str(tmp_path / "g.tar"), [BASE, TOP],
                                                         gz=True), "--name", "gz").stdout.strip()
    assert digest == corral(state, "image", "import", docker_tar(
        str(tmp_path / "d.tar"), [BASE, TOP])).stdout.strip()
    # the digest of the gzip bytes is not a diff_id: refused
    wrong = ["sha256:" + hashlib.sha256(layer_bytes(m, True)).hexdigest() for m in (BASE, TOP)]
    p = corral(state, "image", "import", docker_tar(str(tmp_path / "w.tar"), [BASE, TOP],
                                                    gz=True, diff_ids=wrong), check=False)
    assert p.returncode == 4 and "layer 1 does not match its digest" in p.stderr, p.stderr


def _raw_layer(*blocks) -> bytes:
    """A layer tar from raw header blocks and members (bytes), then the end marker."""
    return b"".join(blocks) + b"\0" * 1024


def _pax(records: dict, kind=tarfile.XHDTYPE) -> bytes:
    return tarfile.TarInfo._create_pax_generic_header(records, kind, "utf-8")


def _plain(name, data=b"x") -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti.tobuf(tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % 512)


def _sparse_member() -> bytes:
    ti = tarfile.TarInfo("holes")
    ti.type = tarfile.GNUTYPE_SPARSE
    return ti.tobuf(tarfile.GNU_FORMAT)


TAR_BOUNDS = {
    # tarfile reads a PAX header's body whole: 2 MiB of "comment" is refused unread
    "pax-header": (_raw_layer(_pax({"comment": "c" * (2 << 20)}), _plain("etc/a")),
                   "a tar extended header of 2097"),
    "pax-in-a-row": (_raw_layer(*[_pax({"comment": f"{i}"}) for i in range(12)],
                                _plain("etc/a")), "tar extended headers in a row"),
    "global-headers": (_raw_layer(*[_pax({f"k{i}": "g" * 60000}, tarfile.XGLTYPE)
                                    + _plain(f"etc/f{i}") for i in range(20)]),
                       "tar global headers over"),
    "gnu-sparse": (_raw_layer(_sparse_member()), "is a sparse file"),
}


@pytest.mark.parametrize("case", sorted(TAR_BOUNDS))
def test_tar_header_bounds(state, tmp_path, case):
    layer, why = TAR_BOUNDS[case]
    p = corral(state, "image", "import", oci_tar(str(tmp_path / "h.tar"), [BASE, layer]),
               check=False)
    assert p.returncode == 4, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], p.stderr
    assert os.listdir(os.path.join(state, "images", "trees")) == []


def test_tar_header_bounds_spare_ordinary_pax_headers(state, tmp_path):
    """A long name and a few PAX records per member (what real layers carry) still import."""
    long = "etc/" + "/".join(["n" * 200] * 3)
    layer = _raw_layer(_pax({"path": long, "mtime": "1.5"}), _plain("etc/short"),
                       _pax({"comment": "x" * 30000}), _plain("etc/b", b"bb"))
    digest = corral(state, "image", "import", oci_tar(str(tmp_path / "ok.tar"),
                                                      [BASE, layer])).stdout.strip()
    with merged(state, digest, tmp_path) as t:
        assert os.path.exists(os.path.join(t, long))


HOSTILE = {
    "dotdot": ([("etc", "d"), ("../escaped", "f", b"x")], "'..' component"),
    "dotdot-inside": ([("a", "d"), ("a/../../escaped", "f", b"x")], "'..' component"),
    "absolute": ([("/escaped", "f", b"x")], "absolute path"),
    "device": ([("dev", "d"), ("dev/mem", "c")], "device node"),
    "through-symlink": ([("out", "l", b"", None, "/tmp"), ("out/escaped", "f", b"x")],
                        "symlink or a file"),
    "symlink-leaves": ([("a", "d"), ("a/up", "l", b"", None, "../../etc/shadow")],
                       "leaves the tree"),
    "hardlink-outside": ([("a", "d"), ("a/pw", "h", b"", None, "../etc/passwd")],
                         "'..' component"),
    "hardlink-missing": ([("pw", "h", b"", None, "etc/passwd")], "not in the tree"),
    "long-component": ([("etc/" + "n" * 256, "f", b"x")], "component over 255 bytes"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_tarball_refused_with_one_line_and_nothing_left(state, tmp_path, case):
    members, why = HOSTILE[case]
    p = corral(state, "image", "import", oci_tar(str(tmp_path / "h.tar"), [BASE, members]),
               "--name", "bad", check=False)
    assert p.returncode == 4, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], p.stderr
    images = os.path.join(state, "images")
    assert os.listdir(os.path.join(images, "trees")) == []
    assert os.listdir(os.path.join(images, "layers")) == []   # the refused one is layer 2
    assert os.listdir(os.path.join(images, "tmp")) == []
    assert corral(state, "image", "ls").stdout == ""
    assert not os.path.exists("/tmp/escaped") and not os.path.exists(
        os.path.join(str(tmp_path), "escaped"))


def test_layer_digest_mismatch_refused(state, tmp_path):
    tar = oci_tar(str(tmp_path / "img.tar"), [BASE])
    # swap one layer blob's content for another tar: the manifest's digest no longer fits
    with tarfile.open(tar) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(tar, "w") as tf:
        for m, data in members:
            if m.name.startswith("blobs/") and data.startswith(b"etc"):
                data = layer_bytes([("evil", "f", b"x")])
                m.size = len(data)
            tf.addfile(m, io.BytesIO(data))
    p = corral(state, "image", "import", tar, check=False)
    assert p.returncode == 4 and "does not match its digest" in p.stderr
    assert os.listdir(os.path.join(state, "images", "trees")) == []


def test_rm_by_name_and_gc(state, tmp_path):
    d1 = corral(state, "image", "import", oci_tar(str(tmp_path / "a.tar"), [BASE]),
                "--name", "one").stdout.strip()
    corral(state, "image", "import", oci_tar(str(tmp_path / "a.tar"), [BASE]), "--name", "two")
    assert "removed name one\n" == corral(state, "image", "rm", "one").stdout  # "two" keeps it
    assert os.path.isdir(tree_of(state, d1))
    d3 = corral(state, "image", "import", oci_tar(str(tmp_path / "c.tar"), [TOP])).stdout.strip()
    os.makedirs(os.path.join(state, "images", "tmp", "build-999999999-x"))  # a dead build
    gone = corral(state, "image", "gc").stdout
    assert d3 in gone and "tmp build-999999999-x" in gone and d1 not in gone
    assert not os.path.exists(tree_of(state, d3))
    p = corral(state, "image", "show", "nope", check=False)
    assert p.returncode == 4 and "no image named 'nope'" in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to nobody")
def test_without_root_the_namespace_tier_refuses_a_layered_image(tmp_path):
    """An overlay is mounted on the host, which needs root: an ordinary user's run on a
    layered image is refused (exit 3), naming why, never run on something else."""
    import shutil
    import tempfile

    top = tempfile.mkdtemp(prefix="corral-nobody-")
    try:
        os.chmod(top, 0o711)
        state = os.path.join(top, "state")
        corral(state, "image", "import", oci_tar(str(tmp_path / "a.tar"), [BASE, TOP]),
               "--name", "toy")
        for d, _, fs in os.walk(state):   # let nobody read this store
            os.chmod(d, 0o755)
            for f in fs:
                os.chmod(os.path.join(d, f), 0o644)
        r = subprocess.run([CORRAL, "run", "--isolation", "namespace", "--image", "toy", "--",
                            "/usr/bin/tool"], capture_output=True, text=True, timeout=60,
                           user=65534, group=65534, extra_groups=[], cwd="/",
                           env={"PATH": "/usr/bin:/bin", "CORRAL_STATE_DIR": state,
                                "HOME": "/"})
        assert r.returncode == 3, r.stderr
        assert ("an image with layers is an overlay corral mounts on the host, which needs "
                "root") in r.stderr
    finally:
        from corral.images.store import remove_tree

        remove_tree(top)
        shutil.rmtree(top, ignore_errors=True)
