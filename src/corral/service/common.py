"""What the service's routes share: the JSON error, the bearer-token dependency, the
service's state (tokens, sandboxes, metrics, in-flight counts) as a dependency, and the
views of a sandbox and its policy. The routes live in routes/, one module a resource."""

from __future__ import annotations

import copy
from typing import Annotated

from fastapi import Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.requests import HTTPConnection

from ..errors import (
    BackendUnavailable,
    CorralError,
    ImageError,
    PolicyError,
    SandboxClosed,
    UnsupportedRule,
    UsageError,
)
from .ceiling import requested
from .tokens import Token


class ErrorDetail(BaseModel):
    kind: str
    field: str | None = None
    message: str


class ErrorBody(BaseModel):
    """Every error's body."""

    error: ErrorDetail


def errors(*statuses: int) -> dict:
    """OpenAPI `responses` for these error statuses, each the JSON error body."""
    what = {400: "a bad request (field names it)", 401: "no valid bearer token",
            403: "beyond the token's ceiling (field names the rule)",
            404: "no such sandbox, command or file (or another token's)",
            409: "the sandbox ended, a command still running, a closed stdin, a review "
                 "that cannot be read", 413: "the body is over the cap",
            422: "the body does not match the schema, the tier cannot enforce the "
                 "policy, or the policy names an image this server does not have", 429: "a token's limit (Retry-After)",
            503: "the service is shutting down"}
    return {s: {"model": ErrorBody, "description": what[s]} for s in statuses}


#: what every route behind a token may answer
COMMON_ERRORS = errors(400, 401, 404, 409, 413, 422, 429)


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, field: str | None = None,
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.field = status, kind, message, field
        self.headers = headers or {}


def error(status: int, kind: str, message: str, field: str | None = None,
          headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "field": field, "message": message}},
                        status_code=status, headers=headers)


def status_of(e: CorralError) -> int:
    """The HTTP status of one of corral's errors."""
    from ..runtime.files import FileNotFound, FilesError
    from ..runtime.session import ContextError

    if isinstance(e, FileNotFound):
        return 404
    if isinstance(e, (PolicyError, UsageError, FilesError)):
        return 400
    if isinstance(e, (UnsupportedRule, BackendUnavailable, ImageError)):
        return 422       # ImageError: an image this server does not have (or cannot use)
    if isinstance(e, (ContextError, SandboxClosed)):
        return 409
    if getattr(e, "kind", None) == "review":      # runtime.changes.ReviewError
        return 409
    return 500


class Service:
    """The state one app holds: its token store, its sandboxes, its metrics, its config
    (config.Config), and each token's limits at work (limits.py): its request bucket,
    its operations in flight (max_concurrent) and its creates under way (max_sandboxes),
    shared by the REST routes and /mcp."""

    def __init__(self, tokens, registry, metrics, config=None) -> None:
        from .config import Config
        from .limits import Concurrency, Quota, RateLimiter

        self.tokens, self.registry, self.metrics = tokens, registry, metrics
        self.config = config if config is not None else Config()
        self.rates = RateLimiter()
        self.busy = Concurrency()
        self.quota = Quota()
        self.draining = False

    def entry(self, sid: str, token: Token):
        e = self.registry.get(token.owner, sid)
        if e is None:
            raise ApiError(404, "not_found", f"no sandbox {sid!r}", "sandbox_id")
        return e

    def slot(self, token: Token):
        """One operation of a token in flight; over its max_concurrent: Limited (429)."""
        return self.busy.slot(token.owner, token.max_concurrent)

    def reserve(self, token: Token):
        """A place for one more sandbox of the token while it is made; past its
        max_sandboxes (those live and those being made): Limited (429)."""
        return self.quota.reserve(token.owner, token.max_sandboxes,
                                  lambda: self.registry.count(token.owner))


async def service(request: HTTPConnection) -> Service:
    # async (as auth): FastAPI runs a sync dependency in a worker thread, a hop of its
    # own per request (milliseconds on a loaded machine) for a dict lookup
    return request.app.state.service


async def auth(request: HTTPConnection) -> Token:
    """The live token a request carries (401 otherwise): the state dir's token file is
    looked at each time, so a revocation counts from the next request."""
    h = request.headers.get("authorization", "")
    scheme, _, value = h.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise ApiError(401, "auth", "missing bearer token: send Authorization: Bearer "
                       "TOKEN (corral token create)", "authorization",
                       {"WWW-Authenticate": "Bearer"})
    svc = request.app.state.service
    t = svc.tokens.verify(value.strip())
    if t is None:
        raise ApiError(401, "auth", "the token is not valid (unknown or revoked)",
                       "authorization", {"WWW-Authenticate": "Bearer"})
    svc.rates.admit(t.name, t.rate, t.burst)        # Limited: 429 (limits.py)
    return t


Auth = Annotated[Token, Depends(auth)]
Svc = Annotated[Service, Depends(service)]


def requested_policy(raw: dict, token: Token, svc: Service):
    """The policy `raw` asks for within the token's ceiling, the ceiling's secrets given
    their sources from the server config (config.with_sources)."""
    from .config import with_sources

    return requested(raw, with_sources(token.ceiling, svc.config.secrets))


def policy_view(policy) -> dict:
    """The effective policy as JSON, secrets by name and hosts only (never a source)."""
    import tomllib

    from ..policy.dump import dump_toml

    data = tomllib.loads(dump_toml(policy))
    for name, table in (data.get("secrets") or {}).items():
        data["secrets"][name] = {k: v for k, v in table.items() if k in ("hosts", "ttl",
                                                                          "plain_http")}
    return data


def view(e) -> dict:
    """A sandbox as the API shows it: id, isolation, created, policy, and what the live
    sandbox's get_info() says (state, ends, usage, metadata, ended_by)."""
    pv = getattr(e, "policy_json", None)
    if pv is None:          # the policy is fixed for the sandbox's life: made once
        pv = policy_view(e.policy)
        try:
            e.policy_json = pv
        except AttributeError:
            pass
    d = {"id": e.id, "isolation": e.sandbox.isolation, "created": e.created,
         "policy": copy.deepcopy(pv)}
    get_info = getattr(e.sandbox, "get_info", None)
    if get_info is not None:
        info = get_info().to_dict()
        info.pop("id", None)
        d.update(info)
    return d
