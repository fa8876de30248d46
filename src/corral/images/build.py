"""`corral image build` and `corral image lock`: a root tree from a corral-image.toml.

    [image]
    suite = "bookworm"                    # a Debian suite the mirror has
    packages = ["python3", "curl"]        # exactly these (and what they depend on)
    mirror = "http://deb.debian.org/debian"   # default: the host's apt mirror
    workdir = "/scratch"                  # optional
    [python]                              # optional: installed by the install phase
    requirements = "requirements.lock"    # pinned, every line with --hash (pip --require-hashes)
    [files]                               # optional: "/path/in/image" = "host/file"
    "/etc/motd" = "motd.txt"
    [env]                                 # optional
    PYTHONDONTWRITEBYTECODE = "1"

The Debian base comes from mmdebstrap --variant=minbase as root, from the mirror the
host's apt uses (/etc/apt/sources.list.d/debian.sources, else /etc/apt/sources.list),
SOURCE_DATE_EPOCH fixed so its own output is reproducible; its tar output goes through the
same unpacker as an import. `lock` writes every Debian package installed with its
version and the sha256 of its .deb (apt has checked each against the mirror's signed
Release file). A build with a lock pins every version and refuses when any package,
version or hash differs (drift), before anything reaches the store.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time

from ..errors import ImageError

SOURCE_DATE_EPOCH = "1700000000"
TOML_KEYS = {"image": {"suite", "packages", "mirror", "workdir", "name"},
             "python": {"requirements", "packages", "index_url"},
             "npm": {"lock"}, "files": None, "env": None}
PKG_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789+-.")


class Description:
    """A parsed corral-image.toml."""

    def __init__(self, path: str) -> None:
        import tomllib

        self.path = os.path.abspath(path)
        self.dir = os.path.dirname(self.path)
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
            data = tomllib.loads(raw.decode())
        except FileNotFoundError:
            raise ImageError(f"{path!r} does not exist; name a corral-image.toml or a "
                             "catalogue image (python, datascience)", field="FILE") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ImageError(f"{path}: not valid TOML ({e})", field="FILE") from None
        import hashlib

        self.sha256 = hashlib.sha256(raw).hexdigest()
        for key, value in data.items():
            if key not in TOML_KEYS:
                raise ImageError(f"unknown table [{key}]; use {', '.join(TOML_KEYS)}",
                                 field=key)
            known = TOML_KEYS[key]
            if not isinstance(value, dict):
                raise ImageError(f"[{key}] must be a table", field=key)
            for k in value:
                if known is not None and k not in known:
                    raise ImageError(f"unknown key {k!r}; [{key}] takes "
                                     f"{', '.join(sorted(known))}", field=f"{key}.{k}")
        img = data.get("image", {})
        self.suite = img.get("suite")
        if not isinstance(self.suite, str) or not self.suite.isalnum():
            raise ImageError("[image] suite must name a Debian suite, e.g. \"bookworm\"",
                             field="image.suite")
        self.packages = img.get("packages", [])
        if not isinstance(self.packages, list) or not all(
                isinstance(p, str) and p and set(p) <= PKG_CHARS for p in self.packages):
            raise ImageError("[image] packages must be a list of Debian package names",
                             field="image.packages")
        self.mirror = img.get("mirror") or host_mirror()
        self.workdir = img.get("workdir", "")
        self.name = img.get("name")
        py = data.get("python", {})
        self.requirements = (os.path.join(self.dir, py["requirements"])
                             if py.get("requirements") else None)
        self.pip_packages = py.get("packages", [])
        self.index_url = py.get("index_url")
        self.npm_lock = data.get("npm", {}).get("lock")
        if self.npm_lock:   # refused, not silently skipped
            raise ImageError("[npm] lock is not supported yet; install npm packages with a "
                             "[files] entry or leave [npm] out", field="npm.lock")
        self.files = {}
        for dest, src in data.get("files", {}).items():
            if not isinstance(dest, str) or not dest.startswith("/") or not isinstance(src, str):
                raise ImageError(f"[files] {dest!r} = {src!r}: each key is an absolute path "
                                 "in the image, each value a host file", field="files")
            self.files[dest] = os.path.join(self.dir, src)
        self.env = []
        for k, v in data.get("env", {}).items():
            if not isinstance(v, str) or not k.replace("_", "a").isalnum():
                raise ImageError(f"[env] {k} must be a NAME = \"string\"", field=f"env.{k}")
            self.env.append(f"{k}={v}")


def host_mirror() -> str:
    """The first Debian URI of the host's apt sources (deb822 or one-line format)."""
    try:
        with open("/etc/apt/sources.list.d/debian.sources") as f:
            for line in f:
                if line.startswith("URIs:"):
                    uri = line.split(":", 1)[1].split()[0]
                    if "security" not in uri:
                        return uri
    except OSError:
        pass
    try:
        with open("/etc/apt/sources.list") as f:
            for line in f:
                parts = line.split()
                if parts[:1] == ["deb"] and len(parts) > 2 and "security" not in parts[1]:
                    return parts[1] if not parts[1].startswith("[") else parts[2]
    except OSError:
        pass
    return "http://deb.debian.org/debian"


