"""The dashboard of `corral serve` (docs/dashboard.md), end to end: one real `corral serve`
on loopback with real namespace-tier sandboxes behind it, and one real browser (Debian's
chromium, headless, driven by Playwright) for the module. Pages load with no console
error and no failed request; a run started through the API shows up with its detail;
a hostile argv and output are shown as text and run no script; without a login the pages
redirect and the JSON routes stay 401; a token sees only its own runs, an admin every
token's; log out and revocation end a session; the probe page shows a real probe."""

import json
import os
import re
import subprocess
import time
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import CORRAL, tier_unavailable
from servefix import Serve

CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.skipif(tier_unavailable("namespace") is not None,
                       reason=f"namespace tier: {tier_unavailable('namespace')}"),
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                       reason="Debian's chromium is not installed (scripts/setup.sh)"),
]

CEILING = """\
[network]
mode = "allow"
allow = ["allowed.test"]
nameservers = ["127.0.0.1:9"]
"""
NET = {"mode": "allow", "allow": ["allowed.test"], "nameservers": ["127.0.0.1:9"]}
HOSTILE = ("<script>window.__pwned = 'argv'; alert('argv')</script>"
           "<img src=x onerror=\"window.__pwned = 'img'\"><b>bold?</b>&amp;")
PAGES = ["/", "/ui/sandboxes", "/ui/runs", "/ui/denials", "/ui/probe"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash")
    s = Serve(tmp, env={"CORRAL_AUDIT": "1"})
    ceiling = tmp / "ceiling.toml"
    ceiling.write_text(CEILING)
    s.tokens = {"admin": s.token("admin", "--admin", "--ceiling", str(ceiling)),
                "alice": s.token("alice", "--ceiling", str(ceiling)),
                "bob": s.token("bob", "--ceiling", str(ceiling))}
    # a real probe of one case, kept in the state directory for the Probe page
    p = subprocess.run([CORRAL, "probe", "--case", "env.dump", "--isolation", "namespace"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CORRAL_STATE_DIR": s.state})
    assert p.returncode == 0, p.stdout + p.stderr
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def alice_run(srv):
    """Alice's sandbox and its commands through the API: one refused on the network, one
    with a hostile argv and output. Returns their run ids once the audit store has them."""
    with srv.http(srv.tokens["alice"]) as a:
        return _alice(a)


def _alice(a):
    sid = a.post("/sandboxes", json={"policy": {"network": NET}}).json()["id"]
    r = a.post(f"/sandboxes/{sid}/exec", json={"argv": [
        "/bin/sh", "-c", "echo dash-marker; curl -sS -m 5 http://refused.test/; exit 3"]})
    assert r.status_code == 200 and r.json()["exit_code"] == 3, r.text
    r = a.post(f"/sandboxes/{sid}/exec", json={"argv": ["/usr/bin/printf", "%s\\n", HOSTILE]})
    assert r.status_code == 200 and r.json()["stdout"] == HOSTILE + "\n", r.text
    runs = _wait(lambda: [x for x in a.get("/runs").json()["runs"]], 2)
    by = {x["argv"][-1]: x["id"] for x in runs}
    return {"sandbox": sid, "denied": by[next(k for k in by if "refused.test" in k)],
            "hostile": by[HOSTILE]}


def _wait(get, n: int, timeout: float = 30):
    """get() until it has n items (the audit writer batches its records for 50 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        got = get()
        if len(got) >= n or time.monotonic() > deadline:
            assert len(got) >= n, got
            return got
        time.sleep(0.05)


class Watched:
    """A browser context logged in as one token, with every console message of level
    warning or error, every failed request, every response of 400 or more (but the ones a
    test asks for) and every dialog recorded."""

    def __init__(self, browser, srv, name: str) -> None:
        self.srv, self.problems, self.dialogs = srv, [], []
        self.ctx = browser.new_context()
        self.page = self.ctx.new_page()
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(
            f"request failed: {r.url} {r.failure}"))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(srv.url + "/")
        assert urlsplit(self.page.url).path == "/ui/login"
        self.page.fill("#token", srv.tokens[name])
        with self.page.expect_navigation():
            self.page.click("button.primary")
        assert self.page.url == srv.url + "/", self.page.url

    def go(self, path: str, status: int = 200):
        resp = self.page.goto(self.srv.url + path)
        assert resp.status == status, (path, resp.status)
        return resp

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture(scope="module")
def admin(browser, srv):
    w = Watched(browser, srv, "admin")
    yield w
    w.close()


def test_without_a_login_pages_redirect_and_the_json_routes_stay_401(srv, admin):
    with httpx.Client(base_url=srv.url, timeout=30) as h:
        _no_login(srv, admin, h)


def _no_login(srv, admin, h):
    for path in PAGES + ["/ui/runs/r-0000000000000000"]:
        r = h.get(path)
        assert r.status_code == 303, (path, r.status_code)
        assert r.headers["location"].startswith("/ui/login?next=")
    # the browser's session cookie opens no JSON route: they stay bearer-only
    (cookie,) = admin.ctx.cookies()
    assert cookie["name"] == "corral_session" and cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict" and cookie["value"] not in srv.tokens.values()
    jar = {cookie["name"]: cookie["value"]}
    for path in ("/runs", "/denials", "/sandboxes"):
        r = httpx.get(srv.url + path, cookies=jar, timeout=30)
        assert r.status_code == 401, (path, r.status_code)
    assert httpx.get(srv.url + "/", cookies=jar, timeout=30).status_code == 200
    # the token itself is nowhere in the URL and not in the page
    assert srv.tokens["admin"] not in admin.page.url
    assert srv.tokens["admin"] not in admin.page.content()


def test_login_and_logout_posts_must_be_same_origin(srv):
    with httpx.Client(base_url=srv.url, timeout=30) as h:
        _same_origin(srv, h)


def _same_origin(srv, h):
    form = {"token": srv.tokens["bob"]}
    for headers in ({"Origin": "http://evil.test"}, {"Origin": "null"}, {},
                    {"Referer": "http://evil.test/ui/login"}):
        r = h.post("/ui/login", data=form, headers=headers)
        assert r.status_code == 403 and "set-cookie" not in r.headers, headers
    r = h.post("/ui/login", data={"token": "corral_nope"}, headers={"Origin": srv.url})
    assert r.status_code == 401 and "set-cookie" not in r.headers
    # an open redirect after login is refused: the next page is always on this server
    r = h.post("/ui/login?next=//evil.test/x", data=form, headers={"Origin": srv.url})
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert srv.tokens["bob"] not in cookie
    sid = re.match(r"corral_session=([^;]+)", cookie).group(1)
    jar = {"corral_session": sid}
    assert httpx.get(srv.url + "/", cookies=jar, timeout=30).status_code == 200
    r = httpx.post(srv.url + "/ui/logout", cookies=jar, headers={"Origin": "http://evil.test"},
                   timeout=30)
    assert r.status_code == 403
    assert httpx.get(srv.url + "/", cookies=jar, timeout=30).status_code == 200
    r = httpx.post(srv.url + "/ui/logout", cookies=jar, headers={"Origin": srv.url}, timeout=30)
    assert r.status_code == 303
    assert httpx.get(srv.url + "/", cookies=jar, timeout=30).status_code == 303


def test_a_revoked_token_ends_its_sessions(srv):
    ls = subprocess.run([CORRAL, "token", "ls", "--state-dir", srv.state], capture_output=True,
                        text=True).stdout
    assert [ln.split("\t")[-1] for ln in ls.splitlines() if ln.startswith("admin\t")] \
        == ["admin"]
    assert [ln.split("\t")[-1] for ln in ls.splitlines() if ln.startswith("bob\t")] == [""]
    tok = srv.token("carol")
    r = httpx.post(srv.url + "/ui/login", data={"token": tok}, headers={"Origin": srv.url},
                   timeout=30)
    jar = {"corral_session": r.cookies["corral_session"]}
    assert httpx.get(srv.url + "/ui/runs", cookies=jar, timeout=30).status_code == 200
    p = subprocess.run([CORRAL, "token", "revoke", "carol", "--state-dir", srv.state],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert httpx.get(srv.url + "/ui/runs", cookies=jar, timeout=30).status_code == 303


def test_every_page_loads_clean_with_a_strict_csp(srv, admin, alice_run):
    for path in PAGES + [f"/ui/runs/{alice_run['denied']}", "/ui/runs?verdict=error",
                         "/ui/denials?since=7d&kind=net", "/ui/runs?verdict=refused",
                         "/ui/denials?kind=refused"]:
        resp = admin.go(path)
        csp = resp.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "http" not in csp
        assert resp.headers["x-frame-options"] == "DENY"
    assert admin.problems == [] and admin.dialogs == []
    # a bad filter is a 400 page naming it, not a 500
    admin.go("/ui/runs?verdict=maybe", status=400)
    assert "verdict 'maybe'" in admin.page.inner_text("main")
    admin.go("/ui/runs/r-nosuchrun", status=404)
    admin.problems.clear()


def test_a_run_through_the_api_appears_with_its_detail(srv, browser, alice_run):
    w = Watched(browser, srv, "alice")
    try:
        w.go("/ui/runs")
        link = w.page.locator(f"a[href='/ui/runs/{alice_run['denied']}']")
        assert link.count() == 1
        with w.page.expect_navigation():
            link.click()
        main = w.page.inner_text("main")
        assert alice_run["denied"] in main and "dash-marker" in main     # its output
        assert "deny refused.test:80" in main                         # its net event
        assert "verified: signed by this host's key" in main          # its receipt
        assert "stdout and stderr shown match its hashes" in main
        # the overview's most-refused domains name the rule that would allow it
        w.go("/")
        assert 'network.allow += "refused.test"' in w.page.inner_text("main")
        # the denials chart has a bar for it, and the sandbox is listed live
        w.go("/ui/denials")
        assert w.page.locator("svg.chart rect").count() >= 1
        w.go("/ui/sandboxes")
        assert alice_run["sandbox"] in w.page.inner_text("main")
        # the filters: by verdict and by tier
        w.go("/ui/runs?verdict=ok")
        assert w.page.locator(f"a[href='/ui/runs/{alice_run['denied']}']").count() == 0
        assert w.page.locator(f"a[href='/ui/runs/{alice_run['hostile']}']").count() == 1
        w.go("/ui/runs?tier=gvisor")
        assert w.page.locator("a[href^='/ui/runs/r-']").count() == 0
        assert w.problems == [] and w.dialogs == []
    finally:
        w.close()


def test_a_hostile_argv_and_output_are_text_and_run_no_script(srv, admin, alice_run):
    for path in ("/", "/ui/runs", f"/ui/runs/{alice_run['hostile']}"):
        admin.go(path)
        main = admin.page.inner_text("main")
        # shown as text: in the argv (shell-quoted: its double quotes escaped) and, on its
        # page, byte for byte in the output the service still holds
        assert "<script>window.__pwned = 'argv'; alert('argv')</script>" in main, path
        assert "<b>bold?</b>&amp;" in main and "onerror=" in main, path
        if path.startswith("/ui/runs/"):
            assert HOSTILE in main
        assert admin.page.evaluate("window.__pwned") is None, path
        assert admin.page.locator("main script, main img, main b:text('bold?')").count() \
            == 0, path
        assert admin.page.locator("script").count() == 1, path       # the page's own
    assert admin.dialogs == [] and admin.problems == []
    # and were escaping to miss one, the CSP would stop it: an inline script without the
    # page's nonce does not run (the browser logs the violation)
    admin.page.evaluate("() => { const s = document.createElement('script'); "
                        "s.textContent = 'window.__pwned = \"csp\"'; "
                        "document.body.appendChild(s); }")
    assert admin.page.evaluate("window.__pwned") is None
    assert any("Content Security Policy" in p for p in admin.problems), admin.problems
    admin.problems.clear()


def test_a_token_sees_only_its_own_runs_and_the_admin_sees_all(srv, browser, admin,
                                                                alice_run):
    with srv.http(srv.tokens["bob"]) as b, srv.http(srv.tokens["admin"]) as a:
        _own_only(srv, browser, admin, alice_run, a, b)


def _own_only(srv, browser, admin, alice_run, a, b):
    sid = b.post("/sandboxes", json={"policy": {}}).json()["id"]
    assert b.post(f"/sandboxes/{sid}/exec", json={"argv": ["/bin/echo", "bobs"]}) \
        .status_code == 200
    (bobs,) = _wait(lambda: b.get("/runs").json()["runs"], 1)
    w = Watched(browser, srv, "bob")
    try:
        w.go("/ui/runs")
        ids = set(w.page.locator("a[href^='/ui/runs/r-']").evaluate_all(
            "els => els.map(e => e.textContent)"))
        assert ids == {bobs["id"]}
        w.go(f"/ui/runs/{alice_run['denied']}", status=404)
        w.go("/ui/sandboxes")
        main = w.page.inner_text("main")
        assert sid in main and alice_run["sandbox"] not in main
        w.go("/")
        assert "refused.test" not in w.page.inner_text("main")
        assert "token bob" in w.page.inner_text("header")
        assert "admin" not in w.page.inner_text("header")
    finally:
        w.close()
    admin.go("/ui/runs")
    ids = set(admin.page.locator("a[href^='/ui/runs/r-']").evaluate_all(
        "els => els.map(e => e.textContent)"))
    assert {bobs["id"], alice_run["denied"], alice_run["hostile"]} <= ids
    assert "token:alice" in admin.page.inner_text("main")
    admin.go("/ui/sandboxes")
    assert sid in admin.page.inner_text("main")
    assert alice_run["sandbox"] in admin.page.inner_text("main")
    # the JSON API: the admin token reads every run, the others their own
    assert a.get(f"/runs/{alice_run['denied']}").status_code == 200
    assert b.get(f"/runs/{alice_run['denied']}").status_code == 404
    assert admin.problems == [] and admin.dialogs == []


def test_the_probe_page_shows_this_hosts_last_probe(srv, admin):
    admin.go("/ui/probe")
    main = admin.page.inner_text("main")
    assert "env.dump" in main and "namespace" in main and "contained" in main
    with open(os.path.join(srv.state, "probe", "last.json")) as f:
        doc = json.load(f)
    assert time.time() - doc["date"] < 600
    assert [(c["id"], c["tier"]) for c in doc["cells"]] == [("env.dump", "namespace")]
    assert os.stat(os.path.join(srv.state, "probe", "last.json")).st_mode & 0o077 == 0
