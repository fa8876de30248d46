"""`corral serve` with its limits, --config, [secrets] and TLS, for real: uvicorn in a
subprocess (servefix.Serve), tokens made with `corral token`, namespace sandboxes behind
it, a real HTTPS echo server for the secret (netfix's world)."""

import json
import os
import subprocess

import pytest
from conftest import CORRAL, tier_unavailable
from netfix import GRANT_PRIV, TOKEN, make_cert
from servefix import Serve, free_port, serve_once
from servefix import api_error as _err


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A server whose [limits] give every token without its own 3 requests, then 1 a
    minute (nothing refills while a test runs)."""
    tmp = tmp_path_factory.mktemp("limits")
    cfg = tmp / "serve.toml"
    cfg.write_text('[limits]\nrate = "1/min"\nburst = 3\n')
    net = tmp / "net.toml"
    net.write_text('[network]\nmode = "allow"\nallow = ["allowed.invalid"]\n')
    s = Serve(tmp, "--config", str(cfg))
    s.tokens = {"default": s.token("default"),
                "own": s.token("own", "--rate", "1/min", "--burst", "5"),
                "fast": s.token("fast", "--rate", "1000/s", "--burst", "1000"),
                "other": s.token("other"),
                "three": s.token("three", "--max-sandboxes", "3", "--rate", "1000/s",
                                 "--burst", "1000", "--ceiling", str(net))}
    s.start()
    yield s
    s.stop()


def _burst(s, token, n):
    with s.http(token) as h:
        return [h.get("/sandboxes") for _ in range(n)]


def test_a_burst_past_the_tokens_rate_is_429_with_retry_after(limited):
    got = _burst(limited, limited.tokens["own"], 8)
    assert [r.status_code for r in got] == [200] * 5 + [429] * 3
    for r in got[5:]:
        _err(r, 429, "rate", "rate")
        assert 1 <= int(r.headers["retry-after"]) <= 60
    # another token's bucket is its own; the endpoints without a token are not counted
    assert _burst(limited, limited.tokens["other"], 1)[0].status_code == 200
    with limited.http() as h:
        assert all(h.get("/health").status_code == 200 for _ in range(10))


def test_the_configs_limits_apply_to_tokens_without_their_own(limited):
    from corral import client

    got = _burst(limited, limited.tokens["default"], 5)
    assert [r.status_code for r in got] == [200] * 3 + [429] * 2
    with pytest.raises(client.RateLimited) as e:           # the SDK's class for it
        client.Sandbox.list(api_url=limited.url, api_key=limited.tokens["default"])
    assert e.value.field == "rate" and e.value.retry_after >= 1
    fast = _burst(limited, limited.tokens["fast"], 40)
    assert {r.status_code for r in fast} == {200}


#: a sandbox with an egress proxy: made in tens of ms, so creates at once overlap
SLOW = {"network": {"mode": "allow", "allow": ["allowed.invalid"]}}


@pytest.mark.skipif(tier_unavailable("namespace", SLOW) is not None, reason="namespace tier")
def test_max_sandboxes_holds_under_concurrent_creates(limited):
    """Ten creates at once for a token of max-sandboxes 3: three made, seven 429 (a check
    that saw room before the others had made theirs would let them all through)."""
    import threading

    import httpx

    got = []
    go = threading.Barrier(10)

    def one():
        with httpx.Client(base_url=limited.url, timeout=120, headers={
                "Authorization": f"Bearer {limited.tokens['three']}"}) as h:
            go.wait()
            got.append(h.post("/sandboxes", json={"policy": SLOW}))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(r.status_code for r in got) == [201] * 3 + [429] * 7, [
            (r.status_code, r.text[:300]) for r in got if r.status_code not in (201, 429)]
        for r in got:
            if r.status_code == 429:
                _err(r, 429, "rate", "max_sandboxes")
    finally:
        with limited.http(limited.tokens["three"]) as h:
            for r in got:
                if r.status_code == 201:
                    h.delete(f"/sandboxes/{r.json()['id']}")


def test_token_ls_shows_the_limits(limited):
    out = subprocess.run([CORRAL, "token", "ls", "--state-dir", limited.state],
                         capture_output=True, text=True, check=True).stdout
    (own,) = [line for line in out.splitlines() if line.startswith("own\t")]
    assert "rate=1/min" in own and "burst=5" in own


def test_the_config_turns_mcp_on_and_sets_the_log_level(tmp_path):
    import httpx

    cfg = tmp_path / "serve.toml"
    cfg.write_text('[server]\nmcp = true\nlog_level = "warning"\n')
    s = Serve(tmp_path, "--config", str(cfg))
    s.start()
    try:
        r = httpx.post(s.url + "/mcp", json={}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["kind"] == "auth"
        with s.http() as h:
            h.get("/health")
    finally:
        s.stop()
    log = s.log.read_text()
    assert "(MCP at /mcp)" in log and "GET /health" not in log    # no access log


@pytest.mark.slow
def test_an_idle_connection_outlives_a_clients_idle_expiry(tmp_path):
    """uvicorn closes an idle connection after 5 s by default: as long as httpx keeps
    one, so a request sent as the server closed it was lost. corral serve keeps it
    `keep_alive` seconds (310 by default: past E2B's SDK's 300); a config sets it."""
    import socket
    import time

    cfg = tmp_path / "serve.toml"
    cfg.write_text('[server]\nkeep_alive = 7\n')
    s = Serve(tmp_path, "--config", str(cfg))
    s.start()
    try:
        host, port = s.url.split("//")[1].rsplit(":", 1)
        req = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        with socket.create_connection((host, int(port)), timeout=30) as c:
            c.sendall(req)
            assert c.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(5.5)                 # past uvicorn's default: still open
            c.sendall(req)
            assert c.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(8)                   # past the configured 7 s: closed
            c.settimeout(5)
            assert c.recv(65536) == b""
    finally:
        s.stop()


def test_the_access_log_has_a_line_per_request_in_order(tmp_path):
    """On by default: every request's line, in the order answered, though written after
    its response went out (service/wire.py), and all of them by the time the service has
    stopped."""
    from servefix import until

    s = Serve(tmp_path)
    s.start()
    try:
        with s.http() as h:
            for path in ("/health", "/nope-1", "/health", "/nope-2"):
                h.get(path)
            until(lambda: "/nope-2 HTTP/1.1" in s.log.read_text(), "the last line")
            h.get("/nope-3")
    finally:
        s.stop()
    lines = [ln for ln in s.log.read_text().splitlines() if "HTTP/1.1" in ln]
    got = [(ln.split('"')[1].split()[1], ln.split('"')[2].split()[0]) for ln in lines]
    assert got[-5:] == [("/health", "200"), ("/nope-1", "404"), ("/health", "200"),
                        ("/nope-2", "404"), ("/nope-3", "404")], lines


def test_the_config_turns_the_access_log_off(tmp_path):
    """access_log = false: no line per request; corral's own lines stay (info level)."""
    cfg = tmp_path / "serve.toml"
    cfg.write_text('[server]\naccess_log = false\n')
    s = Serve(tmp_path, "--config", str(cfg))
    s.start()
    try:
        with s.http() as h:
            assert h.get("/health").status_code == 200
    finally:
        s.stop()
    log = s.log.read_text()
    assert "corral serve: http://" in log and "GET /health" not in log, log


