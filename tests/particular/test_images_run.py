"""Runs on an image: the namespace and gvisor tiers show the image's root (Debian trixie,
its python), not the host's (bookworm, python 3.11); the process tier refuses; explain
says which root and whether it is pinned; image builds refuse bad input. The image is a
real mmdebstrap build, cached across test runs (imagefix.py)."""

import json
import os
import subprocess

import pytest
from conftest import CORRAL, tier_unavailable
from imagefix import TOML, corral_in

#: the first run of the suite builds the image (one mmdebstrap run, about a minute here)
pytestmark = pytest.mark.timeout(600)

PROBE = ("head -1 /etc/os-release; python3 -c 'import sys; print(sys.version_info[:2])'; "
         "cat /etc/corral-test-note; echo $GREETING; pwd; "
         "touch /usr/planted 2>/dev/null && echo WROTE || echo read-only")


def host_line():
    with open("/etc/os-release") as f:
        return f.readline().strip()


@pytest.mark.parametrize("tier", ["namespace", "gvisor"])
def test_image_root_is_the_images_not_the_hosts(mini_image, tier):
    state, name, digest = mini_image
    why = tier_unavailable(tier)
    if why:
        pytest.skip(why)
    host = subprocess.run([CORRAL, "run", "--isolation", tier, "--", "sh", "-c", PROBE],
                          capture_output=True, text=True, timeout=120, check=False)
    for ref in (name, digest):
        p = corral_in(state, "run", "--isolation", tier, "--image", ref, "--", "sh", "-c",
                      PROBE)
        lines = p.stdout.splitlines()
        assert lines[0] == 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"', p.stdout
        assert lines[0] != host_line() and lines[0] != host.stdout.splitlines()[0]
        assert lines[1] == "(3, 13)" and host.stdout.splitlines()[1] == "(3, 11)"
        assert lines[2:] == ["placed by corral image build", "from-the-image", "/scratch",
                             "read-only"]
    tree = os.path.join(state, "images", "trees", digest[7:])
    assert not os.path.exists(os.path.join(tree, "usr", "planted"))


def test_process_tier_refuses_an_image_naming_a_tier_that_could(mini_image):
    state, name, _ = mini_image
    p = corral_in(state, "run", "--isolation", "process", "--image", name, "--", "true",
                  check=False)
    assert p.returncode == 3, p.stderr
    assert p.stderr.startswith("corral: image: the process tier cannot enforce it")
    assert 'isolation = "namespace" could' in p.stderr


def test_explain_names_the_root_and_whether_it_is_pinned(mini_image):
    state, name, digest = mini_image
    by_name = json.loads(corral_in(state, "explain", "--image", name, "--json").stdout)
    assert by_name["root"] == {"kind": "image", "ref": name, "digest": digest, "pinned": False}
    text = corral_in(state, "explain", "--image", digest).stdout
    assert f"root: image {digest} ({digest}), read-only; pinned by digest" in text
    host = corral_in(state, "explain").stdout
    assert "root: the host's /usr and a minimal /etc, read-only; not pinned" in host


def test_unknown_image_is_one_line_exit_4(tmp_path):
    p = corral_in(str(tmp_path), "run", "--image", "python", "--", "true", check=False)
    assert p.returncode == 4
    assert p.stderr.strip() == (f"corral: image: no image named 'python' in the store "
                                f"({tmp_path}/images); build it with: corral image build python")
    p = corral_in(str(tmp_path), "run", "--image", "Bad/Name", "--", "true", check=False)
    assert p.returncode == 2 and "is not \"host\", an image name" in p.stderr


def test_build_refuses_a_lock_for_another_description(tmp_path, mini_image):
    with open(os.path.join(os.path.dirname(mini_image[0]), "mini-image.lock.json")) as f:
        lock = json.load(f)
    lock["packages"] = ["python3-minimal", "curl"]
    path = tmp_path / "other.lock.json"
    path.write_text(json.dumps(lock))
    p = corral_in(str(tmp_path), "image", "build", TOML, "--lock", str(path), check=False)
    assert p.returncode == 4 and "run corral image lock again" in p.stderr
    assert not os.path.exists(tmp_path / "images" / "trees") or not os.listdir(
        tmp_path / "images" / "trees")


def test_drift_is_refused_naming_the_package(mini_image):
    from corral.errors import ImageError
    from corral.images.build import check_drift

    with open(os.path.join(os.path.dirname(mini_image[0]), "mini-image.lock.json")) as f:
        lock = json.load(f)
    debs = [dict(d) for d in lock["debs"]]
    check_drift(lock, debs)   # the same set passes
    debs[0]["sha256"] = "0" * 64
    with pytest.raises(ImageError, match=f"drift: {debs[0]['name']} is"):
        check_drift(lock, debs)
    with pytest.raises(ImageError, match="which the lock does not list"):
        check_drift(lock, [*lock["debs"], {"name": "zzz", "version": "1", "sha256": "x"}])


