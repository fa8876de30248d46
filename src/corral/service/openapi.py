"""The OpenAPI document says what the service really answers: the bearer scheme, and for
every authenticated operation the error statuses it can give, each with the one error
body (`{"error": {"kind", "field", "message"}}`).

The routers list their own error statuses (common.errors); this adds, by rule, whatever a
router does not list, the bearer scheme, the Retry-After of a 429 and the
WWW-Authenticate of a 401, and makes FastAPI's own 422 the error body the service sends:

- every operation but /health and the document itself: 401 (no or bad token),
  429 (a rate or concurrency limit, with Retry-After), 422 (a request that does not match
  the schema, or a policy the tier cannot enforce);
- with a path parameter: 404 (no such sandbox, or another token's);
- with a request body or a query: 400 (a bad value, `field` names it);
- with a request body: 413 (over the body cap, refused before any handler);
- the operations that take a policy (POST /sandboxes, POST /explain): 403 (beyond the
  token's ceiling, `field` names the rule);
- those that run or reach into a sandbox: 409 (a code context or a sandbox in a state
  that cannot take the call) and 404 (a file that is not there).
"""

from __future__ import annotations

OPEN = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
WHY = {
    "400": "a bad value in the request; `field` names it",
    "401": "no token, or one unknown or revoked (WWW-Authenticate: Bearer)",
    "403": "beyond the token's ceiling; `field` names the rule",
    "404": "no such sandbox (or another token's), or no such file",
    "409": "the sandbox or code context cannot take this call in its state",
    "413": "the body is over the cap; nothing was done",
    "422": "the request does not match the schema, or the tier cannot enforce a rule",
    "429": "over the token's rate, max_concurrent or max_sandboxes; see Retry-After",
}
ERROR_SCHEMA = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["kind", "field", "message"],
        "additionalProperties": False,
        "properties": {"kind": {"type": "string"},
                       "field": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                       "message": {"type": "string"},
                       "step": {"type": "string"}}}}}
POLICY_OPS = {("post", "/sandboxes"), ("post", "/explain")}


def statuses(method: str, path: str, op: dict) -> list[str]:
    out = {"401", "422", "429"}
    params = op.get("parameters") or []
    if "{" in path:
        out |= {"404", "409"}
    if op.get("requestBody") is not None or any(p.get("in") == "query" for p in params):
        out.add("400")
    if op.get("requestBody") is not None:
        out.add("413")
    if (method, path) in POLICY_OPS:
        out |= {"400", "403"}
    return sorted(out)


def document(app) -> None:
    """Wrap app.openapi so the document it serves carries the errors and the scheme."""
    build = app.openapi

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        comps = doc.setdefault("components", {})
        schemas = comps.setdefault("schemas", {})
        if "ErrorBody" not in schemas:        # the routers' own error model, if they list one
            schemas["ErrorBody"] = ERROR_SCHEMA
        comps.setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer",
            "description": "a token from `corral token create`"}
        ref = {"$ref": "#/components/schemas/ErrorBody"}
        for path, ops in doc.get("paths", {}).items():
            if path in OPEN:
                continue
            for method, op in ops.items():
                if not isinstance(op, dict) or method not in (
                        "get", "put", "post", "delete", "patch"):
                    continue
                op.setdefault("security", [{"bearer": []}])
                responses = op.setdefault("responses", {})
                for code in statuses(method, path, op):
                    r = responses.setdefault(code, {"description": WHY[code]})
                    if code == "422" or "content" not in r:   # FastAPI's own 422 is not ours
                        r["content"] = {"application/json": {"schema": ref}}
                    if code == "429":
                        r["headers"] = {"Retry-After": {
                            "description": "whole seconds to wait", "schema": {
                                "type": "integer", "minimum": 1}}}
                    elif code == "401":
                        r["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi


def allowed(request) -> str:
    """The Allow header of a 405: the methods of every route on the request's path (the
    router names only the first route's, and GET and POST of one path are two routes)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in _routes(request.app.routes):
        got = getattr(route, "methods", None)
        if not got:
            continue
        for method in got:
            match, _ = route.matches({**request.scope, "method": method})
            if match == Match.FULL:
                methods.add(method)
    return ", ".join(sorted(methods))


def _routes(routes):
    """Every route, those of included routers too (FastAPI keeps an included router as
    one entry: its routes are the original router's)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from _routes(inner.routes)
        else:
            yield r