def test_the_config_gives_host_port_and_state_dir(tmp_path):
    """No flags: the address and the state directory (relative to the file) are the
    config's, and a token made in that state directory is the one the server knows."""
    import time

    import httpx
    from servefix import make_token

    port = free_port()
    conf = tmp_path / "etc"
    conf.mkdir()
    cfg = conf / "serve.toml"
    cfg.write_text(f'[server]\nhost = "127.0.0.1"\nport = {port}\nstate_dir = "../state"\n')
    tok = make_token(str(tmp_path / "state"), "t")
    log = open(tmp_path / "serve.log", "wb")
    p = subprocess.Popen([CORRAL, "serve", "--config", str(cfg)], stdout=log,
                         stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/sandboxes", timeout=5,
                              headers={"Authorization": f"Bearer {tok}"})
                break
            except httpx.TransportError:
                assert p.poll() is None, (tmp_path / "serve.log").read_text()
                time.sleep(0.05)
        assert r.status_code == 200, r.text
    finally:
        p.terminate()
        p.wait(60)
        log.close()


@pytest.mark.parametrize("text,key", [
    ('[server]\nhots = "0.0.0.0"\n', "server.hots"),
    ('[sever]\nhost = "0.0.0.0"\n', "sever"),
    ('[server]\ntls_crt = "/c.pem"\n', "server.tls_crt"),
    ('[limits]\nrat = "5/s"\n', "limits.rat"),
    ('[limits]\nrate = "lots"\n', "limits.rate"),
    ('[limits]\nburst = 4\n', "limits.burst"),
    ('[server]\nport = "8787"\n', "server.port"),
    ('[server]\naccess_log = "no"\n', "server.access_log"),
    ('[server]\nmax_terminals = 0\n', "server.max_terminals"),
    ('[server]\nmax_running = 0\n', "server.max_running"),
    ('[server]\nmax_sandboxes = 0\n', "server.max_sandboxes"),
    ('[server]\nmax_sandboxes = "8"\n', "server.max_sandboxes"),
    ('[server]\nkeep_alive = 0\n', "server.keep_alive"),
    ('[server]\nkeep_alive = 2.5\n', "server.keep_alive"),
    ('[secrets]\nGH = "env:CORRAL_TEST_UNSET_VARIABLE"\n', "secrets.GH"),
    ('[secrets.GH]\nvalue = "ghp_literal"\n', "secrets.GH.value"),
    ('[secrets]\nGH = "ghp_literal"\n', "secrets.GH"),
    ('[secrets.GH]\nfrom = "file:/nonexistent/corral-test"\n', "secrets.GH.from"),
    ('not toml at all [', "--config"),
])
def test_a_bad_config_is_one_line_naming_the_key(tmp_path, text, key):
    cfg = tmp_path / "serve.toml"
    cfg.write_text(text)
    code, err = serve_once("--config", str(cfg), "--port", str(free_port()),
                           "--state-dir", str(tmp_path / "state"))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert key in err, err
    assert err.count(key + ":") == 1, err        # named once, not "key: path: key: ..."
    if key != "--config":
        assert str(cfg) in err, err              # and the file it is in
    assert "ghp_literal" not in err


