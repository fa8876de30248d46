"""`corral image ...` and `corral install`: loaded only for those commands, never by
`corral run`."""

from __future__ import annotations

import json
import sys

from ..errors import CorralError, UsageError
from .progress import progress_printer

IMAGE_USAGE = """\
usage: corral image COMMAND [--state-dir DIR] ...

  ls [--json]                      one image a line: name, digest, size, created
  show NAME|DIGEST [--json]        metadata: source, env, workdir, base, lock, SBOM
  build FILE|NAME [--name N] [--lock FILE] [--index-ca FILE] [--no-cache]
                                   build from a corral-image.toml (or a catalogue name:
                                   python, datascience); with --lock, refuse any drift,
                                   and return the image already built from that lock
                                   (unless --no-cache)
  lock FILE|NAME [-o LOCKFILE]     resolve every Debian package (version, sha256) and
                                   every wheel (hash) and write the lock
  tag NAME|DIGEST NEWNAME          give an image another name
  rm NAME|DIGEST...                remove a name (the image goes with its last name)
  gc                               remove unnamed images and leftovers of failed builds
  export NAME|DIGEST FILE.tar      write an OCI image layout tarball
  import FILE.tar [--name N]       read an OCI image layout or `docker save` tarball

The store is $CORRAL_STATE_DIR/images (default /var/lib/corral/images for root, else
~/.local/share/corral/images); --state-dir DIR overrides it. Exit 4 for an image error.
"""

INSTALL_USAGE = """\
usage: corral install --image BASE [--name NEW] [--index-url URL]... [--allow-name NAME]...
                      [--allow-sdist] [--timeout D] [--index-ca FILE] [--state-dir DIR]
                      (-r requirements.txt | PACKAGE...)

Install Python packages into a new image: the base plus one layer. pip runs in a sandbox
on the base image whose network reaches only the package index hosts (PyPI's by default,
or the --index-url hosts), with no secrets, no workspace, and a timeout. Wheels only unless
--allow-sdist; a requirements file with hashes is installed with --require-hashes. Names
close to a popular package are refused unless --allow-name NAME. The new image carries an
SBOM (CycloneDX JSON): corral image show NEW. --index-ca FILE: a PEM bundle the indexes'
TLS is checked against (an internal index, a TLS-intercepting mirror) instead of pip's own.
"""


def _take(args: list[str], flag: str, multi: bool = False):
    """Remove `flag VALUE` / `flag=VALUE` (every one when multi) from args."""
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == flag or a.startswith(flag + "="):
            if "=" in a:
                out.append(a.split("=", 1)[1])
                del args[i]
            else:
                if i + 1 >= len(args):
                    raise UsageError(f"{flag} needs a value", field=flag)
                out.append(args[i + 1])
                del args[i:i + 2]
            continue
        i += 1
    if multi:
        return out
    if len(out) > 1:
        raise UsageError(f"{flag} given twice", field=flag)
    return out[0] if out else None


def _flag(args: list[str], flag: str) -> bool:
    if flag in args:
        args.remove(flag)
        return True
    return False


def _store(args: list[str]):
    from .store import Store

    return Store(_take(args, "--state-dir"))


def _no_more(args: list[str], command: str) -> None:
    for a in args:
        if a.startswith("-"):
            raise UsageError(f"unknown option {a} for corral {command}; see corral image "
                             "--help", field=a)




def _line(meta: dict) -> str:
    from .store import human

    names = ",".join(meta.get("names") or []) or "-"
    return (f"{names:<20} {meta['digest'][:19]}  {human(meta.get('size', 0)):>10}  "
            f"{meta.get('created', '')}")


