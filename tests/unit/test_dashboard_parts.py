"""The dashboard's pure parts (docs/dashboard.md): escaping, argv quoting (checked against a
real /bin/sh), the redirect target after login, the same-origin check on real Starlette
requests, sessions over a real token store (revocation, expiry), the stored probe report,
and the denials series over a real SQLite store."""

import json
import os
import subprocess

import pytest
from starlette.requests import Request

from corral.service.dashboard import session
from corral.service.dashboard.html import argv_text, chart, esc
from corral.service.tokens import TokenStore


def test_esc_escapes_html_and_shows_hidden_characters():
    assert esc("<script>&\"'") == "&lt;script&gt;&amp;&quot;&#x27;"
    shown = esc("evil\u202egnp.exe\u200b\x1b[31m")
    assert "\u202e" not in shown and "\\u202e" in shown
    assert "\\u200b" in shown and "\\u001b" in shown and "\x1b" not in shown


@pytest.mark.parametrize("argv", [
    ["/bin/echo", "<script>alert('x')</script>"],
    ["sh", "-c", "echo $HOME \"q\" `x` \\ 's"],
    ["a b", "", "plain", "it's", "tab\there"],
])
def test_argv_text_reads_back_the_same_argv_in_a_real_shell(argv):
    line = argv_text(argv)
    out = subprocess.run(["/bin/sh", "-c", f'for x in {line}; do printf "%s\\0" "$x"; done'],
                         capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [a.encode() for a in argv]


@pytest.mark.parametrize("target,want", [
    ("/ui/runs?verdict=oom", "/ui/runs?verdict=oom"), (None, "/"), ("", "/"),
    ("//evil.test/x", "/"), ("/\\evil.test", "/"), ("https://evil.test/", "/"),
    ("/ok\r\nSet-Cookie: x=1", "/"), ("javascript:alert(1)", "/"),
])
def test_after_login_only_a_path_on_this_server(target, want):
    assert session.safe_next(target) == want


def _request(headers: dict, scheme: str = "http") -> Request:
    return Request({"type": "http", "method": "POST", "scheme": scheme, "path": "/ui/login",
                    "query_string": b"", "server": ("127.0.0.1", 8787),
                    "headers": [(k.lower().encode(), v.encode()) for k, v in
                                {"host": "127.0.0.1:8787", **headers}.items()]})


def test_same_origin_needs_our_origin_or_referer():
    assert session.same_origin(_request({"origin": "http://127.0.0.1:8787"}))
    assert session.same_origin(_request({"referer": "http://127.0.0.1:8787/ui/login"}))
    for h in ({}, {"origin": "null"}, {"origin": "http://evil.test"},
              {"origin": "https://127.0.0.1:8787"}, {"origin": "http://127.0.0.1:8787.evil"},
              {"referer": "http://127.0.0.1:8787.evil.test/"},
              {"origin": "http://evil.test", "referer": "http://127.0.0.1:8787/"}):
        assert not session.same_origin(_request(h)), h
    assert session.same_origin(_request({"origin": "https://127.0.0.1:8787"}, "https"))
    assert session.cookie_name(_request({}, "https")) == "__Host-corral_session"


def test_sessions_follow_the_token_and_expire(tmp_path, monkeypatch):
    store = TokenStore(str(tmp_path))
    store.create("ann", admin=True)
    (tok,) = store.load()
    assert tok.admin and session.Viewer(tok).actor is None
    s = session.Sessions()
    sid = s.create(tok)
    assert tok.sha256 not in sid and s.lookup(sid, store).name == "ann"
    assert s.lookup(sid + "x", store) is None and s.lookup(None, store) is None
    store.revoke("ann")
    assert s.lookup(sid, store) is None             # revoked: the session is gone
    store.create("ann")
    assert s.lookup(sid, store) is None             # a new token of that name is not it
    (new,) = store.load()
    assert not new.admin and session.Viewer(new).actor == "token:ann"
    sid = s.create(new)
    monkeypatch.setattr(session, "IDLE", -1.0)
    assert s.lookup(sid, store) is None             # unused too long


def test_the_probe_report_is_merged_and_read_strictly(tmp_path):
    from corral.probe import last
    from corral.probe.cases import load_cases
    from corral.probe.runner import Cell

    cases = {c.id: c for c in load_cases()}
    a, b = cases["env.dump"], cases["escape.mknod-device"]
    state = str(tmp_path)
    last.save([Cell(a, "namespace", True, "contained", True, "r1"),
               Cell(b, "namespace", True, "contained", True, "r2")], state=state, now=100.0)
    last.save([Cell(a, "namespace", True, "not-contained", False, "leaked")], state=state,
              now=200.0)
    doc = last.load(state)
    got = {(c["id"], c["tier"]): (c["status"], c["date"], c["failing"]) for c in doc["cells"]}
    assert got == {("env.dump", "namespace"): ("not-contained", 200.0, True),
                   ("escape.mknod-device", "namespace"): ("contained", 100.0, False)}
    p = last.path(state)
    assert os.stat(p).st_mode & 0o777 == 0o600
    with open(p) as f:
        raw = json.load(f)
    raw["cells"][0]["status"] = 7                   # a malformed cell is left out
    with open(p, "w") as f:
        json.dump(raw, f)
    assert len(last.load(state)["cells"]) == 1
    os.unlink(p)
    os.symlink("/etc/passwd", p)                    # a link there is not followed
    assert last.load(state) is None


def test_denials_series_counts_refusals_in_time_buckets(tmp_path):
    from corral.audit import series, store

    path = str(tmp_path / "audit" / "audit.db")
    conn = store.connect(path)
    now = 10_000.0
    for i, (started, evs) in enumerate([
            (now - 3500, [{"kind": "net", "decision": "deny", "host": "a.test", "port": 80},
                          {"kind": "net", "decision": "allow", "host": "b.test", "port": 80}]),
            (now - 100, [{"kind": "limit", "limit": "memory"},
                         {"kind": "unenforced", "rule": "x"}]),
            (now - 7200, [{"kind": "net", "decision": "deny", "host": "old.test"}])]):
        conn.execute("INSERT INTO runs (id, kind, started, actor, verdict) VALUES "
                     "(?, 'run', ?, 'token:t', ?)", (f"r-{i}", started, "oom" if i else "ok"))
        for j, e in enumerate(evs):
            conn.execute("INSERT INTO events VALUES (?,?,?,?)",
                         (f"r-{i}", j, e["kind"], json.dumps(e)))
    conn.close()
    got = series.denials_over_time(since=3600, buckets=4, path=path, now=now)
    assert got["kinds"] == {"net": [1, 0, 0, 0], "limit": [0, 0, 0, 1]}
    assert series.denials_over_time(since=3600, buckets=4, path=path, now=now,
                                    actor="token:other")["kinds"] == {}
    assert series.verdicts(since=3600, path=path, now=now) == {"ok": 1, "oom": 1}
    svg = chart(got)
    assert svg.count("<rect") == 2 and "style=" not in svg
