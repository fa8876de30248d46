"""What the service's routes share: the JSON error, the bearer-token dependency, the
service's state (tokens, sandboxes, metrics, in-flight counts) as a dependency, and the
views of a sandbox and its policy. The routes live in routes/, one module a resource."""

from __future__ import annotations

import copy
import threading
from typing import Annotated

from fastapi import Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.requests import HTTPConnection

from ..errors import (
    BackendUnavailable,
    CorralError,
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
            422: "the body does not match the schema, or the tier cannot enforce the "
                 "policy", 429: "a token's limit (Retry-After)",
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
    if isinstance(e, (UnsupportedRule, BackendUnavailable)):
        return 422
    if isinstance(e, (ContextError, SandboxClosed)):
        return 409
    if getattr(e, "kind", None) == "review":      # runtime.changes.ReviewError
        return 409
    return 500


class Service:
    """The state one app holds: its token store, its sandboxes, its metrics and each
    token's operations in flight (for max_concurrent)."""

    def __init__(self, tokens, registry, metrics) -> None:
        self.tokens, self.registry, self.metrics = tokens, registry, metrics
        self.busy: dict[str, int] = {}
        self.busy_mu = threading.Lock()
        self.draining = False

    def entry(self, sid: str, token: Token):
        e = self.registry.get(token.name, sid)
        if e is None:
            raise ApiError(404, "not_found", f"no sandbox {sid!r}", "sandbox_id")
        return e

    def slot(self, token: Token) -> Busy:
        return Busy(self, token)


class Busy:
    """One operation of a token in flight; over its max_concurrent: 429."""

    def __init__(self, svc: Service, token: Token) -> None:
        self.svc, self.token = svc, token

    def __enter__(self):
        svc = self.svc
        with svc.busy_mu:
            n = svc.busy.get(self.token.name, 0)
            if self.token.max_concurrent is not None and n >= self.token.max_concurrent:
                raise ApiError(429, "rate", f"this token has {n} operations running, its "
                               f"max_concurrent", "max_concurrent", {"Retry-After": "1"})
            svc.busy[self.token.name] = n + 1
        return self

    def __exit__(self, *exc):
        with self.svc.busy_mu:
            self.svc.busy[self.token.name] -= 1


# The two dependencies are coroutines: FastAPI runs a plain function dependency in its
# thread pool, two thread hops a request for a few microseconds of work (the token file
# is looked at with one lstat when it has not changed: tokens.TokenStore.verify).
async def service(request: HTTPConnection) -> Service:
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
    t = request.app.state.service.tokens.verify(value.strip())
    if t is None:
        raise ApiError(401, "auth", "the token is not valid (unknown or revoked)",
                       "authorization", {"WWW-Authenticate": "Bearer"})
    return t


Auth = Annotated[Token, Depends(auth)]
Svc = Annotated[Service, Depends(service)]


def requested_policy(raw: dict, token: Token):
    return requested(raw, token.ceiling)


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
