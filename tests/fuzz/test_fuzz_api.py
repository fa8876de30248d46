"""The HTTP API's request models (service/) under garbage: every operation of the OpenAPI
document, with bodies made of its own field names and arbitrary JSON values, bodies that
are not JSON, and junk in the query and path, answers with a JSON error body (422 for a
body its model refuses) and never 500. In-process, through the real ASGI app and
starlette's TestClient (httpx underneath); opening a sandbox is refused by the opener
(503), so no sandbox is started and a body that passes validation still gets an answer."""

from __future__ import annotations

import json
import shutil
import tempfile

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import json_values

_APP: dict = {}


def client():
    if not _APP:
        from starlette.testclient import TestClient

        from corral.errors import BackendUnavailable
        from corral.service.app import create_app

        def refuse(policy, **kw):
            raise BackendUnavailable("tests/fuzz opens no sandbox")

        state = tempfile.mkdtemp(prefix="corral-fuzz-api-")
        app = create_app(state, opener=refuse, sweep=False)
        token = app.state.tokens.create("fuzz")
        c = TestClient(app, raise_server_exceptions=False,
                       headers={"Authorization": f"Bearer {token}"})
        doc = c.get("/openapi.json").json()
        _APP.update(client=c, doc=doc, ops=_operations(doc), state=state)
    return _APP["client"], _APP["ops"]


def _resolve(doc: dict, schema: dict, depth: int = 0) -> dict:
    if "$ref" in schema and depth < 5:
        name = schema["$ref"].rsplit("/", 1)[1]
        return _resolve(doc, doc["components"]["schemas"][name], depth + 1)
    return schema


def _operations(doc: dict) -> list[tuple[str, str, list[str], list[str]]]:
    """(method, path, body field names, query names) of every JSON operation."""
    ops = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            fields: list[str] = []
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                fields = sorted(_resolve(doc, body["schema"]).get("properties", {}))
            query = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
            ops.append((method.upper(), path, fields, query))
    return ops


def check(resp) -> None:
    assert resp.status_code != 500 and resp.status_code < 600, (resp.status_code, resp.text)
    if resp.status_code >= 400 and resp.headers.get("content-type", "").startswith(
            "application/json"):
        err = resp.json()["error"]
        assert isinstance(err["message"], str) and err["kind"]
    if resp.status_code == 422:   # a model's refusal, or a tier that cannot (status_of)
        assert resp.json()["error"]["kind"] in ("invalid", "unsupported", "unavailable", "image")


@pytest.fixture(scope="module", autouse=True)
def _app():
    client()             # built before the first example: its time is not an example's
    yield
    _APP.pop("client").close()
    shutil.rmtree(_APP["state"], ignore_errors=True)     # its tokens and audit store
    _APP.clear()


SIDS = st.sampled_from(["sb-doesnotexist", "..", "%2e%2e", "a" * 300, "\u00e9", "0", "-1"])


@st.composite
def calls(draw):
    _, ops = client()
    method, path, fields, query = draw(st.sampled_from(ops))
    for name in ("sid", "cid", "pid", "run_id"):
        path = path.replace("{" + name + "}", draw(SIDS))
    body = draw(st.one_of(
        st.dictionaries(st.sampled_from(fields) if fields else st.text(max_size=6),
                        json_values(6), max_size=4),
        json_values(4),
        st.just({"policy": {"limits": {"timeout": 10**400}}}),
        st.just({"policy": {"network": {"mode": "allow", "allow": ["http://a\nb"]}}})))
    params = draw(st.dictionaries(st.sampled_from(query) if query else st.just("x"),
                                  st.sampled_from(["", "-1", "1e999", "nan", "a" * 100,
                                                   "true", "[]", "\u2028"]), max_size=2))
    raw = draw(st.one_of(st.none(), st.binary(max_size=40)))
    return method, path, body, params, raw


@given(calls())
@example(("POST", "/sandboxes", {"policy": {"limits": {"timeout": 10**400}}}, {}, None))
@example(("POST", "/explain", {"policy": {"limits": {"memory": "1e999G"}}}, {}, None))
@example(("POST", "/sandboxes", None, {}, b"[" * 3000))
def test_garbage_requests_get_a_json_error_never_500(call):
    c, _ = client()
    method, path, body, params, raw = call
    if raw is not None:
        resp = c.request(method, path, params=params, content=raw,
                         headers={"content-type": "application/json"})
    else:
        resp = c.request(method, path, params=params,
                         content=json.dumps(body).encode() if body is not None else None,
                         headers={"content-type": "application/json"})
    check(resp)


def test_every_operation_was_found():
    _, ops = client()
    assert len(ops) >= 30 and any(path == "/sandboxes" and method == "POST"
                                  for method, path, _, _ in ops)


