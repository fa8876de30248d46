"""An ImageRoot op of a plan, resolved against the store: its digest and tree, the image's
env beneath the policy's, and its working directory. Imported only for runs on an image."""

from __future__ import annotations

import os

from ..plan import SCRATCH, Environment, ImageRoot, Plan
from ..policy.schema import BASE_ENV
from .store import Store


def resolve_plan(plan: Plan, store: Store | None = None) -> Plan:
    ops = list(plan.ops)
    cwd = plan.cwd
    for i, op in enumerate(ops):
        if not isinstance(op, ImageRoot) or op.tree:
            continue
        store = store or Store()
        digest = store.resolve(op.ref)
        tree = store.tree(digest)
        _check_reachable(tree)
        ops[i] = op.replace(digest=digest, tree=tree, pinned=op.ref == digest)
        meta = store.info(digest)
        base = dict(BASE_ENV)
        for j, env_op in enumerate(ops):
            if isinstance(env_op, Environment):
                env = dict(env_op.env)
                for kv in meta.get("env") or []:
                    k, _, v = kv.partition("=")
                    # the image's variables replace corral's defaults, never the policy's
                    # own (env.pass, env.set) and never HOME (/scratch)
                    if k != "HOME" and (k not in env or env[k] == base.get(k)):
                        env[k] = v
                ops[j] = env_op.replace(env=tuple(env.items()))
        workdir = meta.get("workdir") or ""
        if cwd == SCRATCH and workdir.startswith("/") and has_entry(
                store.manifest(digest), workdir, "d"):
            cwd = os.path.normpath(workdir)
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
    """Whether the image's manifest lists `path` (absolute, in the image), of `kind` (d, f,
    l) when given: looked up in the manifest, never by following the tree's links."""
    key = os.fsencode(os.path.normpath(path).lstrip("/")) + b"\0"
    if manifest.startswith(key):
        at = 0
    else:
        at = manifest.find(b"\n" + key) + 1
        if at == 0:
            return False
    return kind is None or manifest[at + len(key):at + len(key) + 1] == kind.encode()


def missing_mount_points(op: ImageRoot, paths) -> list[str]:
    """The paths (binds) that have no mount point in the image: it is read-only, so
    nothing can be created there."""
    if not op.digest:
        return []
    manifest = Store(os.path.dirname(os.path.dirname(os.path.dirname(op.tree)))).manifest(
        op.digest)
    return [p for p in paths if not has_entry(manifest, p)]
