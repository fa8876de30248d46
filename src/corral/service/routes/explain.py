"""Explain: the three questions for a sandbox's policy or a requested one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ..common import COMMON_ERRORS, Auth, Svc, errors, requested_policy

router = APIRouter(tags=["explain"], responses=COMMON_ERRORS)


class ExplainBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    policy: dict[str, Any] = Field(default_factory=dict)


@router.get("/sandboxes/{sid}/explain")
def explain_sandbox(sid: str, token: Auth, svc: Svc):
    from ...runtime.explain import explain

    return explain(svc.entry(sid, token).policy)


@router.post("/explain", responses=errors(403))
def explain_policy(body: ExplainBody, token: Auth, svc: Svc):
    from ...runtime.explain import explain

    return explain(requested_policy(body.policy, token, svc))
