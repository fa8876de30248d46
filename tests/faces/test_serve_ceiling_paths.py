"""A token's ceiling is checked before the policy loader looks at the host: a request that
names a host path (a workspace, a bind, an upstream CA, a requirements file) outside what
its ceiling grants is refused with the same 403 whether the path exists, is a file, a
directory or a system tree; the loader's own answers (does not exist, not a directory, ...)
would tell a token holder about the host. For real: `corral serve` under uvicorn in a
subprocess (servefix.Serve), tokens made with `corral token create`; every request here is
refused before a sandbox is opened, so none is."""

import os
import re

import pytest
from servefix import Serve
from servefix import api_error as _err


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ceilpaths")
    ws, ro, outside = tmp / "ws", tmp / "ro", tmp / "outside"
    for d in (ws, ro, outside):
        d.mkdir()
    (outside / "present").write_text("x")
    (outside / "ca.pem").write_text("not a CA, but a file")
    # a link inside the granted workspace that leads out of it (a sandbox with the
    # workspace rw can make one)
    os.symlink(str(outside), str(ws / "out"))
    fs = tmp / "fs.toml"
    fs.write_text(f'[filesystem]\nworkspace = {{ path = "{ws}", mode = "rw" }}\n'
                  f'ro_binds = ["{ro}"]\n'
                  '[network]\nmode = "allow"\nallow = ["*.example.com"]\n')
    s = Serve(tmp)
    s.tokens = {"plain": s.token("plain"), "fs": s.token("fs", "--ceiling", str(fs))}
    s.paths = {"ws": str(ws), "ro": str(ro), "outside": str(outside)}
    s.start()
    yield s
    s.stop()


def _probes(s) -> list[str]:
    """Host paths of every kind: missing, a file, a directory, a system tree, below a
    file, one only root may look into."""
    out = s.paths["outside"]
    return ["/nonexistent-corral-probe/x", "/etc/hostname", out, f"{out}/present",
            f"{out}/absent", f"{out}/present/below", "/usr", "/root/.ssh/id_ed25519", "/"]


def _same(answers: list[tuple[str, object]]) -> None:
    """Every answer the same status, kind, field and message once the path it names is
    taken out (where it stands alone, not inside another path): nothing in it depends on
    the host."""
    seen = set()
    for path, r in answers:
        e = r.json().get("error", {})
        seen.add((r.status_code, e.get("kind"), e.get("field"),
                  re.sub(rf"(?<![\w/.-]){re.escape(path)}(?![\w/.-])", "PATH",
                         e.get("message", ""))))
    assert len(seen) == 1, sorted(seen)


REQUESTS = {
    "filesystem.workspace": lambda p: {"filesystem": {"workspace": {"path": p}}},
    "filesystem.ro_binds": lambda p: {"filesystem": {"ro_binds": [p]}},
    "network.upstream_ca": lambda p: {"network": {"mode": "allow", "upstream_ca": p}},
    "install.requirements": lambda p: {"image": "python", "install": {"requirements": p}},
}


@pytest.mark.parametrize("route", ["/sandboxes", "/explain"])
@pytest.mark.parametrize("field", sorted(REQUESTS))
def test_a_host_path_beyond_the_default_ceiling_is_one_403_whatever_is_there(
        server, field, route):
    with server.http(server.tokens["plain"]) as h:
        answers = [(p, h.post(route, json={"policy": REQUESTS[field](p)}))
                   for p in _probes(server)]
        for _, r in answers:
            _err(r, 403, "ceiling")
        _same(answers)
        assert h.get("/sandboxes").json()["sandboxes"] == []
#: the rule a path outside a granted one is refused by
OUTSIDE = {"filesystem.workspace": "filesystem.workspace.path",
           "filesystem.ro_binds": "filesystem.ro_binds",
           "network.upstream_ca": "network.upstream_ca",
           "install.requirements": "install.requirements"}


@pytest.mark.parametrize("field", sorted(REQUESTS))
def test_a_host_path_outside_a_granted_one_is_one_403_whatever_is_there(server, field):
    with server.http(server.tokens["fs"]) as h:
        answers = [(p, h.post("/explain", json={"policy": REQUESTS[field](p)}))
                   for p in _probes(server)]
        for _, r in answers:
            _err(r, 403, "ceiling", OUTSIDE[field])
        _same(answers)


def test_a_link_below_the_granted_workspace_is_not_followed_to_probe_the_host(server):
    """ws/out -> outside: ws/out/present exists on the host, ws/out/absent does not; the
    answer names the link and is the same for both."""
    ws = server.paths["ws"]
    with server.http(server.tokens["fs"]) as h:
        for field, make in (("filesystem.workspace.path", lambda p: {"path": p}),):
            answers = []
            for name in ("present", "absent", "present/below"):
                p = f"{ws}/out/{name}"
                r = h.post("/explain", json={"policy": {"filesystem": {"workspace": make(p)}}})
                e = _err(r, 400, "policy", field)
                assert f"{ws}/out" in e["message"] and "link" in e["message"], e
                answers.append((p, r))
            _same(answers)


def test_within_the_ceiling_the_loaders_answers_stand(server):
    """Below the granted workspace the loader still says what is wrong (the token holder
    may see that tree), and the granted paths themselves are accepted."""
    ws, ro = server.paths["ws"], server.paths["ro"]
    with server.http(server.tokens["fs"]) as h:
        e = _err(h.post("/explain", json={"policy": {"filesystem": {
            "workspace": {"path": f"{ws}/missing"}}}}), 400, "policy",
            "filesystem.workspace.path")
        assert "does not exist" in e["message"]
        r = h.post("/explain", json={"policy": {"filesystem": {
            "workspace": {"path": ws, "mode": "ro"}, "ro_binds": [ro]}}})
        assert r.status_code == 200, r.text
