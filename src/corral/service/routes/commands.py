"""Commands: run one (foreground: its Result, or its output as NDJSON while it runs;
background: a handle at once), list them, write to a background command's stdin, kill
one, wait for one, stream a background command's output.

A foreground command's request is its life: when the client goes away before the Result
(a dropped connection, a cancelled stream), the command is killed with every process it
started. A background command runs on, whoever listens.

Either holds a thread of the server's own while it runs, so each is one of the server's
commands and cells running (config max_running, every token's and face's together; past
it 429 with Retry-After, field max_running) until it ends, is killed or its sandbox ends;
a foreground one is also one of its token's operations in flight (max_concurrent).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..common import COMMON_ERRORS, ApiError, Auth, Svc

router = APIRouter(tags=["commands"], responses=COMMON_ERRORS)

#: how long one wait for a change (output, the end, a disconnect) lasts at most
WAKE_S = 15.0
#: the longest `wait?timeout=` (seconds)
MAX_WAIT_S = 3600.0


class ExecBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    argv: list[str] | None = Field(None, min_length=1, description="the command and arguments")
    cmd: str | None = Field(None, description="a shell command line, run with /bin/sh -c")
    stdin: str | None = Field(None, description="text given to the command's stdin (UTF-8; "
                              "see stdin_encoding)")
    stdin_encoding: Literal["utf-8", "base64"] = "utf-8"
    env: dict[str, str] | None = Field(None, description="variables added to the "
                                       "sandbox's environment for this command")
    cwd: str | None = Field(None, description="the directory it starts in (inside)")
    timeout: float | None = Field(None, gt=0, le=86400, description=(
        "seconds, at most 86400; default the policy's limits.timeout (foreground), none "
        "(background: it runs until it exits or the sandbox ends)"))
    background: bool = Field(False, description="start it and answer at once with its pid "
                             "(201); its output: GET .../commands/{pid}/output")
    user: Literal["root", "user"] | None = Field(None, description=(
        "who runs it: root (the sandbox's own, the default) or user (the unprivileged "
        "account of a sandbox created with user_account; 400 without one)"))
    output_encoding: Literal["utf-8", "base64"] = Field("utf-8", description=(
        "how its output chunks are streamed (stream=ndjson, GET .../output): utf-8 text "
        "(decoded as it comes, invalid bytes as U+FFFD), or base64 of the bytes exactly "
        "as the command wrote them (the Result's stdout and stderr are text either way)"))


class StdinBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    data: str = Field("", description="what to write")
    encoding: Literal["utf-8", "base64"] = "utf-8"
    close: bool = Field(False, description="close its stdin after data (end of file)")
    timeout: float | None = Field(None, gt=0, le=MAX_WAIT_S, description=(
        "seconds to wait at most while the command's stdin pipe is full (then 409, kind "
        "\"timeout\", part of data perhaps written); default: as long as it takes"))


class SignalBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    signal: int = Field(..., ge=1, le=64, description="the signal's number (15: SIGTERM, "
                        "2: SIGINT, ...), sent to the command's own process only")


def _bytes(text: str | None, encoding: str, field: str) -> bytes | None:
    if text is None:
        return None
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            raise ApiError(400, "invalid", f"{field} is not base64", field) from None
    try:       # a surrogate escape (U+DC80-U+DCFF: JSON may send one) is its byte again
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ApiError(400, "invalid", f"{field} holds a lone surrogate that stands for no "
                       f"byte: send text, or {field}_encoding base64", field) from None


def _cmd(svc, e, pid: int):
    c = e.commands.get(pid)
    if c is None:
        raise ApiError(404, "not_found", f"no command {pid} in sandbox {e.id} (ended "
                       "commands are kept for their Result, the last 16)", "pid")
    return c


async def _gone(request: Request) -> None:
    """Returns when the client has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@router.post("/sandboxes/{sid}/exec", status_code=200, responses={
    200: {"content": {"application/x-ndjson": {}}, "description": "the Result; with "
          "stream=ndjson, one JSON object a line: {\"stdout\": text} and {\"stderr\": "
          "text} chunks as they come (base64 with output_encoding), then {\"result\": "
          "Result}"},
    201: {"description": "background: the command's handle {pid, cmd, background, "
          "started, running}"}})
