"""Files of a sandbox: read, write, list."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from ..common import COMMON_ERRORS, ApiError, Auth, Svc

router = APIRouter(tags=["files"], responses=COMMON_ERRORS)


class WriteBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"


@router.get("/sandboxes/{sid}/files")
def read(sid: str, path: str, token: Auth, svc: Svc,
         encoding: Literal["utf-8", "base64"] = "utf-8"):
    e = svc.entry(sid, token)
    with e.files_lock:
        data = e.sandbox.files.read(path, format="bytes")
    if encoding == "base64":
        return {"path": path, "encoding": "base64",
                "content": base64.b64encode(data).decode()}
    return {"path": path, "encoding": "utf-8",
            "content": data.decode("utf-8", errors="replace")}


@router.put("/sandboxes/{sid}/files")
def write(sid: str, body: WriteBody, token: Auth, svc: Svc):
    e = svc.entry(sid, token)
    if body.encoding == "base64":
        try:
            data = base64.b64decode(body.content, validate=True)
        except ValueError:
            raise ApiError(400, "invalid", "content is not base64", "content") from None
    else:
        data = body.content.encode()
    with e.files_lock:
        info = e.sandbox.files.write(body.path, data)
    return info.to_dict()


@router.get("/sandboxes/{sid}/files/list")
def list_files(sid: str, token: Auth, svc: Svc, path: str = ".",
               depth: Annotated[int, Query(ge=1, le=16, description="levels to descend, "
                                           "1 to 16")] = 1):
    e = svc.entry(sid, token)
    with e.files_lock:
        entries = e.sandbox.files.list(path, depth=depth)
    return {"entries": [x.to_dict() for x in entries]}
