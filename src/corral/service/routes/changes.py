"""Changes of a sandbox whose workspace is in review mode: list, diff, apply, discard.

Who may apply: applying copies what the sandbox wrote onto the host's workspace, the one
step review mode exists to keep with a person. A token may apply only if it was created
with `corral token create --apply-changes` (its record says apply_changes: true); every
other token (an agent's) lists, diffs and discards (a discard loses only the sandbox's own
writes) and gets 403 naming `changes.apply` for an apply.
"""

from __future__ import annotations

import base64
import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ..common import COMMON_ERRORS, ApiError, Auth, Svc, errors, local_name, wire_name, wire_names

log = logging.getLogger("corral.serve")
router = APIRouter(tags=["changes"], responses=COMMON_ERRORS)


class ApplyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    paths: list[str] | None = Field(None, description="apply the changes at or below these "
                                    "workspace-relative paths (default: all)")
    exact: bool = Field(False, description="only these paths (with the directories they "
                        "need), not what is below them")


@router.get("/sandboxes/{sid}/changes")
def list_changes(sid: str, token: Auth, svc: Svc):
    """What the sandbox changed in its workspace (the host's is untouched): each change's
    path, kind (added, modified, deleted), type, modes, sizes, the diff of a text file,
    and a conflict or refusal that apply would leave it for."""
    e = svc.entry(sid, token)
    return {"changes": [_change(c) for c in e.sandbox.changes()]}


#: a Change as JSON, its path and link targets in their wire form (common.wire_name: a
#: byte that is not UTF-8 written quoted, as the files routes write it)
_change = wire_names


def _paths(paths: list[str] | None, field: str) -> list[str] | None:
    return None if paths is None else [local_name(p, f"{field}.{i}")
                                       for i, p in enumerate(paths)]


@router.get("/sandboxes/{sid}/changes/diff")
def diff(sid: str, token: Auth, svc: Svc, path: Annotated[list[str] | None, Query()] = None,
         encoding: Literal["utf-8", "base64"] = "utf-8"):
    """The changes as one git-style patch (`git apply` takes it), and those it leaves out
    with the reason (refusals, conflicts, directories, files over 64 MiB)."""
    e = svc.entry(sid, token)
    patch, omitted = e.sandbox.changes_patch(_paths(path, "path"))
    text = (base64.b64encode(patch).decode() if encoding == "base64"
            else patch.decode("utf-8", errors="replace"))
    return {"patch": text, "encoding": encoding,
            "omitted": [{"path": wire_name(p), "why": why} for p, why in omitted]}


@router.post("/sandboxes/{sid}/changes/apply", responses=errors(403))
def apply(sid: str, body: ApplyBody, token: Auth, svc: Svc):
    """Copy the changes onto the host's workspace, except conflicts and refusals. Only a
    token created with --apply-changes may (403 otherwise)."""
    e = svc.entry(sid, token)
    if not token.apply_changes:
        raise ApiError(403, "ceiling", "this token may not apply changes to the host's "
                       "workspace: a person reviews them (corral token create "
                       "--apply-changes makes a token that may)", "changes.apply")
    applied = e.sandbox.apply_changes(_paths(body.paths, "paths"), exact=body.exact)
    log.info("sandbox %s: token %s applied %d change(s)", e.id, token.name,
             len(applied.applied))
    e.events.add("changes.applied", {"applied": len(applied.applied),
                                     "conflicts": len(applied.conflicts),
                                     "refused": len(applied.refused)})
    return {"applied": [wire_name(p) for p in applied.applied],
            "conflicts": [[wire_name(p), why] for p, why in applied.conflicts],
            "refused": [[wire_name(p), why] for p, why in applied.refused]}


@router.post("/sandboxes/{sid}/changes/discard")
def discard(sid: str, token: Auth, svc: Svc):
    """Forget every change: the workspace looks inside as the host's is (no command may
    be running)."""
    e = svc.entry(sid, token)
    e.sandbox.discard_changes()
    return {"discarded": True}
