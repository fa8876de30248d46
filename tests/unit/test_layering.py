"""The import graph reads top to bottom: no module imports a layer above its own.

Layers, lowest first (docs/architecture.md):

    0  errors, _record, result, termsafe, events     shared vocabulary
    0  guest/                                        runs inside the sandbox: stdlib only
    1  linux/                                        kernel mechanisms; know no policy
    1  policy/                                       the language; pure
    2  egress/                                       the proxy process
    3  plan, grants                                  policy -> plan; secret values
    4  backends/ (host/ too), images/ (store, oci)   tiers and their host pieces; images
    4  audit/ (record, store, query, receipt)        the audit store: runs, events, receipts
    5  images/build, install, policy_install         image work that runs sandboxes
    5  runtime/                                      one sandbox's life; the way in
    6  cli (+ cli_*), probe/, images/cli, audit/cli*  faces (audit/cli_learn: corral learn;
                                                     _runpath: the launcher's file)
    6  service/, client                              corral serve, its SDK and MCP: faces
    6  scale/, batch                                 corral batch and corral.batch.map;
                                                     ray only in scale/ray.py
    -  corral/__init__.py                            the package face (re-exports); only
                                                     faces may import it

Every import counts, at module level or inside a function (a lazy import is still an
arrow), read from the source with `ast`.
"""

import ast
import os

import pytest
from conftest import ROOT

SRC = os.path.join(ROOT, "src")

FACES = 6
LEAF = {"corral.errors", "corral._record", "corral.result", "corral.termsafe", "corral.events"}


def layer(mod: str) -> int | None:
    parts = mod.split(".")
    if mod == "corral":
        return None                      # the package face may re-export anything
    if mod in LEAF or mod.startswith("corral.guest"):
        return 0
    top = parts[1]
    if top in ("linux", "policy"):
        return 1
    if top == "egress":
        return 2
    if mod in ("corral.plan", "corral.grants"):
        return 3
    if mod.startswith(("corral.images.cli", "corral.audit.cli")):
        return 6
    if top == "audit":
        return 4
    if mod.startswith(("corral.images.build", "corral.images.install",
                       "corral.images.policy_install")):
        return 5                         # they run sandboxes: the runtime's peers
    if top in ("backends", "images"):
        return 4
    if top == "runtime":
        return 5
    if top in ("cli", "_runpath", "probe", "__main__", "service", "client", "scale", "batch") \
            or top.startswith("cli_"):   # the CLI's own parts: cli_help, cli_terminal, ...
        return 6
    raise AssertionError(f"{mod} has no layer: add it to tests/unit/test_layering.py and "
                         f"docs/architecture.md")


