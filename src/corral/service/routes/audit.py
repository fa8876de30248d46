"""The audit store per token (docs/audit.md): a token sees only the runs it asked for; an
admin token (corral token create --admin) sees every run.

    GET /runs?since=1h&verdict=oom&tier=gvisor&limit=100   newest first
    GET /runs/{id}                                         one run
    GET /runs/{id}/events                                  its events, in order
    GET /runs/{id}/receipt                                 its signed receipt
    GET /denials?since=1h&kind=net                         refusals grouped, with the rule
                                                           that would allow each
"""

from __future__ import annotations

from fastapi import APIRouter

from ...audit import query
from ...errors import UsageError
from ..common import COMMON_ERRORS, ApiError, Auth, errors

router = APIRouter(tags=["audit"], responses=COMMON_ERRORS)


def _since(since: str | None) -> float | None:
    try:
        return None if since is None else query.parse_age(since, "since")
    except UsageError as e:
        raise ApiError(400, "invalid", str(e), "since") from None


def _actor(token) -> str | None:
    """Whose runs the token sees: its own ("token:NAME"), or everyone's (None) if admin."""
    return None if token.admin else f"token:{token.name}"


@router.get("/runs", responses=errors(400))
def runs(token: Auth, since: str | None = None, verdict: str | None = None,
         tier: str | None = None, limit: int = 100):
    if not 0 < limit <= 10000:
        raise ApiError(400, "invalid", "limit must be 1 to 10000", "limit")
    return {"runs": query.runs(since=_since(since), verdict=verdict, tier=tier,
                               actor=_actor(token), limit=limit)}


def _get(run_id: str, token):
    got = query.get_run(run_id, actor=_actor(token))
    if got is None:
        raise ApiError(404, "not_found", f"no run {run_id!r}", "run_id")
    return got


@router.get("/runs/{run_id}", responses=errors(404))
def run(run_id: str, token: Auth):
    r, policy, _ = _get(run_id, token)
    return {**r, "policy": policy}


@router.get("/runs/{run_id}/events", responses=errors(404))
def run_events(run_id: str, token: Auth):
    evs = query.events(run_id, actor=_actor(token))
    if evs is None:
        raise ApiError(404, "not_found", f"no run {run_id!r}", "run_id")
    return {"events": evs}


@router.get("/runs/{run_id}/receipt", responses=errors(404))
def run_receipt(run_id: str, token: Auth):
    _, _, receipt = _get(run_id, token)
    if receipt is None:
        raise ApiError(404, "not_found", f"run {run_id!r} has no receipt", "run_id")
    return receipt


@router.get("/denials", responses=errors(400))
def denials(token: Auth, since: str | None = None, kind: str | None = None):
    if kind not in (None, "net", "secret", "limit", "refused"):
        raise ApiError(400, "invalid", "kind is one of net, secret, limit, refused", "kind")
    return {"denials": query.denials(since=_since(since), kind=kind, actor=_actor(token))}
