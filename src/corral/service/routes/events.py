"""GET /sandboxes/{sid}/events: the sandbox's events as Server-Sent Events (service/events.py
says which). Each is `id: N`, `event: KIND`, `data: JSON`; `since=N` (or Last-Event-ID)
starts after what a client has seen. The stream ends with `event: end` once the sandbox
has ended; a comment line keeps an idle stream open through proxies."""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..common import COMMON_ERRORS, ApiError, Auth, Svc

router = APIRouter(tags=["events"], responses=COMMON_ERRORS)

#: how often an open stream looks for the proxy's and the sandbox's new events (they are
#: lists the live sandbox appends to, with no wake-up of their own)
PULL_S = 0.5
KEEPALIVE_S = 15.0


@router.get("/sandboxes/{sid}/events", responses={200: {"content": {
    "text/event-stream": {}}, "description": "Server-Sent Events"}})
async def events(sid: str, token: Auth, svc: Svc, request: Request, since: int | None = None,
                 follow: bool = True):
    """follow=false: the events so far, then `end`."""
    e = svc.entry(sid, token)
    last = request.headers.get("last-event-id")
    if since is None and last is not None:
        try:
            since = int(last) + 1
        except ValueError:
            raise ApiError(400, "invalid", "Last-Event-ID is a number", "last-event-id") \
                from None
    if since is not None and since < 0:
        raise ApiError(400, "invalid", "since is an event number from 0", "since")
    return StreamingResponse(_stream(svc, e, since or 0, follow), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store",
                                      "X-Accel-Buffering": "no"})


async def _stream(svc, e, seq: int, follow: bool = True):
    log, sb = e.events, e.sandbox
    quiet = time.monotonic()
    while True:
        log.pull(sb)
        ended = (not follow or log.closed or svc.draining
                 or getattr(sb, "state", "running") == "ended")
        for n, kind, data in log.since(seq):
            seq = n + 1
            quiet = time.monotonic()
            yield f"id: {n}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
        if ended:
            log.pull(sb)
            for n, kind, data in log.since(seq):
                seq = n + 1
                yield f"id: {n}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
            yield f"event: end\ndata: {json.dumps({'dropped': log.dropped})}\n\n"
            return
        if time.monotonic() - quiet >= KEEPALIVE_S:
            quiet = time.monotonic()
            yield ": keepalive\n\n"
        await log.notifier.wait(PULL_S, lambda: bool(log.since(seq)) or log.closed)
