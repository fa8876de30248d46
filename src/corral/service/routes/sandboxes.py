"""Sandboxes: create (within the token's ceiling), list, get, kill."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ...errors import CorralError
from ..ceiling import Exceeds
from ..common import (
    COMMON_ERRORS,
    ApiError,
    Auth,
    Svc,
    errors,
    requested_policy,
    view,
)
from ..tokens import lifetime, within_lifetime

log = logging.getLogger("corral.serve")
router = APIRouter(tags=["sandboxes"], responses=COMMON_ERRORS)


class Strict(BaseModel):
    # strict: `true` is not a timeout of 1 s, "5" is not a number (schemathesis found it)
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateBody(Strict):
    policy: dict[str, Any] = Field(default_factory=dict, description=(
        "a policy in the TOML layout as JSON (docs/policy.md); fields left out take the "
        "token's ceiling's isolation and limits. A secret names only hosts and ttl: its "
        "source is the server's (the ceiling's), never sent"))
    timeout: float = Field(300, gt=0, le=7 * 86400, description=(
        "seconds the sandbox lives (then every process of it is killed); "
        "POST .../timeout changes it"))
    metadata: dict[str, str] | None = Field(None, description=(
        "at most 64 str keys (1-128 chars) to str values (at most 1024): yours, shown "
        "back in get and list"))
    user_account: bool = Field(False, description=(
        "an unprivileged account beside the sandbox's root (uid 1000 inside, a host uid of "
        "its own, HOME /home/user), for commands run with user \"user\"; the namespace "
        "tier only, with corral serve as root (422 elsewhere)"))


class TimeoutBody(Strict):
    timeout: float = Field(..., gt=0, le=7 * 86400, description="seconds from now")


@router.post("/sandboxes", status_code=201, responses=errors(403, 503))
def create(body: CreateBody, token: Auth, svc: Svc):
    if svc.draining:
        raise ApiError(503, "draining", "the service is shutting down: no new sandboxes",
                       None, {"Retry-After": "5"})
    reg = svc.registry
    if "timeout" not in body.model_fields_set:     # the default, not asked for
        body.timeout = within_lifetime(token, body.timeout)
    try:
        lifetime(token, body.timeout)
        policy = requested_policy(body.policy, token, svc)
    except (Exceeds, CorralError) as e:   # refused before it started: recorded
        from ...audit.record import record_refused

        record_refused([], getattr(e, "kind", "ceiling"), e.message, e.field,
                       who=("service", f"token:{token.name}"))
        raise
    with svc.reserve(token), svc.slot(token):   # max_sandboxes, max_concurrent: 429
        e = reg.create(token.owner, policy, timeout=body.timeout, metadata=body.metadata,
                       user_account=body.user_account)
    with svc.metrics.mu:
        svc.metrics.created += 1
    log.info("sandbox %s created for token %s (%s)", e.id, token.name, e.sandbox.isolation)
    return view(e)


@router.get("/sandboxes")
def list_(token: Auth, svc: Svc):
    return {"sandboxes": [view(e) for e in svc.registry.list(token.owner)]}


@router.get("/sandboxes/{sid}")
def get(sid: str, token: Auth, svc: Svc):
    return view(svc.entry(sid, token))


@router.post("/sandboxes/{sid}/timeout")
def set_timeout(sid: str, body: TimeoutBody, token: Auth, svc: Svc):
    """End the sandbox `timeout` seconds from now (longer or shorter than before)."""
    e = svc.entry(sid, token)
    lifetime(token, body.timeout, e.created)
    e.sandbox.set_timeout(body.timeout)
    return view(e)


@router.delete("/sandboxes/{sid}")
def kill(sid: str, token: Auth, svc: Svc):
    if not svc.registry.remove(token.owner, sid):
        raise ApiError(404, "not_found", f"no sandbox {sid!r}", "sandbox_id")
    log.info("sandbox %s killed", sid)
    return {"killed": sid}
