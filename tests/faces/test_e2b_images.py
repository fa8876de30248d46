"""E2B's default templates on corral's catalogue images: `base` is the `python` image and
`code-interpreter-v1` the `datascience` one (matplotlib, ipykernel), with the token's
default policy, through the official SDK against a real `corral serve`. The images are
real mmdebstrap builds (Debian's mirror, pip from PyPI in the install sandbox), kept in
the test cache's store (imagefix.CACHE) and reused by later runs: minutes the first time,
so the slow group.

A matplotlib figure comes back through run_code as a PNG whose signature, IHDR chunk
(size, CRC) and IEND are checked; a template whose image is beyond the token's ceiling is
refused; a templates file maps a name of its own to an image and a policy; the account
"user" and /home/user are there on an image too."""

import base64
import os
import struct
import zlib

import pytest
from conftest import tier_unavailable
from e2bfix import e2b_env, e2b_serve
from imagefix import CACHE, corral_in

e2b = pytest.importorskip("e2b")
pytest.importorskip("e2b_code_interpreter")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(tier_unavailable("namespace") is not None,
                       reason=f"namespace tier: {tier_unavailable('namespace')}"),
]

PLOT = """
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(4, 3), dpi=50)
ax.plot([0, 1, 2, 3], [1, 4, 9, 16])
plt.show()
"""


def _build(state: str, name: str) -> None:
    """The catalogue image `name` in the cache's store: built once (its lock written by
    that build), then found by name."""
    if corral_in(state, "image", "show", name, check=False).returncode == 0:
        return
    lock = os.path.join(CACHE, f"e2b-{name}.lock.json")
    args = ["image", "build", name, "--lock", lock]
    # a host whose PyPI traffic is TLS-intercepted names the bundle that trusts it
    ca = os.environ.get("CORRAL_TEST_INDEX_CA") or os.environ.get("PIP_CERT")
    if ca and os.path.isfile(ca):
        args += ["--index-ca", ca]
    p = corral_in(state, *args, check=False, timeout=2000)
    assert p.returncode == 0, p.stderr[-2000:]


@pytest.fixture(scope="module")
def images():
    if not os.path.exists("/usr/bin/mmdebstrap") or os.geteuid() != 0:
        pytest.skip("needs root and mmdebstrap (scripts/setup.sh installs it)")
    state = os.path.join(CACHE, "state")
    os.makedirs(CACHE, 0o711, exist_ok=True)
    for name in ("python", "datascience"):
        _build(state, name)
    return state


@pytest.fixture(scope="module")
def server(images, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2b-images")
    pinned = tmp / "pinned.toml"
    pinned.write_text('image = "python"\n')
    s = e2b_serve(tmp, {"a": [], "pinned": ["--ceiling", str(pinned)]},
                  '[py-small]\nimage = "python"\nlimits = { memory = "300M" }\n',
                  {"CORRAL_STATE_DIR": images})   # the images' store is the server's
    yield s
    s.stop()


@pytest.fixture
def env(server, monkeypatch):
    return e2b_env(server, monkeypatch)


def _policy(server, token, sid) -> dict:
    with server.http(server.tokens[token]) as c:
        return c.get(f"/sandboxes/{sid}").json()["policy"]


def check_png(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, after checking its signature, its first chunk (IHDR,
    13 bytes, its CRC), and that it ends with IEND."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    n, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and n == 13
    body = data[16:16 + n]
    (crc,) = struct.unpack(">I", data[16 + n:20 + n])
    assert crc == zlib.crc32(kind + body)
    w, h, depth, color, comp, filt, inter = struct.unpack(">IIBBBBB", body)
    assert w > 0 and h > 0 and depth in (1, 2, 4, 8, 16) and comp == 0 and filt == 0
    assert data[-12:-8] == b"\x00\x00\x00\x00" and data[-8:-4] == b"IEND"
    return w, h


def test_base_is_the_python_image(env):
    from e2b import Sandbox

    with Sandbox.create(timeout=120) as sb:
        assert _policy(env, "a", sb.sandbox_id)["image"] == "python"
        r = sb.commands.run("id -u; pwd; stat -c %u /home/user; python3 -c 'import pytest'",
                            user="user")
        assert r.stdout == "1000\n/home/user\n1000\n"
        assert sb.get_info().template_id == "base"


def test_code_interpreter_plots_a_png(env):
    from e2b_code_interpreter import Sandbox

    with Sandbox.create(timeout=300) as sb:
        assert _policy(env, "a", sb.sandbox_id)["image"] == "datascience"
        ex = sb.run_code(PLOT)
        assert ex.error is None, ex.error
        pngs = [r.png for r in ex.results if r.png]
        assert len(pngs) == 1
        w, h = check_png(base64.b64decode(pngs[0]))
        # 4x3 inches at 50 dpi: 200x150, less the margins a notebook's "tight" box trims
        assert 120 <= w <= 200 and 90 <= h <= 150 and w > h, (w, h)
        ex = sb.run_code("import ipykernel, matplotlib; matplotlib.get_backend()")
        assert ex.error is None and ex.text is not None
        # envs through the IPython kernel: this cell's only (silent requests around it)
        n = sb.run_code("1").execution_count
        code = "import os; os.environ.get('CELL_VAR', 'unset')"
        ex = sb.run_code(code, envs={"CELL_VAR": "kernel"})
        assert ex.text == "'kernel'" and ex.execution_count == n + 1
        ex = sb.run_code(code)
        assert ex.text == "'unset'" and ex.execution_count == n + 2


def test_template_beyond_the_ceiling_is_refused(env, monkeypatch):
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    monkeypatch.setenv("E2B_API_KEY", env.tokens["pinned"])
    with pytest.raises(SandboxException, match="image"):
        Sandbox.create(timeout=60)              # datascience: the ceiling pins python
    with Sandbox.create("base", timeout=60) as sb:   # python: within it
        assert _policy(env, "pinned", sb.sandbox_id)["image"] == "python"
    with env.http(env.tokens["pinned"]) as c:
        assert c.get("/sandboxes").json()["sandboxes"] == []


def test_a_template_of_the_servers_file(env):
    from e2b import Sandbox

    with Sandbox.create("py-small", timeout=60) as sb:
        pol = _policy(env, "a", sb.sandbox_id)
        assert pol["image"] == "python" and pol["limits"]["memory"] in ("300M", 300 << 20)
        assert sb.commands.run("echo ok").stdout == "ok\n"

