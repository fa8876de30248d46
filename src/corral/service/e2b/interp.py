"""The code interpreter's HTTP face (E2b-Sandbox-Port: 49999), over the sandbox's own
persistent interpreters (runtime/session.py, `sb.run_code`): POST /execute streams NDJSON,
one {"type": ...} object a line (stdout, stderr, result, error, number_of_executions,
end_of_execution); /contexts makes, lists, restarts and removes code contexts. A cell
holds a thread of the server's own until it ends (its client gone or not): one of the
server's commands and cells running (config max_running), past which 429 names it."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ...errors import CorralError
from ..common import ApiError, status_of
from .connect import KEEPALIVE_S
from .state import strict_json

LANGUAGES = ("python", "javascript", "bash")
#: a cell's deadline here (the SDK's timeout is the client's: it disconnects)
CELL_TIMEOUT_S = 300.0


def _err(e: Exception) -> JSONResponse:
    if isinstance(e, CorralError):
        e = ApiError(status_of(e), e.kind, e.message, e.field)
    msg = e.message if not e.field or e.field in e.message else f"{e.field}: {e.message}"
    return JSONResponse({"code": e.status, "message": msg}, status_code=e.status,
                        headers=getattr(e, "headers", None) or None)


def _context(e, cid: str):
    for c in e.sandbox.list_contexts():
        if c.id == cid:
            return c
    raise ApiError(404, "not_found", f"no code context {cid[:64]!r} in this sandbox",
                   "context_id")


def _view(c) -> dict:
    return {"id": c.id, "language": c.language, "cwd": c.cwd}


async def execute(state, request: Request):
    e, _ = state.sandbox(request)
    body = strict_json(await request.body(), "body")
    code, cid, lang = body.get("code"), body.get("context_id"), body.get("language")
    if not isinstance(code, str):
        raise ApiError(400, "invalid", "code is a string", "code")
    if cid is not None and lang is not None:
        raise ApiError(400, "invalid", "give context_id or language, not both", "language")
    if lang is not None and lang not in LANGUAGES:
        raise ApiError(400, "invalid", f"language is one of {', '.join(LANGUAGES)}",
                       "language")
    ctx = _context(e, cid) if cid is not None else None
    env = body.get("env_vars") or None      # this cell's own (put back after it)
    if env is not None and (not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ApiError(400, "invalid", "env_vars is an object of strings", "env_vars")
    if env and (lang == "bash" or (ctx is not None and ctx.language == "bash")):
        raise ApiError(400, "unsupported", "env_vars: a bash cell takes no variables of "
                       "its own in corral; export them in the cell", "env_vars")
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    def put(item):
        loop.call_soon_threadsafe(q.put_nowait, item)

    def now():
        return time.time()

    from ..limits import Limited

    try:     # the cell's thread, held to its end: the server's max_running (REST's too)
        held = state.svc.running.hold()
    except Limited as err:
        raise ApiError(429, "rate", f"{err.field}: {err.message}", err.field,
                       {"Retry-After": str(err.retry_after)}) from None

    def run():
        started = time.time()
        try:
            with e.lock:
                ex = e.sandbox.run_code(
                    code, language=lang, context=ctx, timeout=CELL_TIMEOUT_S,
                    on_stdout=lambda t: put({"type": "stdout", "text": t,
                                             "timestamp": now()}),
                    on_stderr=lambda t: put({"type": "stderr", "text": t,
                                             "timestamp": now()}),
                    on_result=lambda r: put({"type": "result", **r.to_dict()}),
                    on_error=None, **({"env": env} if env else {}))
            _record_cell(e, code, lang or (ctx.language if ctx else "python"), ex, started)
            if ex.error is not None:
                put({"type": "error", **ex.error.to_dict()})
            if ex.execution_count is not None:
                put({"type": "number_of_executions",
                     "execution_count": ex.execution_count})
            put({"type": "end_of_execution"})
        except CorralError as err:
            put({"type": "error", "name": type(err).__name__, "value": err.message,
                 "traceback": ""})
            put({"type": "unexpected_end_of_execution"})
        except Exception as err:  # noqa: BLE001 - the stream says so
            put({"type": "error", "name": type(err).__name__, "value": str(err),
                 "traceback": ""})
            put({"type": "unexpected_end_of_execution"})
        finally:
            held.release()
        put(None)

    try:
        threading.Thread(target=run, daemon=True, name=f"e2b-cell-{e.id}").start()
    except BaseException:
        held.release()
        raise

    async def lines():
        while True:
            try:
                item = await asyncio.wait_for(q.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield json.dumps({"type": "keepalive"}) + "\n"
                continue
            if item is None:
                return
            yield json.dumps(item) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _record_cell(e, code: str, language: str, ex, started: float) -> None:
    """A cell as a run of the audit store (kind "cell", the sandbox's id and origin: the
    token that made it, face "e2b"), its code as the run's stdin (hashed in the receipt),
    its verdict "error" when it raised."""
    from ...audit import record as audit
    from ...result import Result, Usage

    if not audit.enabled():
        return
    sb = e.sandbox
    failed = ex.error is not None
    r = Result(verdict="error" if failed else "ok", exit_code=1 if failed else 0,
               signal=None, stdout="".join(ex.logs.stdout), stderr="".join(ex.logs.stderr),
               usage=Usage(wall_s=round(time.time() - started, 6)), isolation=sb.isolation)
    origin = getattr(sb, "_audit_origin", None) or audit.origin()
    audit.record_run(audit.new_id(), started, r, policy=sb.policy, plan=sb.plan,
                     argv=["run_code", language], isolation=sb.isolation, origin=origin,
                     sandbox=e.id, kind="cell", stdin=code.encode("utf-8", "surrogatepass"),
                     receipt=True)   # its hash: a lone surrogate JSON sent fails no cell


async def create_context(state, request):
    e, _ = state.sandbox(request)
    body = strict_json(await request.body(), "body")
    lang = body.get("language") or "python"
    cwd = body.get("cwd")
    if lang not in LANGUAGES:
        raise ApiError(400, "invalid", f"language is one of {', '.join(LANGUAGES)}",
                       "language")
    if cwd is not None and not isinstance(cwd, str):
        raise ApiError(400, "invalid", "cwd is a path", "cwd")
    c = await run_in_threadpool(e.sandbox.create_context, lang, cwd)
    return JSONResponse(_view(c))


async def list_contexts(state, request):
    e, _ = state.sandbox(request)
    return JSONResponse([_view(c) for c in e.sandbox.list_contexts()])


async def restart(state, request):
    e, _ = state.sandbox(request)
    c = _context(e, request.path_params["cid"])
    await run_in_threadpool(e.sandbox.restart_context, c)
    return Response(status_code=204)


async def remove(state, request):
    e, _ = state.sandbox(request)
    c = _context(e, request.path_params["cid"])
    await run_in_threadpool(e.sandbox.remove_context, c)
    return Response(status_code=204)


async def health(state, request):
    return JSONResponse("OK")


def app(state) -> Starlette:
    def r(path, fn, methods):
        async def call(request: Request):
            try:
                return await fn(state, request)
            except (ApiError, CorralError) as e:
                return _err(e)
        return Route(path, call, methods=methods)

    return Starlette(routes=[
        r("/execute", execute, ["POST"]), r("/contexts", create_context, ["POST"]),
        r("/contexts", list_contexts, ["GET"]),
        r("/contexts/{cid}/restart", restart, ["POST"]),
        r("/contexts/{cid}", remove, ["DELETE"]), r("/health", health, ["GET"]),
    ])
