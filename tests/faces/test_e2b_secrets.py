"""A template of the E2B face that grants a server-side secret by name, through the
official `e2b` SDK against `corral serve` under uvicorn: the server config's [secrets]
holds the source, the token's ceiling says whether it may be granted, the template names
the secret and its hosts. A real HTTPS echo server behind the grant (netfix's world) gets
the value; the sandbox sees a placeholder; a token whose ceiling does not grant it is
refused (403 naming secrets.NAME); a template with a source of its own stops the start."""

import pytest
from conftest import tier_unavailable
from netfix import GRANT_PRIV, TOKEN

e2b = pytest.importorskip("e2b")


def _network(world) -> str:
    return (f'mode = "allow"\nallow = ["granted.test"]\nallow_private = ["{GRANT_PRIV}"]\n'
            f'nameservers = ["127.0.0.1:{world["dns"]}"]\n'
            f'upstream_ca = "{world["test_ca"]}"\n')


def test_a_template_grants_a_server_secret_within_the_ceiling(tmp_path, world,
                                                              monkeypatch):
    from e2bfix import e2b_env, e2b_serve

    net = _network(world)
    probe = {"network": {"mode": "allow", "allow": ["granted.test"],
                         "allow_private": [GRANT_PRIV],
                         "nameservers": [f"127.0.0.1:{world['dns']}"]}}
    if tier_unavailable("namespace", probe):
        pytest.skip(tier_unavailable("namespace", probe))
    value_file = tmp_path / "gh.token"
    value_file.write_text(TOKEN)
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'[secrets]\nGITHUB_TOKEN = "file:{value_file}"\n')
    grants = tmp_path / "grants.toml"      # names the secret and its hosts, no source
    grants.write_text(f"[network]\n{net}[secrets.GITHUB_TOKEN]\nhosts = [\"granted.test\"]\n")
    bare = tmp_path / "bare.toml"          # the same network, no secret
    bare.write_text(f"[network]\n{net}")
    templates = (f"[base]\n\n[with-gh]\n[with-gh.network]\n{net}"
                 '[with-gh.secrets.GITHUB_TOKEN]\nhosts = ["granted.test"]\n')
    s = e2b_serve(tmp_path, {"a": ["--ceiling", str(grants)],
                             "b": ["--ceiling", str(bare)]}, templates,
                  args=("--config", str(cfg)))
    try:
        e2b_env(s, monkeypatch, "a")
        with e2b.Sandbox.create(template="with-gh", timeout=120) as sb:
            before = len(world["log"])
            r = sb.commands.run('echo "env=$GITHUB_TOKEN"; curl -sS -m 10 -H '
                                '"Authorization: Bearer $GITHUB_TOKEN" '
                                "https://granted.test/echo")
            assert r.stdout.startswith("env=corral_GITHUB_TOKEN_"), r.stdout
            assert TOKEN not in r.stdout + r.stderr
            seen = [x for x in world["log"][before:] if x["path"] == "/echo"]
            assert ("authorization", f"Bearer {TOKEN}") in [
                (k.lower(), v) for k, v in seen[-1]["headers"]]      # the value went out
        e2b_env(s, monkeypatch, "b")        # a ceiling that does not grant it: 403
        with pytest.raises(Exception, match="secrets.GITHUB_TOKEN") as ei:
            e2b.Sandbox.create(template="with-gh", timeout=120)
        assert "403" in str(ei.value) or "ceiling" in str(ei.value), ei.value
        with e2b.Sandbox.create(timeout=120) as plain:        # its other templates work
            assert plain.commands.run("echo ok").stdout == "ok\n"
    finally:
        s.stop()
    log = s.log.read_text()
    assert TOKEN not in log and str(value_file) not in log


def test_a_template_that_names_a_secrets_source_stops_the_start(tmp_path):
    """The source is the server config's: a template carrying one is refused at start,
    naming the template and the secret."""
    import subprocess

    from conftest import CORRAL

    path = tmp_path / "templates.toml"
    path.write_text('[leaky.secrets.GH]\nfrom = "env:HOME"\nhosts = ["api.example.com"]\n')
    p = subprocess.run([CORRAL, "serve", "--port", "0", "--state-dir",
                        str(tmp_path / "state")], capture_output=True, text=True,
                       timeout=120, env={"PATH": "/usr/bin:/bin",
                                         "CORRAL_E2B_TEMPLATES": str(path)})
    assert p.returncode != 0
    assert "templates.leaky.secrets.GH" in p.stderr + p.stdout, p.stderr
