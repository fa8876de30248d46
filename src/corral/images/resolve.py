"""An ImageRoot op of a plan, resolved against the store: its digest and tree, the image's
env beneath the policy's, and its working directory. Imported only for runs on an image."""

from __future__ import annotations

import os

from ..plan import SCRATCH, Environment, ImageRoot, Plan
from ..policy.schema import BASE_ENV
from .store import Store


def resolve_plan(plan: Plan, store: Store | None = None) -> Plan:
    """The plan with its ImageRoot resolved: digest, base tree, layers, env, workdir. On
    `corral run`'s path: it reads names.json and the image's small run file only."""
    ops = list(plan.ops)
    cwd = plan.cwd
    for i, op in enumerate(ops):
        if not isinstance(op, ImageRoot) or op.tree:
            continue
        store = store or Store()
        digest = store.resolve(op.ref)
        info = store.run_info(digest)
        tree = store.tree(info["root"])
        _check_reachable(tree)
        layers = tuple(store.layer_path(x) for x in info["layers"])
        ops[i] = op.replace(digest=digest, tree=tree, pinned=op.ref == digest, layers=layers)
        base = dict(BASE_ENV)
        for j, env_op in enumerate(ops):
            if isinstance(env_op, Environment):
                env = dict(env_op.env)
                for kv in info.get("env") or []:
                    k, _, v = kv.partition("=")
                    # the image's variables replace corral's defaults, never the policy's
                    # own (env.pass, env.set) and never HOME (/scratch)
                    if k != "HOME" and (k not in env or env[k] == base.get(k)):
                        env[k] = v
                ops[j] = env_op.replace(env=tuple(env.items()))
        if cwd == SCRATCH and info.get("workdir"):   # a directory of the image (run_info)
            cwd = info["workdir"]
    return plan.replace(ops=tuple(ops), cwd=cwd)


def _check_reachable(tree: str) -> None:
    """A sandbox opens its root as its own unprivileged uid: every directory above the
    tree must let others through (o+x), or the run would fail later with EACCES."""
    import stat

    from ..errors import ImageError

    d = os.path.dirname(tree)
    while True:
        mode = os.stat(d).st_mode
        if not mode & stat.S_IXOTH:
            raise ImageError(f"the store's tree is out of the sandbox's reach: {d} is mode "
                             f"{stat.S_IMODE(mode):04o}; chmod o+x {d}", field="image")
        if d == "/":
            return
        d = os.path.dirname(d)


def has_entry(manifest: bytes, path: str, kind: str | None = None) -> bool:
    """Whether a base tree's manifest lists `path` (absolute, in the image), of `kind` (d,
    f, l) when given: looked up in the manifest, never by following the tree's links."""
    from .tree import manifest_entry

    got = manifest_entry(manifest, os.path.normpath(path).lstrip("/"))
    return got is not None and (kind is None or got[0] == kind)


def missing_mount_points(op: ImageRoot, paths) -> list[str]:
    """The paths (binds) that have no mount point in the image: it is read-only, so
    nothing can be created there."""
    paths = list(paths)
    if not op.digest or not paths:
        return []
    store = Store(os.path.dirname(os.path.dirname(os.path.dirname(op.tree))))
    return [p for p in paths if not store.has_entry(op.digest, p)]