def resolve_description(ref: str) -> Description:
    from .catalogue import CATALOGUE, description

    if ref in CATALOGUE and not os.path.exists(ref):
        return Description(description(ref))
    return Description(ref)


def read_lock(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            lock = json.loads(f.read(16 << 20))
    except FileNotFoundError:
        raise ImageError(f"lock file {path!r} does not exist; corral image lock writes it",
                         field="--lock") from None
    except ValueError:
        raise ImageError(f"lock file {path!r} is not JSON", field="--lock") from None
    if not isinstance(lock, dict) or lock.get("version") != 1 or not isinstance(
            lock.get("debs"), list):
        raise ImageError(f"{path!r} is not a corral image lock (version 1)", field="--lock")
    return lock


# -- mmdebstrap -----------------------------------------------------------------------------
def debian_base(desc: Description, work: str, pins: list[str] | None, progress=None
                ) -> tuple[str, list[dict]]:
    """Run mmdebstrap; (path of its tar, the installed debs: name, version, arch, sha256)."""
    import shutil

    mm = shutil.which("mmdebstrap")
    if mm is None:
        raise ImageError("mmdebstrap is not installed; apt-get install mmdebstrap",
                         field="image")
    out = os.path.join(work, "base.tar")
    listing = os.path.join(work, "debs.tsv")
    rootpath = os.path.join(work, "root.path")
    include = pins if pins is not None else desc.packages
    q = shlex.quote
    argv = [mm, "--variant=minbase", "--mode=root", "--format=tar", "--skip=output/dev",
            "--aptopt=Acquire::Retries \"2\"",
            f"--setup-hook=echo \"$1\" > {q(rootpath)}",
            # what dpkg installed, and apt's package lists (their SHA256 fields are signed
            # through the Release file), before mmdebstrap's cleanup removes the lists
            (f"--customize-hook=cp \"$1\"/var/lib/dpkg/status {q(listing)}.status && "
             f"cat \"$1\"/var/lib/apt/lists/*_Packages > {q(listing)}.packages")]
    if include:
        argv.append("--include=" + ",".join(include))
    argv += [desc.suite, out, desc.mirror]
    env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH, LC_ALL="C.UTF-8")
    if progress:
        progress(f"debian {desc.suite}: mmdebstrap from {desc.mirror} "
                 f"({len(include)} packages named)")
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                         text=True, errors="replace")
    done = threading.Event()
    watcher = None
    if progress:
        watcher = threading.Thread(target=_watch_downloads, args=(rootpath, done, progress),
                                   daemon=True)
        watcher.start()
    lines: list[str] = []
    for line in p.stderr:
        line = line.rstrip()
        lines.append(line)
        if progress and line.startswith("I: ") and "..." in line:
            progress(f"debian: {line[3:]}")
    rc = p.wait()
    done.set()
    if watcher:
        watcher.join()
    if rc != 0:
        raise ImageError("mmdebstrap failed: " + _mm_reason(lines), field="image.packages")
    debs = installed_debs(listing + ".status", listing + ".packages")
    debs.sort(key=lambda d: d["name"])
    if progress:
        progress(f"debian: {len(debs)} packages, tarball {os.path.getsize(out)} bytes")
    return out, debs


