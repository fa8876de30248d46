"""run_code and code contexts: POST /sandboxes/{sid}/run_code (its Execution, or NDJSON as
the cell runs), and /sandboxes/{sid}/contexts (create, list, restart, remove): the
in-process API (runtime/session.py, `sb.run_code`, `sb.create_context`) over HTTP.

Cells of the default context of a language run one at a time a sandbox (the entry's
lock); a cell in a context of its own holds only that context's lock, so a restart or
remove of it, or a cell of another context, is never held up behind it. A client that goes
away mid-cell does not stop the cell: it runs to its end or its timeout, and the context
keeps its state.

A cell holds a thread of the server's own until it ends (whether or not its client stays):
it is one of its token's operations in flight (max_concurrent) and one of the server's
commands and cells running (config max_running, every token's and face's together), both
given back at its end; past either, 429 with Retry-After naming the bound.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from ...errors import CorralError, UsageError
from ..commands import Threads
from ..common import COMMON_ERRORS, ApiError, Auth, Svc, own_thread

router = APIRouter(tags=["code"], responses=COMMON_ERRORS)

#: how long the cell's thread waits for a slow client before looking whether it is gone
PUT_WAKE_S = 1.0

Language = Literal["python", "javascript", "bash"]

#: the threads a cell without a stream runs in (kept for the next cell once one is done)
CELLS = Threads("corral-cell")


class CodeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    code: str
    language: Language | None = Field(None, description="default python; with a context, "
                                      "its own (give one or the other)")
    context: str | None = Field(None, max_length=64, description="a context's id "
                                "(POST .../contexts); default the language's own")
    timeout: float | None = Field(None, gt=0, le=86400, description="seconds, at most "
                                  "86400; default the policy's limits.timeout")
    env: dict[str, str] | None = Field(None, max_length=256, description=(
        "variables set for this cell only (put back after it; python and javascript, "
        "not bash): at most 256, names 1-256 chars without '=' or NUL"))


class ContextBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    language: Language = "python"
    cwd: str | None = Field(None, description="where its interpreter starts (inside); "
                            "default the sandbox's working directory")
    engine: Literal["auto", "ipykernel", "runner"] | None = Field(None, description=(
        "python's interpreter: auto (the default: an IPython kernel where the image's "
        "python3 has ipykernel, else corral's runner), ipykernel (refused where there is "
        "none) or runner"))


def execution_view(ex) -> dict:
    """An Execution as JSON: its to_dict() and the bash cell's exit code and what was cut."""
    d = ex.to_dict()
    d.update(exit_code=ex.exit_code, stdout_truncated=ex.stdout_truncated,
             stderr_truncated=ex.stderr_truncated, results_truncated=ex.results_truncated)
    return d


def _context(e, cid: str):
    """The context `cid` of the sandbox (404, kind "context", if it has none of that id)."""
    for c in e.sandbox.list_contexts():
        if c.id == cid:
            return c
    raise ApiError(404, "context", f"no code context {cid[:64]!r} in sandbox {e.id} "
                   "(removed, or never made here): POST .../contexts makes one", "context")


def _view(c) -> dict:
    return {"id": c.id, "language": c.language, "cwd": c.cwd}


def _run(svc, e, body: CodeBody, **callbacks):
    try:
        return _run_cell(svc, e, body, **callbacks)
    except ValueError as x:    # the cell itself: over the frame, a NUL or lone surrogate
        raise UsageError(str(x).removeprefix("code: "), field="code") from None


def _run_cell(svc, e, body: CodeBody, **callbacks):
    t0 = time.monotonic()
    if body.env:
        callbacks["env"] = body.env
    if body.context is None:
        with e.lock:             # the default contexts: made on first use, one cell a time
            ex = e.sandbox.run_code(body.code, language=body.language,
                                    timeout=body.timeout, **callbacks)
    else:
        ctx = _context(e, body.context)
        ex = e.sandbox.run_code(body.code, language=body.language, context=ctx,
                                timeout=body.timeout, **callbacks)
    svc.metrics.run("error" if ex.error else "ok", time.monotonic() - t0)
    return ex


@router.post("/sandboxes/{sid}/run_code", responses={200: {
    "content": {"application/x-ndjson": {}}, "description": "the Execution: results, "
    "logs, error, execution_count, exit_code, *_truncated; with stream=ndjson one JSON "
    "object a line: {\"type\": \"stdout\"|\"stderr\", \"data\": text}, {\"type\": "
    "\"result\", \"data\": result}, {\"type\": \"error\", \"data\": {name, value, "
    "traceback}} as they come, then {\"type\": \"end\", \"data\": Execution} (or "
    "{\"type\": \"failed\", \"data\": {kind, field, message}})"}})