def cmd_image(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(IMAGE_USAGE)
        return 0 if args else 2
    sub, rest = args[0], list(args[1:])
    try:
        if "-h" in rest or "--help" in rest:
            sys.stdout.write(IMAGE_USAGE)
            return 0
        store = _store(rest)
        as_json = _flag(rest, "--json")
        if sub == "ls":
            _no_more(rest, "image ls")
            images = store.images()
            if as_json:
                sys.stdout.write(json.dumps(images, indent=1) + "\n")
            else:
                for meta in images:
                    sys.stdout.write(_line(meta) + "\n")
            return 0
        if sub == "show":
            _no_more(rest, "image show")
            if len(rest) != 1:
                raise UsageError("corral image show NAME|DIGEST", field="NAME")
            meta = store.info(store.resolve(rest[0], field="NAME"))
            if as_json:
                sys.stdout.write(json.dumps(meta, indent=1) + "\n")
            else:
                sys.stdout.write(render_show(meta))
            return 0
        if sub == "rm":
            _no_more(rest, "image rm")
            if not rest:
                raise UsageError("corral image rm NAME|DIGEST...", field="NAME")
            for ref in rest:
                for what in store.remove(ref):
                    sys.stdout.write(what + "\n" if what.startswith("kept ")
                                     else f"removed {what}\n")
            _detach_overlays()
            return 0
        if sub == "tag":
            _no_more(rest, "image tag")
            if len(rest) != 2:
                raise UsageError("corral image tag NAME|DIGEST NEWNAME", field="NAME")
            store.tag(rest[1], store.resolve(rest[0], field="NAME"))
            return 0
        if sub == "gc":
            _no_more(rest, "image gc")
            for what in store.gc():
                sys.stdout.write(f"removed {what}\n")
            _detach_overlays()
            return 0
        if sub == "export":
            _no_more(rest, "image export")
            if len(rest) != 2:
                raise UsageError("corral image export NAME|DIGEST FILE.tar", field="FILE")
            from .oci import export_tar

            export_tar(store, store.resolve(rest[0], field="NAME"), rest[1])
            return 0
        if sub == "import":
            name = _take(rest, "--name")
            _no_more(rest, "image import")
            if len(rest) != 1:
                raise UsageError("corral image import FILE.tar [--name N]", field="FILE")
            from .oci import import_tar
            from .store import check_name

            if name:
                check_name(name)
            digest = import_tar(store, rest[0], name, progress_printer())
            sys.stdout.write(digest + "\n")
            return 0
        if sub in ("build", "lock"):

            return (cmd_build if sub == "build" else cmd_lock)(store, rest)
        raise UsageError(f"unknown image command {sub!r}; see corral image --help",
                         field="image")
    except CorralError as e:
        sys.stderr.write(f"corral: {e}\n")
        return e.exit_code


def _detach_overlays() -> None:
    """The shared overlays of removed images' layers (backends/host/imageroot.py)."""
    import os

    if os.geteuid() == 0:
        from ..backends.host.imageroot import sweep_shared

        sweep_shared()


def render_show(meta: dict) -> str:
    from .store import human

    out = [f"digest:   {meta['digest']}",
           f"names:    {', '.join(meta.get('names') or []) or '-'}",
           f"size:     {human(meta.get('size', 0))}",
           f"created:  {meta.get('created', '')}",
           f"source:   {json.dumps(meta.get('source', {}), sort_keys=True)}"]
    if meta.get("base"):
        out.append(f"base:     {meta['base']}")
    if isinstance(meta.get("layers"), list) and meta["layers"]:
        out.append(f"root:     {meta.get('root')} (the base tree)")
        for i, layer in enumerate(meta["layers"], 1):
            out.append(f"layer {i}:  {layer}" + (f" ({human(meta['layer_size'])})"
                                                if i == len(meta["layers"])
                                                and meta.get("layer_size") is not None
                                                else ""))
    out.append(f"workdir:  {meta.get('workdir') or '-'}")
    for e in meta.get("env") or []:
        out.append(f"env:      {e}")
    lock = meta.get("lock") or {}
    if lock:
        out.append(f"debian:   {lock.get('suite')} ({len(lock.get('debs', []))} packages "
                   "pinned)")
        if lock.get("wheels"):
            out.append(f"wheels:   {len(lock['wheels'])} pinned")
    sbom = meta.get("sbom")
    if sbom:
        comps = sbom.get("components", [])
        out.append(f"sbom:     CycloneDX {sbom.get('specVersion')}, {len(comps)} components")
        for c in comps:
            h = (c.get("hashes") or [{}])[0].get("content", "")
            lic = ",".join(x.get("license", {}).get("id") or x.get("license", {}).get("name", "")
                           for x in c.get("licenses", [])) or "-"
            out.append(f"  {c.get('name')} {c.get('version')}  sha256:{h[:16]}  {lic}  "
                       f"{c.get('purl', '')}")
    return "\n".join(out) + "\n"


def cmd_install(args: list[str]) -> int:
    if not args or "-h" in args or "--help" in args:
        sys.stdout.write(INSTALL_USAGE)
        return 0 if args else 2
    try:
        return _install_main(_store(args), args)
    except CorralError as e:
        sys.stderr.write(f"corral: {e}\n")
        return e.exit_code


def cmd_build(store, args: list[str]) -> int:
    import os

    from .build import _write_lock_file, build, read_lock, resolve_description
    from .store import check_name

    name = _take(args, "--name")
    lock_path = _take(args, "--lock")
    index_ca = _take(args, "--index-ca")
    no_cache = _flag(args, "--no-cache")
    _no_more(args, "image build")
    if len(args) != 1:
        raise UsageError("corral image build FILE|NAME [--name N] [--lock FILE]", field="FILE")
    desc = resolve_description(args[0])
    from .catalogue import CATALOGUE

    name = name or desc.name or (args[0] if args[0] in CATALOGUE else None)
    if name:
        check_name(name)
    # --lock FILE that does not exist yet: build unpinned, then write what was installed
    # to FILE (the same lock `corral image lock` would have written, one mmdebstrap run)
    fresh = bool(lock_path) and not os.path.exists(lock_path)
    lock = read_lock(lock_path) if lock_path and not fresh else None
    digest = build(store, desc, lock=lock, name=name, progress=progress_printer(),
                   index_ca=index_ca, use_cache=not no_cache,
                   notice=lambda m: sys.stderr.write(f"corral: {m}\n"))
    if fresh:
        meta = store.info(digest)
        base = meta.get("base") or digest
        debs = store.info(base)["lock"]["debs"] if base != digest else meta["lock"]["debs"]
        _write_lock_file(lock_path, desc, debs)
    sys.stdout.write(digest + "\n")
    return 0


def cmd_lock(store, args: list[str]) -> int:
    import os

    from .build import resolve_description, write_lock

    out = _take(args, "-o") or _take(args, "--output")
    _no_more(args, "image lock")
    if len(args) != 1:
        raise UsageError("corral image lock FILE|NAME [-o LOCKFILE]", field="FILE")
    desc = resolve_description(args[0])
    out = out or os.path.splitext(desc.path)[0] + ".lock.json"
    lock = write_lock(store, desc, out, progress_printer())
    sys.stdout.write(f"{out}: {len(lock['debs'])} Debian packages pinned\n")
    return 0


def _install_main(store, args: list[str]) -> int:
    """`corral install` with the store chosen: parse the rest and run the install phase."""
    import sys

    from .install import _duration, install

    base = _take(args, "--image")
    name = _take(args, "--name")
    urls = _take(args, "--index-url", multi=True)
    allowed = _take(args, "--allow-name", multi=True)
    req = _take(args, "-r") or _take(args, "--requirement")
    timeout = _take(args, "--timeout")
    sdist = _flag(args, "--allow-sdist")
    nameservers = _take(args, "--nameserver", multi=True)
    index_ca = _take(args, "--index-ca")
    for a in args:
        if a.startswith("-"):
            raise UsageError(f"unknown option {a}; see corral install --help", field=a)
    if not base:
        raise UsageError("--image BASE is required (the image to install into)",
                         field="--image")
    digest = install(store, base, requirements=req, packages=args, name=name,
                     index_urls=urls or None, allow_names=allowed, allow_sdist=sdist,
                     timeout=_duration(timeout) if timeout else 900.0,
                     nameservers=nameservers, progress=progress_printer(),
                     index_ca=index_ca)
    sys.stdout.write(digest + "\n")
    return 0