async def exec_(sid: str, body: ExecBody, token: Auth, svc: Svc, request: Request,
                stream: Literal["none", "ndjson"] = "none"):
    if (body.argv is None) == (body.cmd is None):
        raise ApiError(400, "usage", "give argv (a list) or cmd (a shell line), one of "
                       "them", "argv")
    argv = body.argv if body.argv is not None else ["/bin/sh", "-c", body.cmd]
    e = svc.entry(sid, token)
    stdin = _bytes(body.stdin, body.stdin_encoding, "stdin")
    if body.background:
        held = svc.running.hold()    # a thread waits for it till its end: max_running
        try:
            c = await run_in_threadpool(
                e.commands.start, argv, env=body.env, cwd=body.cwd, stdin=stdin,
                timeout=body.timeout, background=True, on_end=ended(svc, held),
                raw=body.output_encoding == "base64", user=body.user)
        except BaseException:
            held.release()
            raise
        return JSONResponse(c.info(), status_code=201)
    slot = svc.work(token)
    slot.__enter__()             # 429 now, before a stream's 200
    c = None
    gone = asyncio.ensure_future(_gone(request))
    try:
        # a foreground command starts in a thread of its own (service/commands.py): no
        # hop here; this coroutine is woken when it runs and when it has ended
        c = e.commands.start(argv, env=body.env, cwd=body.cwd, stdin=stdin,
                             timeout=body.timeout, on_end=lambda c: _count(svc, c),
                             raw=body.output_encoding == "base64", user=body.user)
        until = c.started.is_set if stream == "ndjson" else c.done.is_set
        while not until():
            waiter = asyncio.ensure_future(c.notifier.wait(WAKE_S, until))
            await asyncio.wait({gone, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if gone.done() and not until():
                raise ApiError(499, "disconnected", "the client went away; the command "
                               "was killed")
        if c.error is not None:
            raise c.error        # the sandbox closed, its setup failed: the error's status
    except BaseException:
        gone.cancel()
        slot.__exit__(None, None, None)
        if c is not None and not c.done.is_set():
            c.cancel()        # the client went away, or the drain's deadline came
        raise
    gone.cancel()
    if stream == "ndjson":
        return StreamingResponse(_lines(request, c, slot, foreground=True,
                                        encoding=body.output_encoding),
                                 media_type="application/x-ndjson")
    slot.__exit__(None, None, None)
    return JSONResponse(c.result.to_dict())


def ended(svc, held):
    """A background command's on_end: counted in the metrics, its place among the server's
    commands and cells running (max_running) given back."""
    def on_end(c) -> None:
        try:
            _count(svc, c)
        finally:
            held.release()
    return on_end


def _count(svc, c) -> None:
    r = c.result
    svc.metrics.run(r.verdict, r.usage.wall_s or 0.0, r.events)


class _Encode:
    """A stream's chunks as its client asked for them: text (a raw command's bytes
    decoded incrementally per stream, so a sequence split between chunks comes whole),
    or base64 of the bytes (a text-kept command's: its text as UTF-8)."""

    def __init__(self, encoding: str) -> None:
        self.base64 = encoding == "base64"
        self._dec: dict = {}

    def __call__(self, stream: str, data) -> str:
        if self.base64:
            return base64.b64encode(data if isinstance(data, bytes)
                                    else data.encode("utf-8", "replace")).decode()
        if isinstance(data, str):
            return data
        dec = self._dec.get(stream)
        if dec is None:
            import codecs

            dec = self._dec[stream] = codecs.getincrementaldecoder("utf-8")("replace")
        return dec.decode(data)

    def rest(self) -> list[tuple[str, str]]:
        """What the decoders held back (a sequence the output left unfinished)."""
        return [(s, t) for s, d in self._dec.items() if (t := d.decode(b"", final=True))]


async def _lines(request: Request, c, slot=None, *, foreground: bool, start: int = 0,
                 svc=None, encoding: str = "utf-8"):
    """NDJSON: the command's output from chunk `start` on as it comes (`encoding`: see
    ExecBody.output_encoding), then its Result. A foreground command is killed if the
    stream ends before its Result (the client went away); a background one is left
    running."""
    i, finished = start, False
    enc = _Encode(encoding)
    gone = asyncio.ensure_future(_gone(request)) if foreground else None
    try:
        while True:
            for stream, data in c.chunks_since(i):
                i += 1
                text = enc(stream, data)
                if text:
                    yield json.dumps({stream: text}) + "\n"
            if c.done.is_set() and not c.chunks_since(i):
                for stream, text in enc.rest():
                    yield json.dumps({stream: text}) + "\n"
                yield json.dumps({"result": c.result.to_dict()}) + "\n"
                finished = True
                return
            waiter = asyncio.ensure_future(c.notifier.wait(
                WAKE_S, lambda: c.done.is_set() or bool(c.chunks_since(i))))
            await asyncio.wait({waiter} | ({gone} if gone else set()),
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if gone is not None and gone.done():
                return
            if svc is not None and svc.draining:
                yield json.dumps({"error": {"kind": "draining", "field": None, "message":
                                            "the service is shutting down"}}) + "\n"
                return
    finally:
        if gone is not None:
            gone.cancel()
        if foreground and not finished and not c.done.is_set():
            c.cancel()
        if slot is not None:
            slot.__exit__(None, None, None)


@router.get("/sandboxes/{sid}/commands")
def list_commands(sid: str, token: Auth, svc: Svc):
    """The commands running now (and processes finished ones left behind: detached)."""
    e = svc.entry(sid, token)
    out = []
    for info in e.sandbox.commands.list():
        d = info.to_dict()
        c = e.commands.get(info.pid)
        if c is not None and not info.detached:
            d["background"] = c.background
        d.pop("pids", None)          # host pids: not the client's business
        out.append(d)
    return {"commands": out}


@router.get("/sandboxes/{sid}/commands/{pid}")
def get_command(sid: str, pid: int, token: Auth, svc: Svc):
    c = _cmd(svc, svc.entry(sid, token), pid)
    d = c.info()
    if c.result is not None:
        d["result"] = c.result.to_dict()
    return d


@router.post("/sandboxes/{sid}/commands/{pid}/stdin")
async def send_stdin(sid: str, pid: int, body: StdinBody, token: Auth, svc: Svc):
    """The write waits in a thread of its own, never one of the server's shared workers
    (the command decides whether it reads); one write at a time a command: a second while
    one waits is a 409 (kind "busy")."""
    from ..common import WRITERS, own_thread

    c = _cmd(svc, svc.entry(sid, token), pid)
    if not c.background:
        raise ApiError(409, "usage", "only a background command's stdin takes writes", "pid")
    data = _bytes(body.data, body.encoding, "data") or b""
    if not WRITERS.claim(c.handle):
        raise ApiError(409, "busy", f"command {pid} has a write to its stdin waiting "
                       "already (it is not reading); send one at a time, with a timeout",
                       "pid")

    def write() -> None:
        try:
            if data:
                c.handle.send_stdin(data, **({} if body.timeout is None
                                             else {"timeout": body.timeout}))
            if body.close:
                c.handle.close_stdin()
        finally:
            WRITERS.release(c.handle)
    try:
        await own_thread(asyncio.get_running_loop(), write, "corral-stdin")
    except TimeoutError:
        raise ApiError(409, "timeout", f"command {pid} did not read its stdin within "
                       f"{body.timeout:g} s", "timeout") from None
    except (BrokenPipeError, OSError):
        raise ApiError(409, "closed", f"command {pid}'s stdin is closed (or it ended)",
                       "pid") from None
    return {"pid": pid, "written": len(data), "closed": body.close}


@router.post("/sandboxes/{sid}/commands/{pid}/signal")
def signal_command(sid: str, pid: int, body: SignalBody, token: Auth, svc: Svc):
    """Send a signal to a background command's own process (not those it started), never
    to a recycled pid; `sent` is false once it has exited."""
    c = _cmd(svc, svc.entry(sid, token), pid)
    if not c.background:
        raise ApiError(409, "usage", "only a background command takes signals here (a "
                       "foreground one ends with its request)", "pid")
    return {"pid": pid, "sent": bool(c.handle.send_signal(body.signal))}


@router.post("/sandboxes/{sid}/commands/{pid}/kill")
def kill_command(sid: str, pid: int, token: Auth, svc: Svc):
    c = _cmd(svc, svc.entry(sid, token), pid)
    c.handle.kill()
    return {"pid": pid, "killed": not c.done.is_set() or c.result.verdict == "killed"}


@router.get("/sandboxes/{sid}/commands/{pid}/wait")
async def wait_command(sid: str, pid: int, token: Auth, svc: Svc,
                       timeout: float | None = None):
    """The command's Result once it has ended; 409 (kind "running") if `timeout` seconds
    pass first (it keeps running)."""
    if timeout is not None and not 0 <= timeout <= MAX_WAIT_S:
        raise ApiError(400, "invalid", f"timeout is seconds from 0 to {MAX_WAIT_S:g}",
                       "timeout")
    c = _cmd(svc, svc.entry(sid, token), pid)
    deadline = time.monotonic() + (MAX_WAIT_S if timeout is None else timeout)
    while not c.done.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            raise ApiError(409, "running", f"command {pid} is still running after "
                           f"{timeout}s", "timeout")
        await c.notifier.wait(min(left, WAKE_S), c.done.is_set)
    return c.result.to_dict()


@router.get("/sandboxes/{sid}/commands/{pid}/output", responses={200: {"content": {
    "application/x-ndjson": {}}, "description": "{\"stdout\"|\"stderr\": text} lines "
    "from its start (or chunk `since`), as they come, then {\"result\": Result}"}})
async def command_output(sid: str, pid: int, token: Auth, svc: Svc, request: Request,
                         since: int = 0,
                         encoding: Literal["utf-8", "base64"] | None = None):
    """`encoding` of the chunks: utf-8 text or base64 of the bytes (ExecBody's
    output_encoding); default the one the command was started with. Bytes exactly as
    written only for a command started with output_encoding base64."""
    if since < 0:
        raise ApiError(400, "invalid", "since is a chunk index from 0", "since")
    c = _cmd(svc, svc.entry(sid, token), pid)
    enc = encoding or ("base64" if c.raw else "utf-8")
    return StreamingResponse(_lines(request, c, foreground=False, start=since, svc=svc,
                                    encoding=enc),
                             media_type="application/x-ndjson")
