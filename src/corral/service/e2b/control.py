"""E2B's control plane (REST, JSON; X-API-Key: a corral token): create (POST /v2/sandboxes
and the older POST /sandboxes), connect, list, get, set_timeout, kill.

A template is a corral policy request: "base" (Sandbox's default) and
"code-interpreter-v1" (the code interpreter's) are the catalogue images `python` and
`datascience` (docs/images.md; built with `corral image build NAME`) on the token's default
policy (its ceiling's isolation and limits; network closed); a templates file
(CORRAL_E2B_TEMPLATES) may map them, and any other name, to another image and policy. E2B's network fields map onto
corral's network rules within the token's ceiling (beyond it: 403 naming the rule); a field
corral cannot honour is a 400 naming it, never silently dropped. Errors are E2B's
{"code", "message"} (the message names the field)."""

from __future__ import annotations

import datetime
import json
import logging
import urllib.parse

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import CorralError
from ..ceiling import Exceeds
from ..common import ApiError, requested_policy, status_of
from ..limits import Limited
from ..tokens import lifetime, within_lifetime
from .state import ENVD_VERSION, Face, strict_json

log = logging.getLogger("corral.serve")

#: E2B template name -> the policy request it is (the token's ceiling fills the rest)
TEMPLATES: dict[str, dict] = {"base": {"image": "python"},
                              "code-interpreter-v1": {"image": "datascience"}}


def load_templates(path: str | None) -> dict[str, dict]:
    """The templates: the two defaults, then each table of the TOML file `path` (the
    CORRAL_E2B_TEMPLATES variable of corral serve), a template name to a policy request
    in the TOML layout (docs/policy.md), checked now (a bad file stops the service at
    start, naming the template) and against each token's ceiling at every create."""
    out = {k: dict(v) for k, v in TEMPLATES.items()}
    if not path:
        return out
    import os

    from ...errors import PolicyError
    from ...policy.load import policy_from_dict, read_toml

    if not os.path.isfile(path):
        raise PolicyError(f"{path!r} is not a file: point the variable at a TOML file of "
                          "templates (docs/e2b.md)", field="CORRAL_E2B_TEMPLATES")
    data = read_toml(path)
    for name, table in data.items():
        if not isinstance(table, dict) or not 0 < len(name) <= 128:
            raise PolicyError(f"{path}: [{name[:64]}] is a table: a template's policy",
                              field=f"templates.{name[:64]}")
        checked = _stand_in_sources(table, name, path)
        try:
            policy_from_dict(checked, allow_literal=False)
        except PolicyError as e:
            raise PolicyError(f"{path}: template {name!r}: {e.message}",
                              field=f"templates.{name}") from None
        out[name] = table
    return out


def _stand_in_sources(table: dict, name: str, path: str) -> dict:
    """The template as the start's check sees it: each of its secrets given a stand-in
    source. A template grants a secret as a request does, by name and hosts (and ttl,
    plain_http) alone: its value comes, at each create, from the server config's
    [secrets] through the calling token's ceiling, which must grant it (403 naming
    secrets.NAME otherwise). A source or value in the template stops the start."""
    from ...errors import PolicyError
    from ..config import PLACEHOLDER_SOURCE

    secrets = table.get("secrets")
    if not isinstance(secrets, dict):
        return table
    out = {}
    for sname, t in secrets.items():
        if isinstance(t, dict) and {"from", "value"} & set(t):
            raise PolicyError(f"{path}: template {name!r}: secret {sname}: a template "
                              "names a secret and its hosts only; its source is the "
                              "server config's [secrets] (docs/e2b.md)",
                              field=f"templates.{name}.secrets.{sname}")
        out[sname] = {**t, "from": PLACEHOLDER_SOURCE} if isinstance(t, dict) else t
    return {**table, "secrets": out}
#: create's fields corral takes; the rest are refused unless left at their "off" value
KNOWN = {"templateID", "timeout", "metadata", "envVars", "allow_internet_access", "network",
         "autoPause", "autoPauseMemory", "autoResume", "mcp", "iam", "volumeMounts",
         "secure"}
MAX_TIMEOUT_S = 7 * 86400
MAX_ENVS = 256