def modules():
    for dirpath, _, files in os.walk(os.path.join(SRC, "corral")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
                is_pkg = rel.endswith(".__init__")
                yield (rel[:-9] if is_pkg else rel), is_pkg, path


def _from_target(pkg: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` in package `pkg` reads from, relative or not."""
    if not node.level:
        return node.module or ""
    base = pkg.split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: str, is_pkg: bool, path: str):
    """(imported module, line) for every corral import in the file."""
    pkg = mod if is_pkg else mod.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "corral":
                    yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(pkg, node)
            if target.split(".")[0] != "corral":
                continue
            for a in node.names:     # `from corral.linux import seccomp` names a module
                sub = f"{target}.{a.name}"
                yield (sub if _is_module(sub) else target), node.lineno


def _is_module(mod: str) -> bool:
    base = os.path.join(SRC, *mod.split("."))
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))


ALL = sorted(modules())


def test_every_module_has_a_layer():
    for mod, _, _ in ALL:
        layer(mod)


@pytest.mark.parametrize("mod,is_pkg,path", ALL, ids=[m for m, _, _ in ALL])
def test_no_import_runs_up(mod, is_pkg, path):
    mine = layer(mod)
    if mine is None:
        return
    bad = []
    for target, line in imports(mod, is_pkg, path):
        theirs = layer(target)
        if (target == "corral" and mine < FACES) or (theirs is not None and theirs > mine):
            bad.append(f"{path}:{line}: {mod} (layer {mine}) imports {target} "
                       f"(layer {theirs})")
    assert not bad, "\n".join(bad)


def _top(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else mod


@pytest.mark.parametrize("mod,is_pkg,path", [m for m in ALL if _top(m[0]) in ("policy", "linux")],
                         ids=[m for m, _, _ in ALL if _top(m) in ("policy", "linux")])
def test_policy_and_linux_import_only_the_vocabulary(mod, is_pkg, path):
    """policy/ is the language: it imports nothing of corral but errors and _record;
    linux/ wraps kernel mechanisms and knows no Policy, Plan, tier or Result."""
    own = f"corral.{_top(mod)}"
    bad = [f"{path}:{line}: {mod} imports {t}" for t, line in imports(mod, is_pkg, path)
           if not (t == own or t.startswith(own + ".") or t in ("corral.errors",
                                                                 "corral._record"))]
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_cli():
    """Nothing but the CLI's own parts (cli_*.py: the commands it loads only when asked
    for, off `corral run`'s path) imports cli."""
    bad = [f"{path}:{line}: {mod}" for mod, is_pkg, path in ALL
           if mod != "corral.cli" and not mod.startswith("corral.cli_")
           for t, line in imports(mod, is_pkg, path) if t == "corral.cli"]
    assert not bad, "\n".join(bad)


def test_the_layering_test_catches_an_upward_import(tmp_path):
    """The test itself can fail: a policy module importing the plan is caught."""
    f = tmp_path / "x.py"
    f.write_text("from ..plan import Plan\n")
    found = list(imports("corral.policy.x", False, str(f)))
    assert found == [("corral.plan", 1)]
    assert layer("corral.plan") > layer("corral.policy.x")


def test_every_import_names_a_module_that_exists():
    """A lazy import inside a function fails only when that function runs: check them all
    here, so a moved module leaves no import behind."""
    bad = [f"{path}:{line}: {t}" for mod, is_pkg, path in ALL
           for t, line in imports(mod, is_pkg, path) if t != "corral" and not _is_module(t)]
    assert not bad, "\n".join(bad)


def test_ray_is_imported_only_by_scale_ray():
    """Ray is heavy (~1 s of imports): only scale/ray.py imports it, and nothing imports
    scale/ray.py but the batch driver (lazily, for --ray / ray_address)."""
    bad = []
    for mod, is_pkg, path in ALL:
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                else []
            if any(n == "ray" or n.startswith("ray.") for n in names) and \
                    mod != "corral.scale.ray":
                bad.append(f"{path}:{node.lineno}: {mod} imports ray")
        bad += [f"{path}:{line}: {mod} imports corral.scale.ray"
                for t, line in imports(mod, is_pkg, path)
                if t == "corral.scale.ray" and mod != "corral.scale.driver"]
    assert not bad, "\n".join(bad)


def test_guest_code_imports_nothing_of_corral():
    """guest/ is shipped into the sandbox as source and runs where corral is not
    installed: standard library only."""
    bad = [f"{path}:{line}: {t}" for mod, is_pkg, path in ALL if mod.startswith("corral.guest")
           for t, line in imports(mod, is_pkg, path)]
    assert not bad, "\n".join(bad)


def test_the_proxy_pieces_never_import_the_server():
    """egress/server.py mixes in relay, forward and terminate and uses budget; none of them
    imports server back, and budget.py (pure) imports nothing of corral but the config."""
    pieces = {f"corral.egress.{m}" for m in ("relay", "forward", "terminate", "budget")}
    found = {mod: [t for t, _ in imports(mod, is_pkg, path)]
             for mod, is_pkg, path in ALL if mod in pieces}
    assert set(found) == pieces
    bad = [f"{mod} imports {t}" for mod, ts in found.items() for t in ts
           if t == "corral.egress.server"]
    bad += [f"corral.egress.budget imports {t}" for t in found["corral.egress.budget"]
            if t != "corral.egress.config"]
    assert not bad, "\n".join(bad)


def test_no_module_is_over_900_lines():
    """Issue 14's bound: a module that grows past it is split by what it owns, not left
    to grow (the one that had 1,392 lines mixed moving bytes with making decisions)."""
    long = {}
    for mod, _, path in ALL:
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > 900:
            long[mod] = n
    assert long == {}, f"split these modules (lines): {long}"


def _top_level_names(path: str) -> set[str]:
    """What a module defines or imports at its top level (also under top-level if, try
    and with), as `from M import name` would find it."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names: set[str] = set()

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    names.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names.add(n.id)
            elif isinstance(node, ast.If):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for h in node.handlers:
                    walk(h.body)
            elif isinstance(node, ast.With):
                walk(node.body)
    walk(tree.body)
    if "__getattr__" in names:   # names made on first use (PEP 562): the strings its
        for node in tree.body:   # __getattr__ and the top-level tuples it reads name
            if isinstance(node, (ast.FunctionDef, ast.Assign)) and (
                    isinstance(node, ast.Assign) or node.name == "__getattr__"):
                names.update(n.value for n in ast.walk(node)
                             if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return names


def test_every_name_imported_from_corral_exists():
    """`from corral.x import name` names something x has: a rename that missed a lazy
    import (inside a function, so nothing fails until that path runs) is caught here.
    (CI found `from .cli import _writer` in cli_sandbox.py after a rename.)"""
    paths = {mod: path for mod, _, path in ALL}
    missing = []
    for mod, is_pkg, path in ALL:
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _from_target(pkg, node)
            if target not in paths:
                continue
            have = _top_level_names(paths[target])
            for a in node.names:
                if a.name == "*" or a.name.startswith("__") or a.name in have:
                    continue
                c_source = os.path.join(os.path.dirname(paths[target]), f"{a.name}.c")
                if f"{target}.{a.name}" not in paths and not os.path.isfile(c_source):
                    missing.append(f"{path}:{node.lineno}: {target} has no {a.name}")
    assert missing == [], "\n".join(missing)