@pytest.mark.parametrize("args,field", [
    (["--tls-cert", "/etc/hostname"], "--tls-key"),
    (["--tls-key", "/etc/hostname"], "--tls-cert"),
    (["--tls-cert", "/etc/hostname", "--tls-key", "/etc/hostname"], "--tls-cert"),
])
def test_tls_needs_a_cert_and_its_key(tmp_path, args, field):
    code, err = serve_once(*args, "--port", str(free_port()), "--state-dir",
                           str(tmp_path / "state"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and field in err, err


def test_tls(tmp_path):
    import httpx

    cert, key = make_cert(tmp_path, "localhost")
    import ssl

    s = Serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), scheme="https",
              verify=ssl.create_default_context(cafile=str(cert)), url_host="localhost")
    tok = s.token("t")
    s.start()
    try:
        with s.http(tok) as h:
            assert h.get("/sandboxes").json() == {"sandboxes": []}
            _err(h.get("/sandboxes", headers={"Authorization": "Bearer corral_no"}), 401)
        with pytest.raises(httpx.TransportError):              # plain HTTP: no answer
            httpx.get(f"http://127.0.0.1:{s.port}/health", timeout=10)
        with pytest.raises(httpx.TransportError):              # a client that checks
            httpx.get(s.url + "/health", timeout=10)           # (the system's CAs)
    finally:
        s.stop()
    assert "warning" not in s.log.read_text()