def _err(e: ApiError) -> JSONResponse:
    msg = e.message if e.field is None or e.field in e.message else f"{e.field}: {e.message}"
    return JSONResponse({"code": e.status, "message": msg}, status_code=e.status,
                        headers=e.headers)


def app(state) -> Starlette:
    async def on_api(request, e: ApiError):
        return _err(e)

    async def on_exceeds(request, e: Exceeds):
        return _err(ApiError(403, "ceiling", e.message, e.field))

    async def on_corral(request, e: CorralError):
        return _err(ApiError(status_of(e), e.kind, e.message, e.field))

    async def on_limited(request, e: Limited):
        # E2B's own answer past a sandbox quota: 429 {"code", "message"} (the SDK raises
        # RateLimitException), with Retry-After as the native face's. Past max_sandboxes
        # also Should-Retry: false, E2B's header for it: a place frees only when some
        # sandbox ends, so the SDK raises at once (as corral's own SDK does) instead of
        # retrying 3 times Retry-After apart (max_concurrent's 1 s: it may retry)
        headers = {"Retry-After": str(e.retry_after)}
        if e.field == "max_sandboxes":
            headers["Should-Retry"] = "false"
        return _err(ApiError(429, "rate", e.message, e.field, headers))

    def r(path, fn, methods):
        async def call(request: Request):
            return await fn(state, request)
        return Route(path, call, methods=methods)

    return Starlette(routes=[
        r("/v2/sandboxes", create, ["POST"]), r("/sandboxes", create, ["POST"]),
        r("/v2/sandboxes", list_, ["GET"]), r("/sandboxes", list_, ["GET"]),
        r("/sandboxes/{sid}", get, ["GET"]), r("/sandboxes/{sid}", kill, ["DELETE"]),
        r("/sandboxes/{sid}/timeout", set_timeout, ["POST"]),
        r("/sandboxes/{sid}/connect", connect, ["POST"]),
        r("/v2/sandboxes/{sid}/connect", connect, ["POST"]),
        r("/health", health, ["GET"]),
    ], exception_handlers={ApiError: on_api, Exceeds: on_exceeds, CorralError: on_corral,
                          Limited: on_limited})


async def health(state, request):
    return Response(status_code=204)


def network_policy(body: dict) -> dict:
    """E2B's allow_internet_access and network fields as a corral [network] table ({}:
    corral's default, closed)."""
    net: dict = {}
    aia = body.get("allow_internet_access")
    if aia is not None and not isinstance(aia, bool):
        raise ApiError(400, "invalid", "allow_internet_access is true or false",
                       "allow_internet_access")
    if aia is True:
        raise ApiError(400, "unsupported", "allow_internet_access=true: corral has no "
                       "open internet (it lets out HTTP and HTTPS to named hosts only, "
                       "through its egress proxy); name them in network.allow_out, within "
                       "this token's ceiling", "allow_internet_access")
    network = body.get("network")
    if network is None:
        return net
    if not isinstance(network, dict):
        raise ApiError(400, "invalid", "network is an object", "network")
    for k in network:
        if k not in ("allowOut", "denyOut"):
            raise ApiError(400, "unsupported", f"network.{k}: corral cannot honour it "
                           "(it takes network.allow_out and network.deny_out: host names, "
                           "IPs or CIDRs, HTTP and HTTPS through its egress proxy)",
                           f"network.{k}")
    for k, rule in (("allowOut", "allow"), ("denyOut", "deny")):
        v = network.get(k)
        if v is None:
            continue
        if not isinstance(v, list) or not all(isinstance(x, str) and 0 < len(x) <= 255
                                              for x in v) or len(v) > 256:
            raise ApiError(400, "invalid", f"network.{k} is a list of at most 256 hosts, "
                           "IPs or CIDRs", f"network.{k}")
        if v:
            net[rule] = list(v)
    if net.get("allow"):
        if any(x in ("0.0.0.0/0", "::/0") for x in net["allow"]):
            raise ApiError(400, "unsupported", "network.allow_out 0.0.0.0/0: corral has "
                           "no open internet; name the hosts", "network.allow_out")
        net["mode"] = "allow"
    return net


