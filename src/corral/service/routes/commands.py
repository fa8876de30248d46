"""Commands: POST /sandboxes/{sid}/exec, its Result or its output as NDJSON."""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Literal

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ...errors import CorralError
from ..common import ApiError, Auth, Svc

router = APIRouter(tags=["commands"])


class ExecBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    argv: list[str] | None = Field(None, min_length=1, description="the command and arguments")
    cmd: str | None = Field(None, description="a shell command line, run with /bin/sh -c")
    stdin: str | None = Field(None, description="text given to the command's stdin")
    timeout: float | None = Field(None, gt=0, description="seconds; default the policy's "
                                  "limits.timeout")


@router.post("/sandboxes/{sid}/exec", responses={200: {"content": {
    "application/x-ndjson": {}}, "description": "the Result; with stream=ndjson, one "
    "JSON object a line: {\"stdout\": text} and {\"stderr\": text} chunks as they "
    "come, then {\"result\": Result}"}})
def exec_(sid: str, body: ExecBody, token: Auth, svc: Svc,
          stream: Literal["none", "ndjson"] = "none"):
    if (body.argv is None) == (body.cmd is None):
        raise ApiError(400, "usage", "give argv (a list) or cmd (a shell line), one of "
                       "them", "argv")
    argv = body.argv if body.argv is not None else ["/bin/sh", "-c", body.cmd]
    e = svc.entry(sid, token)
    stdin = body.stdin.encode() if body.stdin is not None else None
    if stream == "ndjson":
        return _stream(svc, e, token, argv, stdin, body.timeout)
    with svc.slot(token), e.lock:
        t0 = time.monotonic()
        result = e.sandbox.exec(argv, stdin=stdin, timeout=body.timeout)
    svc.metrics.run(result.verdict, time.monotonic() - t0)
    return result.to_dict()


def _stream(svc, e, token, argv, stdin, timeout):
    """The command's output as NDJSON lines while it runs, then its Result."""
    from ...runtime.sandbox import TextChunks

    busy_slot = svc.slot(token)
    busy_slot.__enter__()       # 429 now, before the 200 and its stream begin
    q: queue.Queue = queue.Queue(maxsize=256)   # a slow reader slows the command's reads

    def run():
        try:
            with e.lock:
                t0 = time.monotonic()
                r = e.sandbox.exec(
                    argv, stdin=stdin, timeout=timeout,
                    on_stdout=TextChunks(lambda t: q.put({"stdout": t})),
                    on_stderr=TextChunks(lambda t: q.put({"stderr": t})))
            svc.metrics.run(r.verdict, time.monotonic() - t0)
            q.put({"result": r.to_dict()})
        except CorralError as err:
            q.put({"error": err.to_dict()})
        except Exception as err:   # noqa: BLE001 - the stream must end with a line
            q.put({"error": {"kind": "internal", "field": None, "message": str(err)}})
        finally:
            busy_slot.__exit__(None, None, None)
            q.put(None)

    threading.Thread(target=run, daemon=True, name=f"exec-{e.id}").start()

    def lines():
        while (item := q.get()) is not None:
            yield json.dumps(item) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