def _first_lines(argv, want, timeout=60):
    """Run argv until a line of its stderr contains `want` (or it ends): its lines."""
    import queue
    import threading

    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    q = queue.Queue()
    threading.Thread(target=lambda: [q.put(x) for x in p.stderr] + [q.put(None)],
                     daemon=True).start()
    lines = []
    try:
        while (line := q.get(timeout=timeout)) is not None:
            lines.append(line)
            if want in line:
                break
    finally:
        p.terminate()
        p.wait(30)
        p.stderr.close()
    return lines


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare -n needs root")
def test_beyond_loopback_without_tls_warns(tmp_path):
    """In a network namespace of its own (nothing else can reach it), on 0.0.0.0."""
    cert, key = make_cert(tmp_path, "localhost")
    base = ["unshare", "-n", CORRAL, "serve", "--host", "0.0.0.0", "--port", "8787",
            "--state-dir", str(tmp_path / "state")]
    plain = _first_lines(base, "Uvicorn running")
    assert any("warning" in x and "0.0.0.0" in x and "TLS" in x for x in plain), plain
    assert any("Uvicorn running on http://0.0.0.0:8787" in x for x in plain), plain
    tls = _first_lines(base + ["--tls-cert", str(cert), "--tls-key", str(key)],
                       "Uvicorn running")
    assert any("Uvicorn running on https://" in x for x in tls), tls
    assert not any("warning" in x for x in tls), tls
    loop = _first_lines(["unshare", "-n", CORRAL, "serve", "--host", "127.0.0.2", "--port",
                         "8787", "--state-dir", str(tmp_path / "state")], "Uvicorn running")
    assert not any("warning" in x for x in loop), loop


# -- [secrets]: configured on the server by name, granted by a ceiling, never on the API --
def _secret_policy(world):
    return {"network": {"mode": "allow", "allow": ["granted.test"],
                        "allow_private": [GRANT_PRIV],
                        "nameservers": [f"127.0.0.1:{world['dns']}"],
                        "upstream_ca": str(world["test_ca"])},
            "limits": {"timeout": "30s"}}


def test_a_server_secret_reaches_the_granted_host_and_never_the_api(tmp_path, world):
    policy = _secret_policy(world)
    if tier_unavailable("namespace", policy):
        pytest.skip(tier_unavailable("namespace", policy))
    value_file = tmp_path / "gh.token"
    value_file.write_text(TOKEN)
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f'[secrets]\nGITHUB_TOKEN = "file:{value_file}"\n'
                   '[limits]\nrate = "100/s"\nburst = 100\n')
    ceiling = tmp_path / "ceiling.toml"           # names the secret and its hosts, no source
    net = policy["network"]
    ceiling.write_text(
        f'[network]\nmode = "allow"\nallow = ["granted.test"]\nallow_private = '
        f'["{GRANT_PRIV}"]\nnameservers = ["{net["nameservers"][0]}"]\n'
        f'upstream_ca = "{net["upstream_ca"]}"\n'
        '[secrets.GITHUB_TOKEN]\nhosts = ["granted.test"]\n')
    s = Serve(tmp_path, "--config", str(cfg))
    tok = s.token("agent", "--ceiling", str(ceiling))
    s.start()
    answers = []
    try:
        with s.http(tok) as h:
            body = {"policy": {**policy, "secrets": {"GITHUB_TOKEN": {
                "hosts": ["granted.test"]}}}}
            r = h.post("/sandboxes", json=body)
            assert r.status_code == 201, r.text
            answers.append(r)
            sid = r.json()["id"]
            assert r.json()["policy"]["secrets"]["GITHUB_TOKEN"]["hosts"] == ["granted.test"]
            before = len(world["log"])
            r = h.post(f"/sandboxes/{sid}/exec", json={"cmd": (
                'echo "env=$GITHUB_TOKEN"; curl -sS -m 10 -H "Authorization: Bearer '
                '$GITHUB_TOKEN" https://granted.test/echo')})
            answers.append(r)
            assert r.json()["verdict"] == "ok", r.text
            seen = [x for x in world["log"][before:] if x["path"] == "/echo"]
            assert ("authorization", f"Bearer {TOKEN}") in [
                (k.lower(), v) for k, v in seen[-1]["headers"]]      # the value went out
            assert r.json()["stdout"].startswith("env=corral_GITHUB_TOKEN_")
            answers.append(h.post(f"/sandboxes/{sid}/run_code", json={
                "code": "import os\nsorted(os.environ.items())"}))
            answers.append(h.put(f"/sandboxes/{sid}/files", json={
                "path": "/scratch/x", "content": "x"}))
            for path in (f"/sandboxes/{sid}", "/sandboxes", f"/sandboxes/{sid}/explain",
                         f"/sandboxes/{sid}/files/list?path=/scratch", "/openapi.json"):
                answers.append(h.get(path))
            answers.append(h.post("/explain", json=body))
            # a secret the ceiling does not grant, or a source of the request's own
            _err(h.post("/sandboxes", json={"policy": {**policy, "secrets": {
                "OTHER": {"hosts": ["granted.test"]}}}}), 403, "ceiling", "secrets.OTHER")
            for table in ({"from": f"file:{value_file}", "hosts": ["granted.test"]},
                          {"value": "x", "hosts": ["granted.test"]}):
                answers.append(h.post("/sandboxes", json={"policy": {**policy, "secrets": {
                    "GITHUB_TOKEN": table}}}))
                _err(answers[-1], 400, "policy", "secrets.GITHUB_TOKEN")
            answers.append(h.delete(f"/sandboxes/{sid}"))
        with s.http(tok) as h:
            answers.append(h.get("/metrics"))
            assert answers[-1].status_code == 200, answers[-1].text
    finally:
        s.stop()
    for r in answers:
        blob = r.text + json.dumps(dict(r.headers))
        assert TOKEN not in blob and str(value_file) not in blob, r.request.url
    log = s.log.read_text()
    assert "POST /sandboxes" in log
    assert TOKEN not in log and str(value_file) not in log


