"""Screenshots of the dashboard (docs/dashboard.md), taken by a real browser: a real
`corral serve` on loopback with its own state directory, real sandbox runs through the
API (ok, error, denied network, out of memory, timeout, a hostile argv), a real
`corral probe` of a few categories, then Debian's chromium (headless, driven by
Playwright) logs in with an admin token and saves each page as a PNG.

    .venv/bin/python scripts/dashboard_screens.py                 # into docs/dashboard/
    .venv/bin/python scripts/dashboard_screens.py --out /tmp/shots --no-probe
    .venv/bin/python scripts/dashboard_screens.py --category escape --category dns

Needs the namespace tier (root or user namespaces) and /usr/bin/chromium (setup.sh).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from servefix import CORRAL, Serve  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
WIDTH = 1100
CEILING = """\
[network]
mode = "allow"
allow = ["allowed.test", "pypi.org", "files.pythonhosted.org"]
nameservers = ["127.0.0.1:9"]
"""
NET = {"mode": "allow", "allow": ["allowed.test", "pypi.org"],
       "nameservers": ["127.0.0.1:9"]}
PY = "/usr/bin/python3"


def populate(s: Serve, admin: str, agent: str) -> dict:
    """Sandboxes and runs through the API; returns the ids worth a screenshot."""
    a, b = s.http(agent), s.http(admin)
    sid = a.post("/sandboxes", json={"policy": {"network": NET, "limits": {"memory": "128M"}},
                                     "metadata": {"task": "fix-failing-tests",
                                                  "agent": "claude"}}).json()["id"]
    other = b.post("/sandboxes", json={"policy": {}, "timeout": 3600,
                                       "metadata": {"task": "review"}}).json()["id"]

    def run(client, box, argv, **kw):
        r = client.post(f"/sandboxes/{box}/exec", json={"argv": argv, **kw})
        assert r.status_code == 200, r.text
        return r.json()

    run(a, sid, [PY, "-c", "print('collected 42 items; 42 passed')"])
    for host in ("telemetry.evil.test", "api.unknown-llm.test", "telemetry.evil.test",
                 "pastebin.test", "telemetry.evil.test", "api.unknown-llm.test",
                 "telemetry.evil.test", "registry.npmjs.test"):
        run(a, sid, ["/bin/sh", "-c", f"curl -sS -m 5 http://{host}/ >/dev/null"])
    run(a, sid, ["/bin/sh", "-c", "curl -sS -m 5 http://telemetry.evil.test/collect; "
                 "curl -sS -m 5 https://api.unknown-llm.test/v1; "
                 "curl -sS -m 5 http://telemetry.evil.test/collect; exit 7"])
    run(a, sid, ["/bin/sh", "-c", "curl -sS -m 5 http://telemetry.evil.test:8080/x"])
    run(a, sid, [PY, "-c", "b = b'x' * (512 << 20)"])
    run(a, sid, ["/bin/sleep", "30"], timeout=1)
    run(a, sid, ["/bin/sh", "-c", "ls /nonexistent"])
    run(b, other, ["/bin/echo", "<script>alert('argv')</script><b>bold?</b>"])
    run(b, other, [PY, "-c", "print('<img src=x onerror=alert(1)>'); import os; "
                   "print(os.uname().sysname)"])
    _spread(s)
    runs = b.get("/runs").json()["runs"]
    pick = next(r["id"] for r in runs if r["argv"][-1].endswith("exit 7"))
    return {"run": pick, "sandbox": sid}


def _spread(s: Serve) -> None:
    """Spread the service runs' start times over the last 20 hours (oldest first), so the
    chart of denials over the last day has a shape: the one thing these screenshots
    stage."""
    import sqlite3

    time.sleep(0.5)       # the audit writer lets a batch gather for 50 ms
    conn = sqlite3.connect(os.path.join(s.state, "audit", "audit.db"))
    with conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM runs WHERE face = 'service' "
                                          "ORDER BY started")]
        for i, rid in enumerate(ids):
            back = 20 * 3600 * (1 - i / max(len(ids) - 1, 1))
            conn.execute("UPDATE runs SET started = started - ?, ended = ended - ? "
                         "WHERE id = ?", (back, back, rid))
    conn.close()


def shoot(url: str, token: str, out: Path, ids: dict) -> list[Path]:
    from playwright.sync_api import sync_playwright

    # (name, path, the most pixels of height kept): small PNGs for the docs
    shots = [("login", None, 400), ("overview", "/", 800), ("sandboxes", "/ui/sandboxes", 580),
             ("runs", "/ui/runs", 540), ("run", f"/ui/runs/{ids['run']}", 860),
             ("denials", "/ui/denials", 600), ("probe", "/ui/probe", 540)]
    made = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": WIDTH, "height": 760})
        problems = []
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
        page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
        page.goto(url + "/")
        for name, path, most in shots:
            if path is None:
                page.fill("#token", "corral_" + "•" * 10)
                made.append(out / f"{name}.png")
                page.screenshot(path=made[-1], clip={"x": 0, "y": 0, "width": WIDTH,
                                                     "height": most})
                page.fill("#token", token)
                page.click("button.primary")
                page.wait_for_url(url + "/")
                continue
            page.goto(url + path)
            if name == "run":
                page.click("details summary >> nth=0")      # one event's fields, opened
            made.append(out / f"{name}.png")
            height = min(page.evaluate("document.documentElement.scrollHeight"), most)
            page.screenshot(path=made[-1], full_page=True,
                            clip={"x": 0, "y": 0, "width": WIDTH, "height": height})
        browser.close()
    if problems:
        raise SystemExit("the pages were not clean:\n" + "\n".join(problems))
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "dashboard"))
    ap.add_argument("--category", action="append", default=None,
                    help="probe categories to run (default: escape, env-leak)")
    ap.add_argument("--no-probe", action="store_true")
    o = ap.parse_args()
    out = Path(o.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="corral-screens-") as tmp:
        s = Serve(Path(tmp), env={"CORRAL_AUDIT": "1"})
        ceiling = Path(tmp) / "ceiling.toml"
        ceiling.write_text(CEILING)
        admin = s.token("admin", "--admin", "--ceiling", str(ceiling))
        agent = s.token("agent1", "--ceiling", str(ceiling), "--max-sandboxes", "4")
        if not o.no_probe:
            args = [a for c in (o.category or ["escape", "env-leak"]) for a in
                    ("--category", c)]
            t = time.monotonic()
            # in a state directory of its own (its runs stay out of the runs shown),
            # then its matrix is handed to the server's
            pstate = Path(tmp) / "probe-state"
            subprocess.run([CORRAL, "probe", *args], stdout=subprocess.DEVNULL,
                           env={**os.environ, "CORRAL_STATE_DIR": str(pstate)})
            (Path(s.state) / "probe").mkdir(mode=0o700, parents=True)
            shutil.copy(pstate / "probe" / "last.json", Path(s.state) / "probe" / "last.json")
            print(f"probe: {time.monotonic() - t:.0f} s", file=sys.stderr)
        s.start()
        try:
            ids = populate(s, admin, agent)
            for p in shoot(s.url, admin, out, ids):
                print(f"{p} {p.stat().st_size // 1024} KiB")
        finally:
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