@pytest.mark.slow     # an mmdebstrap run (~9 s), as the image builds of the slow group
def test_a_package_that_does_not_exist_is_one_line(tmp_path):
    if not os.path.exists("/usr/bin/mmdebstrap"):
        pytest.skip("needs mmdebstrap")
    toml = tmp_path / "bad.toml"
    toml.write_text('[image]\nsuite = "trixie"\npackages = ["no-such-package-corral"]\n')
    p = corral_in(str(tmp_path), "image", "build", str(toml), check=False)
    assert p.returncode == 4, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-package-corral" in lines[0], p.stderr
    assert os.listdir(tmp_path / "images" / "trees") == []
    assert os.listdir(tmp_path / "images" / "tmp") == []


@pytest.mark.slow
def test_two_builds_from_the_same_lock_give_the_same_digest(mini_image):
    """Two independent mmdebstrap builds from the cached image's lock, each into a store of
    its own: the same tree, so the same digest (mtimes, owners, order and apt's
    auto-installed marks are not in it)."""
    from imagefix import CACHE

    from corral.images.store import remove_tree

    digests = []
    for i in (1, 2):
        other = os.path.join(CACHE, f"repro-{os.getpid()}-{i}")
        try:
            p = corral_in(other, "image", "build", TOML, "--lock",
                          os.path.join(CACHE, "mini-image.lock.json"), check=False)
            if p.returncode == 4 and "drift" in p.stderr:
                pytest.skip("the mirror moved past the cached lock; the next run locks again")
            assert p.returncode == 0, p.stderr
            digests.append(p.stdout.strip())
            man = os.path.join(other, "images", "meta", digests[-1][7:] + ".manifest")
            with open(man, "rb") as f:
                assert b"var/lib/apt/extended_states\0" not in f.read()
        finally:
            remove_tree(other)
    assert digests[0] == digests[1]


@pytest.mark.slow
def test_a_build_from_a_lock_already_built_comes_from_the_cache(mini_image, tmp_path):
    """The second build from the same lock returns the first one's image without running
    mmdebstrap: with mmdebstrap out of PATH it still succeeds, and says so; --no-cache
    rebuilds (and so needs mmdebstrap)."""
    from imagefix import CACHE

    from corral.images.store import remove_tree

    lock = os.path.join(CACHE, "mini-image.lock.json")
    other = os.path.join(CACHE, f"cache-{os.getpid()}")
    try:
        p = corral_in(other, "image", "build", TOML, "--lock", lock, check=False)
        if p.returncode == 4 and "drift" in p.stderr:
            pytest.skip("the mirror moved past the cached lock; the next run locks again")
        assert p.returncode == 0, p.stderr
        assert "from cache" not in p.stderr
        # the .pyc files mmdebstrap's py3compile wrote (checked hash-based, as
        # SOURCE_DATE_EPOCH makes them) are unchecked in the image: no source hashed per
        # import on a read-only root
        import glob

        tree = os.path.join(other, "images", "trees", p.stdout.strip()[7:])
        pycs = glob.glob(os.path.join(tree, "usr/lib/python3*/__pycache__/*.pyc"))
        flags = set()
        for f in pycs:
            with open(f, "rb") as fo:
                flags.add(fo.read(8)[4])
        assert len(pycs) > 50 and flags == {1}, (len(pycs), flags)
        no_mm = {"PATH": str(tmp_path)}   # no mmdebstrap to be found
        q = corral_in(other, "image", "build", TOML, "--lock", lock, "--name", "again",
                      env={**os.environ, **no_mm, "CORRAL_STATE_DIR": other})
        assert q.stdout == p.stdout
        assert q.stderr.strip() == (f"corral: from cache: {p.stdout.strip()} was built from "
                                    "this lock and description; not rebuilt (--no-cache "
                                    "rebuilds)")
        assert corral_in(other, "image", "show", "again", "--json").stdout.count(
            p.stdout.strip()) == 1
        r = corral_in(other, "image", "build", TOML, "--lock", lock, "--no-cache",
                      env={**os.environ, **no_mm, "CORRAL_STATE_DIR": other}, check=False)
        assert r.returncode == 4 and "mmdebstrap is not installed" in r.stderr, r.stderr
    finally:
        remove_tree(other)


def test_the_build_key_covers_the_lock_and_every_input(tmp_path):
    from corral.images.build import Description, build_key

    note = tmp_path / "note.txt"
    note.write_text("one\n")
    toml = tmp_path / "i.toml"
    toml.write_text('[image]\nsuite = "trixie"\npackages = ["curl"]\n[files]\n'
                    '"/etc/note" = "note.txt"\n')
    debs = [{"name": "curl", "version": "8.0", "arch": "amd64", "sha256": "a" * 64}]
    key = build_key(Description(str(toml)), debs)
    assert key == build_key(Description(str(toml)), [dict(d) for d in reversed(debs)])
    other = [{**debs[0], "sha256": "b" * 64}]
    assert build_key(Description(str(toml)), other) != key           # another .deb
    note.write_text("two\n")
    assert build_key(Description(str(toml)), debs) != key            # another file's bytes
    note.write_text("one\n")
    toml.write_text(toml.read_text() + '[env]\nA = "1"\n')
    assert build_key(Description(str(toml)), debs) != key            # another description