async def run_code(sid: str, body: CodeBody, token: Auth, svc: Svc, request: Request,
                   stream: Literal["none", "ndjson"] = "none"):
    e = svc.entry(sid, token)
    if body.context is not None:
        _context(e, body.context)          # 404 now, before a stream's 200
    slot = svc.work(token)     # max_concurrent, the server's max_running: held to its end
    slot.__enter__()                       # 429 now, before a stream's 200
    if stream == "none":
        try:   # a thread of its own, as a stream's cell: the cell runs as long as it likes
            ex = await own_thread(asyncio.get_running_loop(), lambda: _run(svc, e, body),
                                  "corral-cell", CELLS)
        finally:
            slot.__exit__(None, None, None)
        return execution_view(ex)
    gone, started = threading.Event(), threading.Event()

    def after() -> None:       # the response's end, however it ended
        gone.set()
        if not started.is_set():     # cancelled before it began: the cell never ran
            started.set()
            slot.__exit__(None, None, None)

    return StreamingResponse(_cell_lines(svc, e, body, slot, gone, started),
                             media_type="application/x-ndjson",
                             headers={"X-Accel-Buffering": "no"},
                             background=BackgroundTask(after))


async def _cell_lines(svc, e, body: CodeBody, slot, gone, started):
    """The cell's output as it comes. The cell runs in a thread of its own, which waits
    for a slow client (bounded queue: the interpreter waits, nothing piles up here) and,
    once the client is gone, drops what is left and lets the cell end."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue(maxsize=64)

    def put(kind: str, data) -> None:
        if gone.is_set():
            return
        try:
            fut = asyncio.run_coroutine_threadsafe(q.put((kind, data)), loop)
        except RuntimeError:        # the loop is gone: the service ends
            gone.set()
            return
        while not gone.is_set():
            try:
                fut.result(PUT_WAKE_S)
                return
            except TimeoutError:
                continue
        fut.cancel()

    def cell() -> None:
        try:
            ex = _run(svc, e, body,
                      on_stdout=lambda t: put("stdout", t),
                      on_stderr=lambda t: put("stderr", t),
                      on_result=lambda r: put("result", r.to_dict()),
                      on_error=lambda x: put("error", x.to_dict()))
            put("end", execution_view(ex))
        except CorralError as x:
            put("failed", {"kind": x.kind, "field": x.field, "message": x.message})
        except Exception as x:  # noqa: BLE001 - said to the client, the stream ends
            put("failed", {"kind": "internal", "field": None, "message": str(x)[:500]})
        finally:
            slot.__exit__(None, None, None)

    if started.is_set():
        return
    started.set()
    try:
        threading.Thread(target=cell, daemon=True, name=f"corral-cell-{e.id}").start()
        while True:
            kind, data = await q.get()
            yield json.dumps({"type": kind, "data": data}) + "\n"
            if kind in ("end", "failed"):
                return
    finally:
        gone.set()


# -- contexts ------------------------------------------------------------------------------
@router.post("/sandboxes/{sid}/contexts", status_code=201)
def create_context(sid: str, body: ContextBody, token: Auth, svc: Svc):
    """A new interpreter of its own: its variables, imports and working directory persist
    between its cells, apart from every other context's."""
    from ...runtime.session import ContextError

    e = svc.entry(sid, token)
    try:
        with e.lock:   # the sandbox's code session is made on first use, by one call at once
            c = e.sandbox.create_context(body.language, body.cwd, **(
                {"engine": body.engine} if body.engine is not None else {}))
    except ContextError as x:      # a bad cwd, or an interpreter that cannot start there
        raise ApiError(400, x.kind, x.message, x.field) from None
    e.events.add("context.created", _view(c))
    return JSONResponse(_view(c), status_code=201)


@router.get("/sandboxes/{sid}/contexts")
def list_contexts(sid: str, token: Auth, svc: Svc):
    """Every context, the languages' default ones (made by run_code without a context)
    included."""
    e = svc.entry(sid, token)
    return {"contexts": [_view(c) for c in e.sandbox.list_contexts()]}


@router.post("/sandboxes/{sid}/contexts/{cid}/restart")
def restart_context(sid: str, cid: str, token: Auth, svc: Svc):
    """A fresh interpreter for the context (same id, language, cwd); its state is gone. A
    cell running in it is killed (its Execution's error: ContextDied)."""
    e = svc.entry(sid, token)
    c = _context(e, cid)
    e.sandbox.restart_context(c)
    return _view(c)


@router.delete("/sandboxes/{sid}/contexts/{cid}")
def remove_context(sid: str, cid: str, token: Auth, svc: Svc):
    e = svc.entry(sid, token)
    e.sandbox.remove_context(_context(e, cid))
    e.events.add("context.removed", {"id": cid})
    return {"removed": cid}
