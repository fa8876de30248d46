"""Rules a token's ceiling gates beyond the original table (docs/service.md, "Ceilings"):
the syscall audit a ceiling turns on cannot be turned off by a request (and a request that
leaves it out keeps it on); an install phase may ask only for packages, and let through
only typosquat-looking names, that the ceiling lists; a token made with --max-lifetime
cannot make a sandbox live longer, at create or by setting its timeout later. For real: `corral serve` under
uvicorn in a subprocess (servefix.Serve), tokens made with `corral token create`; answers
read from POST /explain, which opens no sandbox, and one real namespace sandbox made to
read back the policy it runs under."""

import pytest
from conftest import tier_unavailable
from servefix import Serve
from servefix import api_error as _err


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ceilrules")
    audit = tmp / "audit.toml"
    audit.write_text("[audit]\nsyscalls = true\n")
    install = tmp / "install.toml"
    install.write_text('image = "python"\n[install]\npackages = ["requests==2.32.3", '
                       '"attrs"]\nallow_names = ["reqeusts-mock"]\n')
    s = Serve(tmp)
    s.tokens = {"audit": s.token("audit", "--ceiling", str(audit)),
                "install": s.token("install", "--ceiling", str(install)),
                "plain": s.token("plain"),
                "brief": s.token("brief", "--max-lifetime", "2m")}
    s.start()
    yield s
    s.stop()


def _explain(s, token, policy):
    with s.http(s.tokens[token]) as h:
        return h.post("/explain", json={"policy": policy})


def test_the_syscall_audit_a_ceiling_turns_on_cannot_be_turned_off(server):
    e = _err(_explain(server, "audit", {"audit": {"syscalls": False}}), 403, "ceiling",
             "audit.syscalls")
    assert "syscall" in e["message"]
    for token, policy in (("audit", {}), ("audit", {"audit": {"syscalls": True}}),
                          ("plain", {"audit": {"syscalls": False}}),
                          ("plain", {"audit": {"syscalls": True}})):
        r = _explain(server, token, policy)
        assert r.status_code == 200, (token, policy, r.text)


@pytest.mark.skipif(tier_unavailable("namespace") is not None,
                    reason=f"namespace tier: {tier_unavailable('namespace')}")
def test_a_request_that_leaves_the_audit_out_takes_the_ceilings(server):
    """The sandbox made: its policy as the service shows it back."""
    for token, want in (("audit", True), ("plain", False)):
        with server.http(server.tokens[token]) as h:
            r = h.post("/sandboxes", json={"policy": {}, "timeout": 60})
            assert r.status_code == 201, r.text
            try:
                assert r.json()["policy"]["audit"]["syscalls"] is want, r.json()["policy"]
            finally:
                h.delete(f"/sandboxes/{r.json()['id']}")


@pytest.mark.parametrize("install,field", [
    ({"packages": ["evil-package==1.0"]}, "install.packages"),
    ({"packages": ["requests"]}, "install.packages"),            # not the pinned one
    ({"packages": ["attrs", "requests==2.32.4"]}, "install.packages"),
    ({"packages": ["attrs"], "allow_names": ["reqeusts"]}, "install.allow_names"),
])
def test_an_install_beyond_the_ceilings_packages_is_403(server, install, field):
    _err(_explain(server, "install", {"install": install}), 403, "ceiling", field)


def test_an_install_within_the_ceilings_packages_is_not_refused_by_it(server):
    for install in ({"packages": ["attrs"]},
                    {"packages": ["requests==2.32.3", "attrs"],
                     "allow_names": ["reqeusts-mock"]}):
        r = _explain(server, "install", {"install": install})
        assert r.status_code != 403, r.text


def test_a_timeout_past_the_tokens_max_lifetime_is_403_and_nothing_is_made(server):
    with server.http(server.tokens["brief"]) as h:
        e = _err(h.post("/sandboxes", json={"timeout": 3600}), 403, "ceiling", "timeout")
        assert "120s" in e["message"], e
        assert h.get("/sandboxes").json()["sandboxes"] == []


@pytest.mark.skipif(tier_unavailable("namespace") is not None,
                    reason=f"namespace tier: {tier_unavailable('namespace')}")
def test_setting_a_timeout_cannot_outlive_the_max_lifetime(server):
    """Renewing was the way past any bound: POST .../timeout sets the end from now, as
    often as asked. The bound counts from the sandbox's creation."""
    with server.http(server.tokens["brief"]) as h:
        r = h.post("/sandboxes", json={"timeout": 60})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            _err(h.post(f"/sandboxes/{sid}/timeout", json={"timeout": 7 * 86400}), 403,
                 "ceiling", "timeout")
            _err(h.post(f"/sandboxes/{sid}/timeout", json={"timeout": 121}), 403,
                 "ceiling", "timeout")
            r = h.post(f"/sandboxes/{sid}/timeout", json={"timeout": 90})
            assert r.status_code == 200, r.text
        finally:
            h.delete(f"/sandboxes/{sid}")
    # a token without one renews as before
    with server.http(server.tokens["plain"]) as h:
        sid = h.post("/sandboxes", json={"timeout": 60}).json()["id"]
        try:
            assert h.post(f"/sandboxes/{sid}/timeout", json={"timeout": 3600}).status_code \
                == 200
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_max_lifetime_is_shown_and_checked_when_the_token_is_made(server):
    import subprocess

    from servefix import CORRAL

    out = subprocess.run([CORRAL, "token", "ls", "--state-dir", server.state],
                         capture_output=True, text=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("brief\t"))
    assert "max-lifetime=120s" in line, line
    for bad in ("0", "8d", "soon"):
        p = subprocess.run([CORRAL, "token", "create", "--name", "x", "--max-lifetime", bad,
                            "--state-dir", server.state], capture_output=True, text=True)
        assert p.returncode == 2 and "--max-lifetime" in p.stderr, (bad, p.stderr)


@pytest.mark.skipif(tier_unavailable("namespace") is not None,
                    reason=f"namespace tier: {tier_unavailable('namespace')}")
def test_a_create_that_names_no_timeout_lives_to_the_max_lifetime(server):
    """The bound refuses a timeout asked for (docs/service.md: "a create asking for a
    longer timeout"); a create that asks for none gets the default cut to the bound, as
    an MCP sandbox does, not a 403 for the default's 300 s."""
    import time

    with server.http(server.tokens["brief"]) as h:
        t0 = time.time()
        r = h.post("/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            ends = h.get(f"/sandboxes/{sid}").json()["ends"]
            assert t0 + 100 < ends <= time.time() + 120, (t0, ends)
        finally:
            h.delete(f"/sandboxes/{sid}")