def test_a_ceiling_secret_the_server_does_not_configure_is_not_granted(tmp_path):
    ceiling = tmp_path / "ceiling.toml"
    ceiling.write_text('[network]\nmode = "allow"\nallow = ["api.example.com"]\n'
                       '[secrets.GH]\nhosts = ["api.example.com"]\n')
    s = Serve(tmp_path)
    tok = s.token("agent", "--ceiling", str(ceiling))
    s.start()
    try:
        with s.http(tok) as h:
            _err(h.post("/sandboxes", json={"policy": {
                "network": {"mode": "allow", "allow": ["api.example.com"]},
                "secrets": {"GH": {"hosts": ["api.example.com"]}}}}), 403, "ceiling",
                "secrets.GH")
    finally:
        s.stop()


def test_the_dashboard_cookie_over_tls_is_secure_and_host_only(tmp_path):
    """Over TLS the dashboard's session cookie is `__Host-corral_session`, Secure (and
    HttpOnly, SameSite=Strict); a login whose Origin is the plain-HTTP origin is refused
    (docs/dashboard.md)."""
    import ssl

    import httpx

    cert, key = make_cert(tmp_path, "localhost")
    ctx = ssl.create_default_context(cafile=str(cert))
    s = Serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), scheme="https",
              verify=ctx, url_host="localhost")
    tok = s.token("t")
    s.start()
    try:
        with httpx.Client(base_url=s.url, verify=ctx, timeout=30) as h:
            r = h.post("/ui/login", data={"token": tok},
                       headers={"Origin": f"http://localhost:{s.port}"})
            assert r.status_code == 403 and "set-cookie" not in r.headers
            r = h.post("/ui/login", data={"token": tok}, headers={"Origin": s.url})
            assert r.status_code == 303, r.text
            cookie = r.headers["set-cookie"]
            assert cookie.startswith("__Host-corral_session=") and tok not in cookie
            attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
            assert {"secure", "httponly", "path", "samesite"} <= attrs, cookie
            assert "domain" not in attrs
            assert h.get("/").status_code == 200           # the client's jar sends it back
            assert h.get("/runs").status_code == 401       # the JSON API: bearer only
    finally:
        s.stop()