def _check_off(body: dict) -> None:
    for k in body:
        if k not in KNOWN:
            raise ApiError(400, "unsupported", f"{k}: corral does not know this field of "
                           "a sandbox; leave it out", k)
    for k in ("mcp", "iam", "volumeMounts"):
        if body.get(k) not in (None, {}, []):
            raise ApiError(400, "unsupported", f"{k}: corral does not offer it (no MCP "
                           "gateway, workload identity or volumes inside an E2B sandbox); "
                           "leave it out", k)
    for k in ("autoPause", "autoResume", "autoPauseMemory"):
        if body.get(k) not in (None, False):
            raise ApiError(400, "unsupported", f"{k}: corral cannot pause a sandbox; at "
                           "its timeout it is killed", k)


#: Idempotency-Key: the key's form (as the SDK checks it), and how many keys are kept
KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
MAX_KEYS = 4096


async def create(state, request: Request):
    """POST /v2/sandboxes. With an Idempotency-Key, the same key from the same token
    answers the sandbox it made while that runs (a retried create makes no second one):
    creates with one (token, key) wait for each other, those of other keys do not."""
    token = state.api_token(request.headers)
    key = request.headers.get("idempotency-key")
    if key is None:
        return await _create(state, request, token)
    if not 0 < len(key) <= 255 or not set(key) <= KEY_CHARS:
        raise ApiError(400, "invalid", "Idempotency-Key is 1 to 255 lowercase letters, "
                       "digits or hyphens", "Idempotency-Key")
    async with state.idem_lock(token.owner, key):
        sid = state.idem.get((token.owner, key))
        face = state.face(sid) if sid else None
        if face is not None and state.svc.registry.get(token.owner, sid) is not None:
            return JSONResponse(_sandbox(face), status_code=201)
        r = await _create(state, request, token)
        state.idem[(token.owner, key)] = json.loads(r.body)["sandboxID"]
        while len(state.idem) > MAX_KEYS:
            state.idem.pop(next(iter(state.idem)))
        return r


async def _create(state, request: Request, token):
    svc = state.svc
    body = strict_json(await request.body(), "body")
    _check_off(body)
    template = body.get("templateID", "base")
    if not isinstance(template, str) or template not in state.templates:
        raise ApiError(400, "invalid", f"no template {str(template)[:64]!r}: this server "
                       f"maps {', '.join(sorted(state.templates))} (CORRAL_E2B_TEMPLATES, "
                       "docs/e2b.md)", "templateID")
    timeout = body.get("timeout", 300)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not \
            0 < timeout <= MAX_TIMEOUT_S:
        raise ApiError(400, "invalid", f"timeout is whole seconds from 1 to {MAX_TIMEOUT_S}",
                       "timeout")
    metadata = body.get("metadata") or {}
    envs = body.get("envVars") or {}
    for name, d in (("metadata", metadata), ("envVars", envs)):
        if not isinstance(d, dict) or len(d) > MAX_ENVS or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
            raise ApiError(400, "invalid", f"{name} is an object of at most {MAX_ENVS} "
                           "string values", name)
    from ...policy.load import merge

    raw = dict(state.templates[template])
    if envs:           # the sandbox's own environment (commands and code contexts alike)
        raw = merge(raw, {"env": {"set": {**(raw.get("env") or {}).get("set", {}),
                                          **envs}}})
    net = network_policy(body)
    if net:
        raw = merge(raw, {"network": net})
    if svc.draining:
        raise ApiError(503, "draining", "the service is shutting down: no new sandboxes",
                       None, {"Retry-After": "5"})
    reg = svc.registry
    if "timeout" not in body:      # the default, not asked for: cut to the bound
        timeout = max(1, int(within_lifetime(token, timeout)))
    lifetime(token, timeout)
    policy = requested_policy(raw, token, svc)

    from .state import _account_for

    account = _account_for(policy)

    def make():
        with svc.reserve(token), svc.slot(token):   # max_sandboxes, max_concurrent: 429
            return reg.create(token.owner, policy, timeout=float(timeout),
                              metadata=metadata or None, user_account=account, face="e2b")

    try:
        e = await run_in_threadpool(make)
    except CorralError as err:
        if err.kind != "image":
            raise
        # the template's image is not in this server's store: the operator's to build
        raise ApiError(422, "image", f"template {template!r}: {err.message}",
                       "templateID") from None
    face = Face(e.id, token.owner, template, {}, account=account, tier=policy.isolation)
    state.add(face)
    with svc.metrics.mu:
        svc.metrics.created += 1
    e.events.add("e2b.created", {"template": template})
    log.info("sandbox %s created for token %s over E2B (template %s)", e.id, token.name,
             template)
    return JSONResponse(_sandbox(face), status_code=201)


