"""The install phase: real pip in a sandbox on the cached test image, from PyPI-style simple
indexes served on loopback by `python3 -m http.server` over wheels this file writes, through
corral's egress proxy. Supply-chain cases: hashes, sdists, typosquats, dependency confusion,
a .pth file that runs at start-up."""

import base64
import hashlib
import json
import os
import socket
import subprocess
import time
import zipfile

import pytest
from imagefix import corral_in

# real pip installs through the install phase: minutes, so in the slow group (CI runs it)
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def make_wheel(d, name, version, files, requires=()):
    """A pure-Python wheel written by hand (zip + dist-info); returns its path."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: MIT\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = dict(files)
    entries[f"{dist}/METADATA"] = meta
    entries[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n" \
                               "Tag: py3-none-any\n"
    record = []
    for p, data in entries.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(data.encode()).digest()).rstrip(b"=")
        record.append(f"{p},sha256={h.decode()},{len(data)}")
    entries[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    path = os.path.join(d, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for p, data in entries.items():
            z.writestr(p, data)
    return path


def make_sdist(d, name, version, setup_py):
    import io
    import tarfile

    path = os.path.join(d, f"{name}-{version}.tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for p, data in {"setup.py": setup_py, "PKG-INFO": f"Name: {name}\nVersion: {version}\n"
                        }.items():
            ti = tarfile.TarInfo(f"{name}-{version}/{p}")
            ti.size = len(data.encode())
            tf.addfile(ti, io.BytesIO(data.encode()))
    return path


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Index:
    """A simple index (PEP 503) over files, served by python3 -m http.server on loopback;
    its access log says which files were asked for."""

    def __init__(self, root, files):
        self.root = root
        by = {}
        for f in files:
            by.setdefault(os.path.basename(f).split("-")[0].replace("_", "-"), []).append(f)
        for name, fs in by.items():
            d = os.path.join(root, "simple", name)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "index.html"), "w") as out:
                for f in fs:
                    out.write(f'<a href="/files/{os.path.basename(f)}#sha256={sha(f)}">'
                              f'{os.path.basename(f)}</a>\n')
            os.makedirs(os.path.join(root, "files"), exist_ok=True)
            for f in fs:
                os.replace(f, os.path.join(root, "files", os.path.basename(f)))
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.log = open(os.path.join(root, "access.log"), "w")
        self.proc = subprocess.Popen(["/usr/bin/python3", "-m", "http.server", "--bind",
                                      "127.0.0.1", "--directory", root, str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/simple"

    def requests(self):
        self.log.flush()
        with open(os.path.join(self.root, "access.log")) as f:
            return f.read()

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def state(tmp_path, mini_image):
    """A fresh store holding the cached test image (exported once per session)."""
    src_state, _, digest = mini_image
    tar = os.path.join(os.path.dirname(src_state), f"{digest[7:19]}.tar")
    if not os.path.exists(tar):
        corral_in(src_state, "image", "export", digest, tar + ".tmp")
        os.replace(tar + ".tmp", tar)
    # under the cache (0711), not pytest's 0700 tmp: the sandbox's uid must reach the trees
    import tempfile

    from corral.images.store import remove_tree

    st = tempfile.mkdtemp(prefix="store-", dir=os.path.dirname(src_state))
    os.chmod(st, 0o711)
    corral_in(st, "image", "import", tar, "--name", "base")
    yield st
    remove_tree(st)
    from corral.backends.host.imageroot import sweep_shared

    sweep_shared()   # the shared overlays of this store's layered images: detached


@pytest.fixture
def index(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    files = [
        make_wheel(str(wheels), "tinyb", "1.0", {"tinyb/__init__.py": "B = 'b-here'\n"}),
        make_wheel(str(wheels), "tinya", "2.0", {"tinya/__init__.py":
                                                 "from tinyb import B\nA = 'a+' + B\n"},
                   requires=["tinyb"]),
        make_sdist(str(wheels), "hostile", "1.0",
                   "import os; open(os.environ.get('MARKER', '/workspace/SETUP_PY_RAN'), 'w')"
                   ".write('x')\n"
                   "from setuptools import setup; setup(name='hostile', version='1.0')\n"),
        make_wheel(str(wheels), "phonehome", "1.0", {
            "phonehome.pth": "import phonehome_boot\n",
            "phonehome_boot.py": (
                "import os, socket\n"
                "try:\n    socket.create_connection(('1.1.1.1', 80), 2); r = 'NET-OPEN'\n"
                "except OSError as e:\n    r = 'net-refused'\n"
                "try:\n    os.listdir('/root'); h = 'HOME-READ'\n"
                "except OSError:\n    h = 'home-hidden'\n"
                "os.environ['PHONEHOME'] = r + ',' + h\n")}),
    ]
    ix = Index(str(tmp_path / "index"), files)
    yield ix
    ix.close()


def install(state, *args, check=False):
    return corral_in(state, "install", "--image", "base", *args, check=check)


def test_install_makes_an_image_with_an_sbom_through_the_proxy(state, index, tmp_path):
    p = install(state, "--index-url", index.url, "--name", "with-tiny", "tinya")
    assert p.returncode == 0, p.stderr
    digest = p.stdout.strip()
    run = corral_in(state, "run", "--image", "with-tiny", "--", "python3", "-c",
                    "import tinya; print(tinya.A)")
    assert run.stdout == "a+b-here\n"
    base = corral_in(state, "run", "--image", "base", "--", "python3", "-c", "import tinya",
                     check=False)
    assert base.returncode != 0 and "No module named 'tinya'" in base.stderr
    meta = json.loads(corral_in(state, "image", "show", "with-tiny", "--json").stdout)
    assert meta["digest"] == digest and meta["base"].startswith("sha256:")
    comps = {c["name"]: c for c in meta["sbom"]["components"]}
    assert sorted(comps) == ["tinya", "tinyb"] and meta["sbom"]["bomFormat"] == "CycloneDX"
    a = comps["tinya"]
    assert a["version"] == "2.0" and a["purl"] == "pkg:pypi/tinya@2.0"
    assert a["hashes"][0]["content"] == sha(os.path.join(index.root, "files",
                                                         "tinya-2.0-py3-none-any.whl"))
    assert a["externalReferences"][0]["url"].endswith("/files/tinya-2.0-py3-none-any.whl")
    assert a["licenses"] == [{"license": {"name": "MIT"}}]
    assert "tinyb 1.0" in corral_in(state, "image", "show", "with-tiny").stdout
    assert "GET /files/tinyb-1.0-py3-none-any.whl" in index.requests()


def test_hash_mismatch_refused_and_nothing_stored(state, index, tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("tinyb==1.0 --hash=sha256:" + "0" * 64 + "\n")
    p = install(state, "--index-url", index.url, "-r", str(req))
    assert p.returncode == 4, p.stderr
    assert "pip failed in the install sandbox" in p.stderr and "HASH" in p.stderr.upper()
    assert len(p.stderr.strip().splitlines()) == 1
    assert len(corral_in(state, "image", "ls").stdout.splitlines()) == 1


def test_sdist_with_a_hostile_setup_py_is_refused_by_wheels_only(state, index, tmp_path):
    p = install(state, "--index-url", index.url, "hostile")
    assert p.returncode == 4 and "hostile" in p.stderr, p.stderr
    assert "GET /files/hostile" not in index.requests()   # never even fetched
    # the control: pip on the host, sdists allowed (the host's setuptools), same index:
    # it fetches the sdist and setup.py runs
    marker = tmp_path / "setup-ran"
    c = subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "--no-input",
                        "--disable-pip-version-check", "--no-cache-dir", "--no-deps",
                        "--no-build-isolation", "--index-url", index.url, "--target",
                        str(tmp_path / "site"), "hostile"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                            "PIP_CONFIG_FILE": os.devnull, "MARKER": str(marker)}, timeout=300)
    assert marker.exists(), c.stderr[-1000:]
    assert "GET /files/hostile-1.0.tar.gz" in index.requests()


def test_typosquat_refused_unless_allowed(state, index):
    p = install(state, "--index-url", index.url, "reqests")
    assert p.returncode == 4
    assert ("'reqests' is close to the popular package 'requests'" in p.stderr
            and "--allow-name reqests" in p.stderr)
    assert "GET" not in index.requests()   # refused before any sandbox ran
    p = install(state, "--index-url", index.url, "--allow-name", "reqests", "reqests")
    assert p.returncode == 4 and "pip failed" in p.stderr   # the check let it through


def test_dependency_confusion_an_index_not_named_is_unreachable(state, index, tmp_path):
    other_dir = tmp_path / "other-wheels"
    other_dir.mkdir()
    other = Index(str(tmp_path / "other"), [make_wheel(str(other_dir), "internal-tool", "9.9",
                                                       {"internal_tool.py": "X = 1\n"})])
    try:
        # pip is told about the second index only through the package's own config (an
        # env var a hostile requirement file cannot set): the sandbox cannot reach it
        p = install(state, "--index-url", index.url, "internal-tool")
        assert p.returncode == 4 and "internal-tool" in p.stderr
        assert "GET" not in other.requests()
        # and direct URLs to it are refused by the proxy too
        p = install(state, "--index-url", index.url,
                    f"internal-tool @ {other.url[:-7]}/files/internal_tool-9.9-py3-none-any.whl")
        assert p.returncode == 4
        assert "GET" not in other.requests()
    finally:
        other.close()


def test_pth_file_runs_at_start_up_but_the_run_contains_it(state, index):
    p = install(state, "--index-url", index.url, "--name", "ph", "phonehome")
    assert p.returncode == 0, p.stderr
    run = corral_in(state, "run", "--image", "ph", "--", "python3", "-c",
                    "import os; print(os.environ.get('PHONEHOME'))")
    assert run.stdout == "net-refused,home-hidden\n", run.stdout


def _policy(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(body)
    return str(p)


def test_install_section_of_a_policy_installs_once_and_runs_on_the_result(state, index,
                                                                          tmp_path):
    pol = _policy(tmp_path, "p.toml", f'image = "base"\n[install]\npackages = ["tinya"]\n'
                                      f'index_urls = ["{index.url}"]\n')
    code = "import tinya; print(tinya.A)"
    ex = json.loads(corral_in(state, "explain", "--policy", pol, "--json").stdout)
    assert ex["root"]["install"]["installed"] is None   # explain never installs
    assert "not installed yet" in ex["root"]["install"]["note"]
    assert "GET" not in index.requests()
    run = corral_in(state, "run", "--policy", pol, "--", "python3", "-c", code)
    assert run.stdout == "a+b-here\n", run.stderr
    assert index.requests().count("GET /files/tinya-2.0") == 1
    images = {m["digest"]: m for m in json.loads(corral_in(state, "image", "ls", "--json").stdout)}
    (inst,) = [m for m in images.values() if any(n.startswith("install-") for n in m["names"])]
    assert inst["source"]["install_key"].startswith(inst["names"][0][len("install-"):])
    assert [c["name"] for c in inst["sbom"]["components"]] == ["tinya", "tinyb"]
    # the second run reuses the image: no request to the index, no new image
    again = corral_in(state, "run", "--policy", pol, "--", "python3", "-c", code)
    assert again.stdout == "a+b-here\n"
    assert index.requests().count("GET /files/tinya-2.0") == 1
    assert len(json.loads(corral_in(state, "image", "ls", "--json").stdout)) == len(images)
    ex = json.loads(corral_in(state, "explain", "--policy", pol, "--json").stdout)
    assert ex["root"]["digest"] == inst["digest"] == ex["root"]["install"]["installed"]
    # the run itself has no network: the index that served the install is out of reach
    reach = corral_in(state, "run", "--policy", pol, "--", "python3", "-c",
                      f"import urllib.request; urllib.request.urlopen('{index.url}/', "
                      "timeout=5)", check=False)
    assert reach.returncode != 0 and "GET /simple/ " not in index.requests()
    # other requirements: another key, another install
    pol2 = _policy(tmp_path, "p2.toml", f'image = "base"\n[install]\npackages = ["tinyb"]\n'
                                        f'index_urls = ["{index.url}"]\n')
    corral_in(state, "run", "--policy", pol2, "--", "python3", "-c", "import tinyb")
    assert len(json.loads(corral_in(state, "image", "ls", "--json").stdout)) == len(images) + 1


def test_install_section_refusals(state, index, tmp_path):
    host = _policy(tmp_path, "h.toml", '[install]\npackages = ["tinya"]\n')
    p = corral_in(state, "run", "--policy", host, "--", "true", check=False)
    assert p.returncode == 2 and "[install] needs image" in p.stderr, p.stderr
    opt = _policy(tmp_path, "o.toml", 'image = "base"\n[install]\npackages = '
                                      '["--extra-index-url=http://127.0.0.1:1/simple"]\n')
    p = corral_in(state, "run", "--policy", opt, "--", "true", check=False)
    assert p.returncode == 2 and "install.packages[0]" in p.stderr, p.stderr
    squat = _policy(tmp_path, "s.toml", f'image = "base"\n[install]\npackages = ["reqests"]\n'
                                        f'index_urls = ["{index.url}"]\n')
    p = corral_in(state, "run", "--policy", squat, "--", "true", check=False)
    assert p.returncode == 4 and "close to the popular package 'requests'" in p.stderr
    assert "GET" not in index.requests()


def test_an_index_named_by_a_host_name_on_a_private_address_is_reached(state, index,
                                                                       tmp_path):
    """An internal index (or a TLS-intercepting mirror) whose name resolves to a private
    address, with a certificate of its own CA: the proxy's SSRF guard would refuse the
    address; install opens that one address for the index names only, and --index-ca
    makes pip check the index's TLS against the given bundle."""
    import functools
    import http.server
    import ssl
    import threading

    from netfix import TLSServer, free_port, make_cert, start_dnsmasq

    cert, key = make_cert(tmp_path, "index.test")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    got = []

    class Files(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *a):
            got.append(self.requestline)

    srv = TLSServer(("127.0.0.1", free_port()),
                    functools.partial(Files, directory=index.root), ctx)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    proc, port = start_dnsmasq({"index.test": "127.0.0.1"}, tmp_path / "dns.log")
    try:
        url = f"https://index.test:{srv.server_address[1]}/simple"
        args = ["--index-url", url, "--nameserver", f"127.0.0.1:{port}", "tinyb"]
        p = install(state, *args)   # pip's own CA store does not know the index's CA
        assert p.returncode == 4 and "tinyb" in p.stderr, p.stderr
        p = install(state, "--index-ca", str(cert), "--name", "by-name", *args)
        assert p.returncode == 0, p.stderr
        assert any("GET /files/tinyb-1.0-py3-none-any.whl" in r for r in got), got
    finally:
        proc.terminate()
        proc.wait(5)
        srv.shutdown()
        srv.server_close()


