"""E2B's Idempotency-Key on create (POST /v2/sandboxes): a create held up holds up only
the creates of its own (token, key), never those of other keys or other tokens; the same
key, sent again meanwhile, answers the same sandbox once it is made; no lock is left
behind. The real app under uvicorn on 127.0.0.1, in this process (its opener makes real
live sandboxes, and holds the one create whose metadata asks it to until the test lets
it go: the one slow create, on cue)."""

import threading
from types import SimpleNamespace

import httpx
import pytest
from conftest import tier_unavailable
from servefix import free_port, make_token, until

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


@pytest.fixture
def server(tmp_path, monkeypatch):
    import uvicorn

    from corral.service.app import create_app
    from corral.service.e2b import Dispatch
    from corral.service.registry import open_sandbox

    (tmp_path / "templates.toml").write_text("[base]\n")
    monkeypatch.setenv("CORRAL_E2B_TEMPLATES", str(tmp_path / "templates.toml"))
    state = str(tmp_path / "state")
    s = SimpleNamespace(tokens={n: make_token(state, n) for n in ("a", "b")},
                        waiting=threading.Event(), go=threading.Event())

    def opener(policy, *, timeout, metadata=None, **kw):
        if (metadata or {}).get("hold"):
            s.waiting.set()
            s.go.wait(120)
        return open_sandbox(policy, timeout=timeout, metadata=metadata, **kw)

    app = create_app(state, opener=opener, sweep=False)
    inner = app
    while not isinstance(inner, Dispatch):
        inner = inner.app
    s.e2b = inner.state
    port = free_port()
    s.url = f"http://127.0.0.1:{port}"
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                        log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    until(lambda: srv.started, "the server is up")
    yield s
    s.go.set()
    srv.should_exit = True
    th.join(60)


def _create(s, token: str, key: str, hold: bool = False) -> httpx.Response:
    body = {"templateID": "base", "timeout": 120, "metadata": {"hold": "1"} if hold else {}}
    return httpx.post(f"{s.url}/v2/sandboxes", json=body, timeout=60,
                      headers={"X-API-Key": s.tokens[token], "Idempotency-Key": key})


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_a_slow_create_holds_up_only_its_own_key(server):
    s = server
    slow, slow_out = _in_thread(lambda: _create(s, "a", "key-1", hold=True))
    until(s.waiting.is_set, "the slow create is under way")
    again, again_out = _in_thread(lambda: _create(s, "a", "key-1"))   # waits for it ...
    try:
        # ... while other keys, of this token and of another, are made meanwhile
        other = _create(s, "a", "key-2")
        elsewhere = _create(s, "b", "key-1")
        assert other.status_code == 201, other.text
        assert elsewhere.status_code == 201, elsewhere.text
        assert slow.is_alive() and again.is_alive()
    finally:
        s.go.set()
    slow.join(120)
    again.join(120)
    assert slow_out[0].status_code == 201, slow_out[0].text
    sid = slow_out[0].json()["sandboxID"]
    assert again_out[0].status_code == 201, again_out[0].text
    assert again_out[0].json()["sandboxID"] == sid                   # the same sandbox
    assert len({sid, other.json()["sandboxID"], elsewhere.json()["sandboxID"]}) == 3
    assert _create(s, "a", "key-2").json()["sandboxID"] == other.json()["sandboxID"]
    assert s.e2b._idem_locks == {}            # no key's lock outlives its creates