def _stanzas(path: str):
    """deb822 stanzas of a dpkg status or apt Packages file, as dicts of the fields we
    read (continuation lines skipped)."""
    cur: dict[str, str] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line == "\n":
                if cur:
                    yield cur
                cur = {}
            elif line[0] not in " \t":
                k, _, v = line.partition(":")
                if k in ("Package", "Version", "Architecture", "Status", "SHA256"):
                    cur[k] = v.strip()
    if cur:
        yield cur


def installed_debs(status: str, packages: str) -> list[dict]:
    """Every package dpkg installed, with the sha256 of its .deb from apt's lists."""
    sums = {(s.get("Package"), s.get("Version"), s.get("Architecture")): s.get("SHA256", "")
            for s in _stanzas(packages)}
    debs = []
    for s in _stanzas(status):
        if not s.get("Status", "").endswith(" installed"):
            continue
        key = (s.get("Package"), s.get("Version"), s.get("Architecture"))
        debs.append({"name": key[0], "version": key[1], "arch": key[2],
                     "sha256": sums.get(key, "")})
    return debs


def _mm_reason(lines: list[str]) -> str:
    for line in lines:
        if line.startswith("E: ") and ("Unable to locate" in line or "not found" in line
                                       or "Version" in line or "has no installation" in line):
            return line[3:]
    errs = [x[3:] for x in lines if x.startswith("E: ")]
    return errs[0] if errs else (lines[-1] if lines else "no output")


def _watch_downloads(rootpath: str, done: threading.Event, progress) -> None:
    """Report the bytes in the chroot's apt archive directory every few seconds."""
    last = -1
    while not done.wait(3.0):
        try:
            with open(rootpath) as f:
                root = f.read().strip()
            d = os.path.join(root, "var/cache/apt/archives")
            n = sum(e.stat().st_size for e in os.scandir(d) if e.name.endswith((".deb",
                                                                                ".deb.part")))
            n += sum(e.stat().st_size for e in os.scandir(os.path.join(d, "partial")))
        except OSError:
            continue
        if n and n != last:
            progress(f"debian: {n / 1e6:.1f} MB downloaded")
            last = n


def check_drift(lock: dict, debs: list[dict]) -> None:
    want = {d["name"]: d for d in lock["debs"]}
    got = {d["name"]: d for d in debs}
    for name in sorted(set(want) | set(got)):
        w, g = want.get(name), got.get(name)
        if w is None:
            raise ImageError(f"drift: the build installed {name} {g['version']}, which the "
                             "lock does not list; run corral image lock again", field="--lock")
        if g is None:
            raise ImageError(f"drift: the lock lists {name} {w['version']}, which the build "
                             "did not install", field="--lock")
        if (w["version"], w["sha256"]) != (g["version"], g["sha256"]):
            raise ImageError(f"drift: {name} is {g['version']} sha256:{g['sha256'][:16]} from "
                             f"the mirror, the lock says {w['version']} "
                             f"sha256:{w['sha256'][:16]}", field="--lock")


# -- the commands ------------------------------------------------------------------------------
def build_key(desc: Description, debs: list[dict]) -> str:
    """The key of a build: the sha256 of everything that goes into the image: the Debian
    package set (each name, version, architecture and .deb sha256: the lock), the
    description's bytes (suite, packages, env, workdir, [python]), the bytes of each
    [files] source and of the requirements file. The same key gives the same image."""
    import hashlib

    def file_sha(path: str, field: str) -> str:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except FileNotFoundError:
            raise ImageError(f"{path} does not exist", field=field) from None
        return h.hexdigest()

    doc = {"v": 1, "suite": desc.suite, "toml": desc.sha256,
           "debs": sorted((d["name"], d["version"], d["arch"], d["sha256"]) for d in debs),
           "files": {dest: file_sha(src, "files") for dest, src in sorted(desc.files.items())},
           "requirements": file_sha(desc.requirements, "python.requirements")
           if desc.requirements else None}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def cached(store, key: str) -> str | None:
    """The image of the store built with this key, if any (its trees still there)."""
    for meta in store.images():
        if meta.get("build_key") == key:
            return meta["digest"]
    return None


