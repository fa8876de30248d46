"""run_code: POST /sandboxes/{sid}/run_code."""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ..common import COMMON_ERRORS, Auth, Svc

router = APIRouter(tags=["code"], responses=COMMON_ERRORS)


class CodeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    code: str
    language: Literal["python", "javascript", "bash"] = "python"
    timeout: float | None = Field(None, gt=0, le=86400, description="seconds, at most "
                                  "86400; default 300")


@router.post("/sandboxes/{sid}/run_code")
def run_code(sid: str, body: CodeBody, token: Auth, svc: Svc):
    e = svc.entry(sid, token)
    with svc.slot(token), e.lock:
        t0 = time.monotonic()
        ex = e.sandbox.run_code(body.code, language=body.language, timeout=body.timeout)
    svc.metrics.run("error" if ex.error else "ok", time.monotonic() - t0)
    return ex.to_dict()
