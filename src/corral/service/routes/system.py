"""GET /health (no token needed) and GET /metrics (a valid token, as every route but
/health and the OpenAPI document: a Prometheus scrape sends it as a bearer token)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from ..common import Auth, Svc

router = APIRouter(tags=["service"])


@router.get("/health")
async def health(svc: Svc):
    # async: a sync route runs in a worker thread, two thread hops for a count (and a
    # probe that waits for a free worker while the pool is busy)
    return {"ok": True, "sandboxes": svc.registry.count(), "draining": svc.draining}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics_text(token: Auth, svc: Svc):
    """The service's counters in Prometheus text format (service-wide totals: every
    token that may scrape sees the same numbers, which carry no sandbox or token names)."""
    return PlainTextResponse(svc.metrics.text(svc.registry.count(), svc.terminals.held,
                                              svc.running.held, svc.quota.making),
                             media_type="text/plain; version=0.0.4")
