"""`[install]` in a policy: the packages a run needs, installed into its image first.

    image = "python"                      # the base
    [install]
    requirements = "/abs/requirements.txt"
    packages = ["requests==2.32.3"]
    index_urls = ["https://pypi.org/simple"]

Before the sandbox is planned, the base is resolved to its digest and the install is keyed
by the sha256 of (base digest, the requirements file's bytes, packages, index URLs). An
image named `install-KEY16` whose metadata carries that key is reused; otherwise the install
phase (install.py: wheels only, a network that reaches only the index hosts, the typosquat
check) makes it, under that name. The run then sees the installed image, by digest, with the
install phase's network gone. Editing the requirements or moving the base's name to another
image gives another key, so another install; `corral image rm install-KEY16` forces one.

Imported only for a policy with [install] (never on a plain `corral run`'s path).
"""

from __future__ import annotations

import hashlib
import json

from ..errors import ImageError


def install_key(base_digest: str, install, req_bytes: bytes | None) -> str:
    """The key of an install: what decides which packages end up in the image."""
    doc = {"v": 1, "base": base_digest,
           "requirements": hashlib.sha256(req_bytes).hexdigest() if req_bytes is not None
           else None,
           "packages": list(install.packages), "index_urls": list(install.index_urls)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _read_requirements(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read((1 << 20) + 1)
    except OSError as e:
        raise ImageError(f"cannot read {path!r}: {e.strerror}",
                         field="install.requirements") from None
    if len(data) > 1 << 20:
        raise ImageError(f"{path!r} is over 1 MiB; a requirements file is small",
                         field="install.requirements")
    return data


def lookup(policy, store=None) -> tuple[str, str, str | None]:
    """(base digest, key, the installed image's digest or None when not installed yet)."""
    from .store import Store

    store = store or Store()
    base = store.resolve(policy.image, field="image")
    key = install_key(base, policy.install, _read_requirements(policy.install.requirements))
    digest = store.names().get(image_name(key))
    if digest:
        try:
            meta = store.info(digest)
        except (OSError, ValueError):
            meta = {}
        if (meta.get("source") or {}).get("install_key") != key:
            digest = None   # the name was moved to another image: not this install's
    return base, key, digest


def image_name(key: str) -> str:
    return "install-" + key[:16]


def resolve_install(policy, store=None, progress=None):
    """The policy with `image` replaced by the installed image's digest (installing it
    first when it is not in the store) and [install] emptied."""
    from ..policy.schema import Install
    from .install import install
    from .store import Store

    store = store or Store()
    base, key, digest = lookup(policy, store)
    if digest is None:
        ins = policy.install
        if progress is None:
            from .progress import progress_printer

            progress = progress_printer()
        if progress:
            progress(f"[install]: installing into {policy.image} ({base[:19]}) first; the "
                     f"image is kept as {image_name(key)}")
        digest = install(store, base, requirements=ins.requirements, packages=ins.packages,
                         name=image_name(key), index_urls=list(ins.index_urls) or None,
                         allow_names=ins.allow_names, timeout=ins.timeout,
                         nameservers=policy.network.nameservers, progress=progress,
                         key=key)
    return policy.replace(image=digest, install=Install())


def describe(policy, store=None):
    """For explain (which never installs): (the policy a run would use, a description).
    Installed already: the installed image; not yet: the base stands in (the same root
    but for the packages)."""
    from ..policy.schema import Install

    try:
        base, key, digest = lookup(policy, store)
    except ImageError as e:
        return policy.replace(install=Install()), {
            "base": policy.image, "key": "", "installed": None,
            "note": f"cannot resolve the base: {e.message}"}
    what = ", ".join(filter(None, [policy.install.requirements, *policy.install.packages]))
    info = {"base": base, "key": key, "installed": digest, "name": image_name(key)}
    if digest:
        info["note"] = (f"{what} installed on {policy.image} as {image_name(key)} "
                        f"({digest[:19]}); the run uses it")
        return policy.replace(image=digest, install=Install()), info
    info["note"] = (f"{what} not installed yet: the first run installs it on {policy.image} "
                    f"({base[:19]}) through the install phase and keeps it as "
                    f"{image_name(key)}")
    return policy.replace(image=base, install=Install()), info
