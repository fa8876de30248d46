"""The install phase: pip in a sandbox on the base image, its output as one new layer.

    corral install --image BASE [--name NEW] [--index-url URL]... (-r FILE | PACKAGE...)

1. every requested name is checked for typosquats (typosquat.py) before anything runs;
2. a namespace sandbox on BASE (read-only root) runs `pip install --root /workspace/layer
   --only-binary :all: [--require-hashes] --report ...`: its network is corral's egress
   proxy allowing only the index hosts (pypi.org and files.pythonhosted.org, or those of
   the --index-url given), no secrets, no host variables, an empty output directory of
   corral's own as the only writable place besides scratch, and a timeout;
3. what pip wrote (`--root`: a directory of its own, nothing of the base) is copied, as
   hostile input (TreeBuilder.apply_dir: no link followed, no device node), into a new
   layer; the new image is BASE plus that layer (store.commit_layer: the base is not
   copied), with an SBOM (CycloneDX JSON) built from pip's report in its metadata.

Wheels only by default: no setup.py runs (--allow-sdist lifts it, still in the sandbox).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse

from ..errors import ImageError, UsageError

PYPI = "https://pypi.org/simple"
PYPI_HOSTS = ("pypi.org", "files.pythonhosted.org")
NPM_HOSTS = ("registry.npmjs.org",)
REPORT_MAX = 16 << 20
_REQ_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_names(lines) -> list[str]:
    names = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or line.endswith("\\") and not _REQ_NAME.match(line):
            continue
        m = _REQ_NAME.match(line)
        if m:
            names.append(m.group(1))
    return names


def _index_rules(urls: list[str]) -> tuple[list[str], list[str]]:
    """(network.allow rules, network.allow_private CIDRs) for the index URLs."""
    import ipaddress

    allow, private = [], []
    for url in urls:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ImageError(f"--index-url {url!r} is not an http(s) URL", field="--index-url")
        port = u.port or (443 if u.scheme == "https" else 80)
        allow.append(f"{u.hostname}:{port}")
        try:
            ip = ipaddress.ip_address(u.hostname)
            if not ip.is_global:
                private.append(f"{ip}/{ip.max_prefixlen}")
        except ValueError:
            pass
    return allow, private


def index_private_addresses(hosts, nameservers=()) -> list[tuple[str, str]]:
    """(host, CIDR/32 or /128) for each non-global address an index host name resolves to,
    asked of the resolvers the proxy will ask (nameservers, else the host's). A name that
    does not resolve is left to pip's own error."""
    import ipaddress

    names = []
    for host in dict.fromkeys(hosts):
        try:
            ipaddress.ip_address(host)   # a literal: _index_rules has it
        except ValueError:
            names.append(host)
    if not names:   # nothing to resolve: dnspython is not even imported
        return []
    import dns.exception
    import dns.resolver

    if nameservers:
        r = dns.resolver.Resolver(configure=False)
        r.nameservers, r.port = [], 53
        import dns.nameserver

        for ns in nameservers:
            ip, _, port = ns.rpartition(":") if ns.count(":") == 1 else (ns, "", "")
            r.nameservers.append(dns.nameserver.Do53Nameserver(ip or ns, int(port or 53)))
    else:
        r = dns.resolver.Resolver()
    r.lifetime = 5.0
    out = []
    for host in names:
        for rtype in ("A", "AAAA"):
            try:
                answer = r.resolve(host, rtype)
            except (dns.exception.DNSException, OSError):
                continue
            for rr in answer:
                ip = ipaddress.ip_address(rr.address)
                if not ip.is_global:
                    out.append((host, f"{ip}/{ip.max_prefixlen}"))
    return out


def install(store, base: str, *, requirements: str | None = None, packages=(),
            name: str | None = None, index_urls: list[str] | None = None,
            require_hashes: bool | None = None, allow_names=(), allow_sdist: bool = False,
            timeout: float = 900.0, nameservers=(), progress=None,
            key: str | None = None, index_ca: str | None = None,
            build_key: str | None = None) -> str:
    """Install into a new image on `base` (a name or digest): the base plus one layer;
    returns its digest. `key` (policy_install.py) is recorded in the image's source,
    `build_key` (build.py's cache) in its metadata."""
    from . import typosquat
    from .store import check_name, remove_tree

    base_digest = store.resolve(base, field="--image")
    if name:
        check_name(name)
    req_text = ""
    if requirements:
        try:
            with open(requirements) as f:
                req_text = f.read(1 << 20)
        except OSError as e:
            raise UsageError(f"cannot read {requirements!r}: {e.strerror}", field="-r") from None
    names = requirement_names(req_text.splitlines()) + list(packages)
    if not names:
        raise UsageError("nothing to install: give -r FILE or PACKAGE...", field="PACKAGE")
    typosquat.check(names, allow_names)
    if require_hashes is None:
        require_hashes = "--hash=" in req_text
    urls = index_urls or [PYPI]
    allow, private = _index_rules(urls)
    if urls == [PYPI]:
        allow = [f"{h}:443" for h in PYPI_HOSTS]
    for host, addr in index_private_addresses([a.rpartition(":")[0] for a in allow],
                                              nameservers):
        # an index on a private address (a mirror, an internal index): the proxy's SSRF
        # guard would refuse it; that one address is opened, for the index names only
        private.append(addr)
        if progress:
            progress(f"install: index host {host} is at {addr}, not a global address; the "
                     "proxy may reach it for the index hosts only")
    out = store.tempdir("install")
    os.chmod(out, 0o755)
    layer = os.path.join(out, "out")
    os.mkdir(layer, 0o755)
    try:
        pip = ["python3", "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
               "--no-cache-dir", "--break-system-packages", "--root", "/workspace/layer",
               "--no-warn-script-location", "--report", "/workspace/report.json",
               "--index-url", urls[0]]
        for extra in urls[1:]:
            pip += ["--extra-index-url", extra]
        if not allow_sdist:
            pip += ["--only-binary", ":all:"]
        if require_hashes:
            pip.append("--require-hashes")
        if index_ca:   # the indexes' TLS is checked against this file instead of pip's own
            _copy_bounded(index_ca, os.path.join(layer, "index-ca.pem"), "--index-ca")
            pip += ["--cert", "/workspace/index-ca.pem"]
        script = "mkdir -p /workspace/layer && "
        if req_text:
            script += "cat > /scratch/requirements.txt && "
            pip += ["-r", "/scratch/requirements.txt"]
        pip += list(packages)
        script += "exec " + " ".join(_q(a) for a in pip)
        network: dict = {"mode": "allow", "allow": allow}
        if private:
            network["allow_private"] = private
        if nameservers:
            network["nameservers"] = list(nameservers)
        policy = {"isolation": "namespace", "image": base_digest, "network": network,
                  "filesystem": {"workspace": {"path": layer, "mode": "rw"}},
                  # the proxy takes every request: nothing on the sandbox's loopback
                  "env": {"set": {"NO_PROXY": "", "no_proxy": "", "PIP_NO_COLOR": "1",
                                  # .pyc files checked by hash, not by a timestamp in
                                  # their header: the same wheels give the same layer
                                  "SOURCE_DATE_EPOCH": "1700000000"}},
                  "limits": {"timeout": timeout, "cpu_time": timeout, "memory": "2G",
                             "scratch": "2G", "file_size": "1G", "output": "1M",
                             "open_files": 4096}}
        if progress:
            progress(f"install: pip in a sandbox on {base_digest[:19]}, network: "
                     f"{', '.join(allow)} only")
        from ..runtime.sandbox import Sandbox

        with Sandbox(policy) as sb:
            r = sb.exec(["sh", "-c", script], stdin=req_text.encode() if req_text else None)
        if r.exit_code != 0:
            raise ImageError("pip failed in the install sandbox: " + _last_error(r),
                             field="PACKAGE")
        sbom = _sbom(os.path.join(layer, "report.json"), urls)
        if progress:
            progress(f"install: {len(sbom['components'])} packages; committing the layer")
        # the layer is what pip wrote, copied as hostile input into a tree of corral's own;
        # the base is not copied: the image is the base and this layer (store.py)
        work, builder = store.new_layer()
        builder.unchecked_pycs = True   # pip's .pyc files: no source check per import
        try:
            builder.apply_dir(os.path.join(layer, "layer"))
            bmeta = store.info(base_digest)
            source = {"kind": "install", "index_urls": urls, "requested": names}
            if key:
                source["install_key"] = key
            meta = {"source": source, "env": bmeta.get("env") or [],
                    "workdir": bmeta.get("workdir") or "", "lock": bmeta.get("lock"),
                    "sbom": sbom}
            if build_key:
                meta["build_key"] = build_key
            return store.commit_layer(work, builder, base_digest, meta, name)
        except BaseException:
            builder.close()
            remove_tree(work)
            raise
    finally:
        remove_tree(out)


def _copy_bounded(src: str, dest: str, field: str, limit: int = 4 << 20) -> None:
    try:
        with open(src, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UsageError(f"cannot read {src!r}: {e.strerror}", field=field) from None
    if len(data) > limit or b"-----BEGIN CERTIFICATE-----" not in data:
        raise UsageError(f"{src!r} is not a PEM CA bundle (at most {limit} bytes)", field=field)
    with open(dest, "wb") as f:
        f.write(data)


def _duration(text: str) -> float:
    from ..policy.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise UsageError(f"--timeout {text!r}: {e}", field="--timeout") from None


def _q(a: str) -> str:
    import shlex

    return shlex.quote(a)


def _last_error(r) -> str:
    """The most telling line of pip's stderr (sandbox output: neutralised and bounded)."""
    text = (r.stderr or b"").decode("utf-8", "replace") if isinstance(r.stderr, bytes) \
        else str(r.stderr or "")
    if r.verdict in ("timeout", "oom", "killed"):
        return f"the run ended with verdict {r.verdict}"
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    pick = next((x for x in lines if x.startswith("ERROR:")), lines[-1] if lines else
                f"exit status {r.exit_code}")
    pick = "".join(c if c.isprintable() else "?" for c in pick)
    return pick[:300]


def _sbom(report_path: str, urls: list[str]) -> dict:
    """CycloneDX 1.5 JSON (the subset corral writes) from pip's installation report."""
    try:
        with open(report_path, "rb") as f:
            report = json.loads(f.read(REPORT_MAX))
    except (OSError, ValueError):
        raise ImageError("pip wrote no readable installation report", field="PACKAGE") \
            from None
    comps = []
    for item in report.get("install") or []:
        if not isinstance(item, dict):
            continue
        md = item.get("metadata") or {}
        dl = item.get("download_info") or {}
        name, version = str(md.get("name", "")), str(md.get("version", ""))
        h = ((dl.get("archive_info") or {}).get("hashes") or {}).get("sha256") or ""
        if not h:
            h = ((dl.get("archive_info") or {}).get("hash") or "").partition("=")[2]
        lic = md.get("license_expression") or md.get("license") or ""
        if not lic:
            lic = next((c.split("::")[-1].strip() for c in md.get("classifier") or []
                        if str(c).startswith("License ::")), "")
        comp = {"type": "library", "name": name, "version": version,
                "purl": f"pkg:pypi/{name.lower()}@{version}",
                "hashes": [{"alg": "SHA-256", "content": str(h)}],
                "licenses": [{"license": {"name": str(lic)[:200]}}] if lic else [],
                "externalReferences": [{"type": "distribution", "url": str(dl.get("url", ""))}]}
        comps.append(comp)
    comps.sort(key=lambda c: c["name"].lower())
    return {"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
            "metadata": {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "tools": [{"name": "corral install"}]},
            "components": comps}