def build(store, desc: Description, *, lock: dict | None = None, name: str | None = None,
          progress=None, index_ca: str | None = None, use_cache: bool = True,
          notice=None) -> str:
    """Build the image; returns its digest. With a lock whose build (build_key) is in the
    store already, that image is returned (and named) without running anything."""
    key = None
    if lock is not None:
        if lock.get("suite") != desc.suite or sorted(lock.get("packages", [])) != sorted(
                desc.packages):
            raise ImageError(f"the lock is for suite {lock.get('suite')} with packages "
                             f"{lock.get('packages')}, not what {desc.path} asks; run corral "
                             "image lock again", field="--lock")
        key = build_key(desc, lock["debs"])
        hit = cached(store, key) if use_cache else None
        if hit:
            if name:
                store.tag(name, hit)
            say = progress or notice   # said even without a terminal
            if say:
                say(f"from cache: {hit} was built from this lock and description; "
                    "not rebuilt (--no-cache rebuilds)")
            return hit
    work, builder = store.new_tree()
    builder.unchecked_pycs = True   # a read-only image: no source check per import
    try:
        pins = None if lock is None else [f"{d['name']}={d['version']}" for d in lock["debs"]]
        tar, debs = debian_base(desc, work, pins, progress)
        if lock is not None:
            check_drift(lock, debs)
        if progress:
            progress("unpacking into the store")
        with open(tar, "rb") as f:
            builder.apply_tar(f, whiteouts=False)
        os.unlink(tar)
        # apt's auto-installed marks: a build that names only the top packages marks their
        # dependencies, a build from a lock (every package named) marks none; the same
        # packages must give the same tree, and a read-only image never autoremoves
        builder.whiteout("var/lib/apt/.wh.extended_states")
        for dest, src in sorted(desc.files.items()):
            try:
                with open(src, "rb") as f:
                    st = os.fstat(f.fileno())
                    builder.add_file(dest.lstrip("/"), 0o755 if st.st_mode & 0o111 else 0o644,
                                     st.st_size, f)
            except FileNotFoundError:
                raise ImageError(f"[files] {dest}: {src} does not exist", field="files") \
                    from None
        key = build_key(desc, debs)   # as the lock written from these debs will give
        pip = bool(desc.requirements or desc.pip_packages)
        meta = {"source": {"kind": "build", "file": desc.path, "suite": desc.suite,
                           "mirror": desc.mirror},
                "env": desc.env, "workdir": desc.workdir,
                "lock": {"suite": desc.suite, "packages": desc.packages, "debs": debs,
                         "pinned": lock is not None}}
        if not pip:
            meta["build_key"] = key
        digest = store.commit(work, builder, meta, None if pip else name)
    except BaseException:
        builder.close()
        from .store import remove_tree

        remove_tree(work)
        raise
    if desc.requirements or desc.pip_packages:
        from .install import install

        if progress:
            progress("python packages: the install phase on the Debian base")
        digest = install(store, digest, requirements=desc.requirements,
                         packages=desc.pip_packages, name=name, index_urls=(
                             [desc.index_url] if desc.index_url else None),
                         require_hashes=bool(desc.requirements), progress=progress,
                         index_ca=index_ca, build_key=key)
    if progress:
        progress(f"done: {digest}")
    return digest


def write_lock(store, desc: Description, out: str, progress=None) -> dict:
    """Resolve the Debian package set (a real mmdebstrap run, the tree discarded) and
    write the lock."""
    work = store.tempdir("lock")
    try:
        _, debs = debian_base(desc, work, None, progress)
    finally:
        from .store import remove_tree

        remove_tree(work)
    return _write_lock_file(out, desc, debs)


def _write_lock_file(out: str, desc: Description, debs: list[dict]) -> dict:
    lock = {"version": 1, "suite": desc.suite, "mirror": desc.mirror,
            "packages": sorted(desc.packages), "debs": debs,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(lock, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, out)
    return lock




