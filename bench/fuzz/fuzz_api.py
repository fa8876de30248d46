"""atheris target: the HTTP API's request models (service/): any request to any operation
of the OpenAPI document (its path parameters, query and body from the input: JSON built
of the operation's own field names, or raw bytes) answers with a status below 500 and,
for an error, the JSON error body; never a 500. In-process through the real ASGI app and
starlette's TestClient (tests/fuzz/test_fuzz_api.py drives the same app with hypothesis);
opening a sandbox is refused by the opener, so none is started."""

import atexit
import json
import shutil
import tempfile

from _common import Input, run

TOP = tempfile.mkdtemp(prefix="corral-fuzz-api-")   # the app's state dir: tokens, audit
atexit.register(shutil.rmtree, TOP, True)
_APP: dict = {}
METHODS = ("get", "post", "put", "delete", "patch")
#: path parameters as the input picks them: made-up ids, traversal, junk, long
IDS = ("0123456789ab", "..", "%2e%2e", "a" * 300, "\u00e9", "0", "-1", "sb_0", "")
#: values the input builds JSON bodies and queries from, beside its own bytes
ATOMS = (None, True, False, 0, -1, 1e308, 10**40, "", "x", "/scratch/a", "..", "\u2028",
         [], {}, "1e999", "nan", 3.5)


def _app():
    if not _APP:
        from starlette.testclient import TestClient

        from corral.errors import BackendUnavailable
        from corral.service.app import create_app

        def refuse(policy, **kw):
            raise BackendUnavailable("bench/fuzz opens no sandbox")

        app = create_app(TOP, opener=refuse, sweep=False)
        token = app.state.tokens.create("fuzz")
        c = TestClient(app, raise_server_exceptions=False,
                       headers={"Authorization": f"Bearer {token}"})
        doc = c.get("/openapi.json").json()
        ops = []
        for path, item in sorted(doc["paths"].items()):
            for method, op in sorted(item.items()):
                if method not in METHODS:
                    continue
                schema = (op.get("requestBody", {}).get("content", {})
                          .get("application/json", {}).get("schema", {}))
                if "$ref" in schema:
                    schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
                fields = sorted(schema.get("properties", {}))
                query = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
                ops.append((method.upper(), path, fields, query))
        _APP.update(client=c, ops=ops)
    return _APP["client"], _APP["ops"]


def _value(inp: Input, depth: int = 0):
    b = inp.byte()
    if b < 96 or depth > 3:
        return ATOMS[b % len(ATOMS)]
    if b < 160:
        return inp.take(inp.byte() % 24).decode("utf-8", "replace")
    if b < 208:
        return [_value(inp, depth + 1) for _ in range(inp.byte() % 4)]
    return {inp.take(inp.byte() % 12).decode("utf-8", "replace"): _value(inp, depth + 1)
            for _ in range(inp.byte() % 4)}


def _body(inp: Input, fields: list[str]):
    """(json object or None, raw bytes or None)."""
    how = inp.byte() % 4
    if how == 0:
        return None, inp.take(inp.byte() * 4)
    if how == 1 or not fields:
        return _value(inp), None
    return {fields[inp.byte() % len(fields)]: _value(inp)
            for _ in range(1 + inp.byte() % 4)}, None


def check(resp) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if resp.status_code >= 400 and resp.headers.get("content-type", "").startswith(
            "application/json"):
        err = resp.json()["error"]
        assert isinstance(err["message"], str) and err["kind"], err
        if resp.status_code == 422:
            assert err["kind"] in ("invalid", "unsupported", "unavailable", "image"), err


def one_input(data: bytes) -> None:
    c, ops = _app()
    inp = Input(data)
    method, path, fields, query = ops[inp.byte() % len(ops)]
    for name in ("sid", "cid", "pid", "run_id"):
        path = path.replace("{" + name + "}", IDS[inp.byte() % len(IDS)])
    params = {}
    for _ in range(inp.byte() % 3):
        key = query[inp.byte() % len(query)] if query else "x"
        params[key] = inp.take(inp.byte() % 16).decode("utf-8", "replace")
    obj, raw = _body(inp, fields)
    content = raw if raw is not None else json.dumps(obj).encode()
    resp = c.request(method, path, params=params, content=content,
                     headers={"content-type": "application/json"})
    check(resp)


if __name__ == "__main__":
    run(one_input)
