"""GET /health and GET /metrics: no token needed."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from ..common import Svc

router = APIRouter(tags=["service"])


@router.get("/health")
def health(svc: Svc):
    return {"ok": True, "sandboxes": svc.registry.count(), "draining": svc.draining}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics_text(svc: Svc):
    return PlainTextResponse(svc.metrics.text(svc.registry.count()),
                             media_type="text/plain; version=0.0.4")