def test_the_same_wheels_give_the_same_image(state, index):
    """Two installs of the same wheels on the same base: the same digest (pip's .pyc files
    carry no timestamp: SOURCE_DATE_EPOCH makes them hash-checked)."""
    a = install(state, "--index-url", index.url, "--name", "one", "tinya")
    b = install(state, "--index-url", index.url, "--name", "two", "tinya")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.strip() == b.stdout.strip()


def test_an_install_is_its_base_plus_one_layer_of_what_pip_wrote(state, index, tmp_path):
    """The installed image is the base and one layer holding only pip's files (the base is
    not copied); it runs on namespace and gvisor with the package there; gc keeps the base
    while the image is on it; export, rm, import gives the same digest."""
    from conftest import tier_unavailable

    base = json.loads(corral_in(state, "image", "show", "base", "--json").stdout)["digest"]
    p = install(state, "--index-url", index.url, "--name", "lay", "tinya")
    assert p.returncode == 0, p.stderr
    digest = p.stdout.strip()
    meta = json.loads(corral_in(state, "image", "show", "lay", "--json").stdout)
    assert meta["base"] == meta["root"] == base and len(meta["layers"]) == 1
    want = hashlib.sha256(b"corral layered image v1\n" + f"base {base}\nlayer "
                          f"{meta['layers'][0]}\n".encode()).hexdigest()
    assert digest == "sha256:" + want
    layer = os.path.join(state, "images", "layers", meta["layers"][0][7:])
    files = [os.path.relpath(os.path.join(d, f), layer) for d, _, fs in os.walk(layer)
             for f in fs]
    assert any(f.endswith("tinya/__init__.py") for f in files), files
    assert all(f.startswith("usr/local/") for f in files), files   # nothing of the base
    assert len(files) < 40 and not os.path.exists(os.path.join(state, "images", "trees",
                                                               digest[7:]))
    pycs = [f for f in files if f.endswith(".pyc")]
    assert pycs
    for f in pycs:   # pip's checked hash-based .pyc files, unchecked in the image
        with open(os.path.join(layer, f), "rb") as fo:
            assert fo.read(8)[4] == 1, f
    code = ("import tinya, sys; print(tinya.A); "
            "print(open('/etc/os-release').readline().strip())")
    for tier in ("namespace", "gvisor"):
        why = tier_unavailable(tier)
        if why:
            pytest.skip(why)
        run = corral_in(state, "run", "--isolation", tier, "--image", "lay", "--", "python3",
                        "-c", code)
        assert run.stdout == 'a+b-here\nPRETTY_NAME="Debian GNU/Linux 13 (trixie)"\n', tier
        ro = corral_in(state, "run", "--isolation", tier, "--image", "lay", "--", "sh", "-c",
                       "touch /usr/local/planted 2>/dev/null && echo WROTE || echo ro")
        assert ro.stdout == "ro\n", tier
    # the base stays while an image is built on it, named or not
    assert corral_in(state, "image", "rm", "base").stdout.splitlines()[1] == (
        f"kept {base}: lay is built on it")
    assert base not in corral_in(state, "image", "gc").stdout
    assert corral_in(state, "run", "--image", "lay", "--", "python3", "-c",
                     "import tinya").returncode == 0
    # export (the base and the layer, each an OCI layer), rm, gc, import: the same digest
    out = str(tmp_path / "lay.tar")
    corral_in(state, "image", "export", "lay", out)
    corral_in(state, "image", "rm", "lay")
    gone = corral_in(state, "image", "gc").stdout
    assert base in gone and corral_in(state, "image", "ls").stdout == ""
    again = corral_in(state, "image", "import", out, "--name", "back").stdout.strip()
    assert again == digest
    run = corral_in(state, "run", "--image", "back", "--", "python3", "-c", code)
    assert run.stdout.startswith("a+b-here\n")
    # an install on a layered image: one more layer, both seen
    p = corral_in(state, "install", "--image", "back", "--index-url", index.url, "--name",
                  "two", "phonehome")
    meta2 = json.loads(corral_in(state, "image", "show", "two", "--json").stdout)
    assert meta2["base"] == digest and meta2["layers"][:1] == meta["layers"]
    assert len(meta2["layers"]) == 2 and meta2["root"] == base
    run = corral_in(state, "run", "--image", "two", "--", "python3", "-c",
                    "import os, tinya; print(tinya.A, os.environ.get('PHONEHOME'))")
    assert run.stdout == "a+b-here net-refused,home-hidden\n", run.stdout
