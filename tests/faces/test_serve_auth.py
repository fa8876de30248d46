"""Every route of `corral serve` but /health, /metrics, /openapi.json and /docs answers 401
without a valid bearer token (issue 17), walked over the whole OpenAPI document so that a
route added later without its token check fails here; the terminal's WebSocket too. In
process, through the real ASGI app (starlette's TestClient); the opener refuses to open a
sandbox, so nothing is started."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from corral.errors import BackendUnavailable

OPEN = {("GET", "/health"), ("GET", "/metrics")}
FILL = {"sid": "0123456789ab", "cid": "c1", "pid": "7", "run_id": "r1"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from corral.service.app import create_app

    def refuse(policy, **kw):
        raise BackendUnavailable("this test opens no sandbox")

    a = create_app(str(tmp_path_factory.mktemp("auth")), opener=refuse, sweep=False)
    good = a.state.tokens.create("ok")
    gone = a.state.tokens.create("gone")
    a.state.tokens.revoke("gone")
    return a, good, gone


def _operations(doc: dict) -> list[tuple[str, str]]:
    out = []
    for path, item in doc["paths"].items():
        for method in item:
            if method in ("get", "post", "put", "delete", "patch"):
                for k, v in FILL.items():
                    path = path.replace("{" + k + "}", v)
                out.append((method.upper(), path))
    return out


def test_every_route_but_the_open_ones_is_401_without_a_valid_token(app):
    a, good, gone = app
    with TestClient(a, raise_server_exceptions=False) as c:
        for path in ("/health", "/openapi.json", "/docs"):
            assert c.get(path).status_code == 200, path
        ops = _operations(c.get("/openapi.json").json())
        assert len(ops) >= 35
        assert OPEN <= set(ops)
        for method, path in ops:
            if (method, path) in OPEN:
                continue
            for auth in (None, "Bearer corral_" + "x" * 43, "Basic b2s6b2s=",
                         f"Bearer {gone}", f"bearer{good}"):
                headers = {"Authorization": auth} if auth else {}
                r = c.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (method, path, auth, r.status_code, r.text)
                err = r.json()["error"]
                assert err["kind"] == "auth" and err["field"] == "authorization", err
                assert r.headers["www-authenticate"] == "Bearer"
            # and the right token gets past the check (whatever the route answers then)
            r = c.request(method, path, headers={"Authorization": f"Bearer {good}"}, json={})
            assert r.status_code != 401, (method, path, r.text)


def _refusal(c, headers) -> tuple[int, str | None]:
    """(HTTP status, error kind) of a refused WebSocket handshake: the JSON error the app
    sends where the server can (uvicorn, the TestClient), or the close code it uses else."""
    from starlette.testclient import WebSocketDenialResponse

    try:
        with c.websocket_connect(f"/sandboxes/{FILL['sid']}/pty", headers=headers) as ws:
            ws.receive_bytes()
    except WebSocketDenialResponse as r:
        return r.status_code, r.json()["error"]["kind"]
    except WebSocketDisconnect as e:
        return e.code - 4000, None
    raise AssertionError("the handshake was accepted")


def test_the_terminal_websocket_is_refused_without_a_valid_token(app):
    a, good, gone = app
    with TestClient(a, raise_server_exceptions=False) as c:
        for headers in ({}, {"Authorization": "Bearer corral_nope"},
                        {"Authorization": f"Bearer {gone}"}):
            assert _refusal(c, headers) == (401, "auth"), headers
        # a valid token gets as far as the sandbox: none of that id
        assert _refusal(c, {"Authorization": f"Bearer {good}"}) == (404, "not_found")