def _sandbox(face) -> dict:
    return {"templateID": face.template, "sandboxID": face.sid, "clientID": "corral",
            "envdVersion": ENVD_VERSION, "envdAccessToken": face.access_token,
            "trafficAccessToken": face.access_token, "alias": face.template, "domain": None}


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()


def _detail(e, face) -> dict:
    info = e.sandbox.get_info()
    d = _sandbox(face)
    d.pop("envdAccessToken")
    d.pop("trafficAccessToken")
    d.update(startedAt=_iso(e.created), endAt=_iso(info.ends), cpuCount=1, memoryMB=0,
             diskSizeMB=0, state="running", metadata=dict(info.metadata or {}))
    return d


def _mine(state, request, sid: str):
    token = state.api_token(request.headers)
    face = state.face(sid)
    e = state.svc.registry.get(token.owner, sid) if face is not None else None
    if e is None or face.owner != token.owner:
        raise ApiError(404, "not_found", f"sandbox {sid[:64]!r} not found", "sandboxID")
    return token, e, face


async def get(state, request):
    _, e, face = _mine(state, request, request.path_params["sid"])
    d = _detail(e, face)
    d["envdAccessToken"] = face.access_token
    return JSONResponse(d)


async def list_(state, request):
    token = state.api_token(request.headers)
    q = request.query_params
    want_meta = dict(urllib.parse.parse_qsl(q.get("metadata") or ""))
    states = set((q.get("state") or "running").split(","))
    out = []
    if "running" in states:
        for e in state.svc.registry.list(token.owner):
            face = state.face(e.id)
            if face is None:
                continue               # a native sandbox: not E2B's to list
            d = _detail(e, face)
            if all(d["metadata"].get(k) == v for k, v in want_meta.items()):
                out.append(d)
    return JSONResponse(out)


async def kill(state, request):
    token = state.api_token(request.headers)
    sid = request.path_params["sid"]
    face = state.face(sid)
    if face is None or face.owner != token.owner:
        raise ApiError(404, "not_found", f"sandbox {sid[:64]!r} not found", "sandboxID")
    ok = await run_in_threadpool(state.svc.registry.remove, token.owner, sid)
    state.drop(sid)
    if not ok:
        raise ApiError(404, "not_found", f"sandbox {sid[:64]!r} not found", "sandboxID")
    return Response(status_code=204)


def _timeout_of(body: dict) -> int:
    t = body.get("timeout")
    if not isinstance(t, int) or isinstance(t, bool) or not 0 < t <= MAX_TIMEOUT_S:
        raise ApiError(400, "invalid", f"timeout is whole seconds from 1 to {MAX_TIMEOUT_S}",
                       "timeout")
    return t


async def set_timeout(state, request):
    token, e, _ = _mine(state, request, request.path_params["sid"])
    t = _timeout_of(strict_json(await request.body(), "body"))
    lifetime(token, t, e.created)
    e.sandbox.set_timeout(float(t))
    return Response(status_code=204)


async def connect(state, request):
    """Sandbox.connect: a running sandbox's handle again; its timeout only grows."""
    token, e, face = _mine(state, request, request.path_params["sid"])
    body = strict_json(await request.body(), "body")
    if body.get("timeout") is not None:
        import time

        t = _timeout_of(body)
        if e.sandbox.get_info().ends < time.time() + t:
            lifetime(token, t, e.created)
            e.sandbox.set_timeout(float(t))
    return JSONResponse(_sandbox(face), status_code=200)
