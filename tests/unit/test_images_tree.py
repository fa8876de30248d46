"""Pieces of the image store that need no build: a layered image's lookups through its
layers' manifests, and the .pyc rewrite builds and installs apply."""

import os
import py_compile
import subprocess
import sys

from corral.images.store import Store, _in_layer, layered_digest
from corral.images.tree import TreeBuilder, manifest_entry, manifest_of


def _line(path, kind, data=""):
    return b"\0".join([path.encode(), kind.encode(), b"0755", b"0", data.encode()]) + b"\n"


BASE = b"".join(_line(p, k) for p, k in [("etc", "d"), ("etc/a", "f"), ("opt", "d"),
                                        ("opt/x", "f"), ("usr", "d"), ("usr/lib", "d"),
                                        ("usr/lib/m", "f")])
LAYER = b"".join([_line("etc", "d", "opaque"), _line("etc/b", "f"), _line("opt", "d"),
                  _line("opt/x", "w"), _line("usr", "d"), _line("usr/lib", "d"),
                  _line("usr/lib/n", "l")])


def test_manifest_entry_finds_whole_paths_only():
    assert manifest_entry(BASE, "etc") == ("d", "")
    assert manifest_entry(BASE, "usr/lib/m") == ("f", "")
    assert manifest_entry(BASE, "usr/li") is None and manifest_entry(BASE, "lib/m") is None
    assert manifest_entry(LAYER, "etc") == ("d", "opaque")


def test_a_layer_decides_or_leaves_it_to_the_layers_below():
    assert _in_layer(LAYER, ["etc", "a"], None) is False       # hidden by the opaque etc
    assert _in_layer(LAYER, ["etc", "b"], "f") is True
    assert _in_layer(LAYER, ["opt", "x"], None) is False       # a whiteout
    assert _in_layer(LAYER, ["usr", "lib", "m"], None) is None  # below: the base has it
    assert _in_layer(LAYER, ["usr", "lib", "n"], "d") is False  # a link, not a directory
    assert _in_layer(LAYER, ["srv"], None) is None


def test_has_entry_walks_the_layers_over_the_base(tmp_path):
    st = Store(str(tmp_path))
    st.ensure()
    root, layer = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    with open(os.path.join(st.meta, "1" * 64 + ".manifest"), "wb") as f:
        f.write(BASE)
    with open(os.path.join(st.meta, "2" * 64 + ".layer"), "wb") as f:
        f.write(LAYER)
    info = {"root": root, "layers": [layer]}
    assert st._has_entry(info, "/usr/lib/m", "f") and st._has_entry(info, "/etc/b")
    assert not st._has_entry(info, "/etc/a") and not st._has_entry(info, "/opt/x")
    assert st._has_entry({"root": root, "layers": []}, "/opt/x", "f")
    assert layered_digest(root, layer) != layered_digest(layer, root)


def test_a_layer_keeps_whiteouts_and_opaque_directories(tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    b = TreeBuilder(str(tree), layer=True)
    b.add_dir("usr", 0o755)
    b.whiteout("usr/.wh.gone")
    b.whiteout("etc/.wh..wh..opq")
    man, _ = manifest_of(str(tree), b.modes, b.opaque)
    b.close()
    assert b"usr/gone\0w\x000000\x000\0\n" in man and b"etc\0d\x000755\x000\0opaque\n" in man
    assert os.lstat(tree / "usr" / "gone").st_rdev == 0
    assert os.getxattr(tree / "etc", "trusted.overlay.opaque") == b"y"


def test_checked_pycs_become_unchecked_and_python_trusts_them(tmp_path):
    """A checked hash-based .pyc written through a builder with unchecked_pycs: python
    runs it without looking at the source (a changed source is not noticed), as it does
    for `compileall --invalidation-mode unchecked-hash`; without the rewrite it notices."""
    src = tmp_path / "src"
    (src / "__pycache__").mkdir(parents=True)
    (src / "mod.py").write_text("X = 'compiled'\n")
    tag = sys.implementation.cache_tag
    pyc = src / "__pycache__" / f"mod.{tag}.pyc"
    py_compile.compile(str(src / "mod.py"), str(pyc),
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert pyc.read_bytes()[4] == 3
    for unchecked, want in ((True, "compiled"), (False, "edited")):
        out = tmp_path / f"tree-{unchecked}"
        out.mkdir()
        b = TreeBuilder(str(out))
        b.unchecked_pycs = unchecked
        b.apply_dir(str(src))
        b.close()
        got = (out / "__pycache__" / f"mod.{tag}.pyc").read_bytes()
        assert got[4] == (1 if unchecked else 3)
        assert got[8:] == pyc.read_bytes()[8:]   # the same source hash and code
        (out / "mod.py").chmod(0o644)
        (out / "mod.py").write_text("X = 'edited'\n")
        r = subprocess.run([sys.executable, "-c", "import mod; print(mod.X)"], cwd=out,
                           capture_output=True, text=True, check=True,
                           env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin"})
        assert r.stdout.strip() == want


def test_a_name_reserved_for_whiteouts_is_refused_in_what_a_sandbox_wrote(tmp_path):
    """pip's output holding `.wh.x` would turn into a whiteout of x after an export and an
    import: refused when the install's layer is copied."""
    import pytest

    from corral.errors import ImageError

    src = tmp_path / "src"
    (src / "usr").mkdir(parents=True)
    (src / "usr" / ".wh.python3").write_text("")
    out = tmp_path / "out"
    out.mkdir()
    b = TreeBuilder(str(out), layer=True)
    with pytest.raises(ImageError, match="reserve for whiteouts"):
        b.apply_dir(str(src))
    b.close()
