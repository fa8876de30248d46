"""Files of a live sandbox: read (JSON, or the raw bytes as a stream), write (JSON, raw
bytes, many at once, multipart, a tar unpacked), list, info, exists, remove, rename,
make_dir, watch (NDJSON or SSE). Each is the in-process files API (runtime/files.py,
`sb.files`) over HTTP: every path is resolved by the kernel inside the sandbox's own root,
as the sandbox's user, so a link the sandbox planted (to /etc/shadow, say) means the
sandbox's file, never the host's, and a tar is checked whole before anything is written
(runtime/archive.py). Every request body is capped before a handler sees it (bodycap.py:
413, nothing written).
"""

from __future__ import annotations

import asyncio
import base64
import json
import posixpath
import threading
import weakref
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ...runtime.files import MAX_DEPTH
from ..common import (
    COMMON_ERRORS,
    ApiError,
    Auth,
    Svc,
    local_name,
    wire_error,
    wire_name,
    wire_names,
)

router = APIRouter(tags=["files"], responses=COMMON_ERRORS)

#: watches one sandbox may have open at once (each is an inotify instance on the host)
MAX_WATCHES = 8
#: how often a watch looks whether it should end (the sandbox ended, the drain, a client
#: gone); and how long an idle stream waits before a keep-alive line
WATCH_WAKE_S = 1.0
KEEPALIVE_S = 15.0
#: bytes a JSON read (GET .../files) gives at most (base64 in JSON, held whole)
JSON_READ_MAX = 16 << 20
#: files one batch or multipart upload writes at most
MAX_UPLOAD_FILES = 1000
#: the answer of a raw read: as it comes, never buffered by nginx
_STREAM_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-store"}


class WriteBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: list[WriteBody] = Field(..., max_length=MAX_UPLOAD_FILES)


class RenameBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    old: str
    new: str


class PathBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str


def _call(e, fn):
    """fn(the sandbox's Files), with the files lock held (one Files object a sandbox)."""
    from ...runtime.files import FilesError

    with e.files_lock:
        try:
            return fn(e.sandbox.files)
        except FilesError as x:
            raise wire_error(x) from None


#: an EntryInfo, WriteInfo or watch event as JSON, its names in their wire form (a byte
#: that is not UTF-8 written quoted: common.wire_name)
_out = wire_names


def _decode(body: WriteBody, field: str) -> bytes:
    if body.encoding == "base64":
        try:
            return base64.b64decode(body.content, validate=True)
        except ValueError:
            raise ApiError(400, "invalid", f"{field} is not base64", field) from None
    return body.content.encode()


# -- read ------------------------------------------------------------------------------------
@router.get("/sandboxes/{sid}/files")
def read(sid: str, path: str, token: Auth, svc: Svc,
         encoding: Literal["utf-8", "base64"] = "utf-8"):
    """The file as JSON (text, or base64 for bytes), up to JSON_READ_MAX bytes; bigger
    files: .../files/content, streamed."""
    e = svc.entry(sid, token)
    local = local_name(path)
    chunks = _call(e, lambda f: f.read(local, format="stream"))
    try:
        got, size = [], 0
        for chunk in chunks:
            got.append(chunk)
            size += len(chunk)
            if size > JSON_READ_MAX:
                raise ApiError(413, "too_large", f"is over {JSON_READ_MAX} bytes, the most "
                               "a JSON read gives: GET .../files/content streams it", path)
    finally:
        chunks.close()
    data = b"".join(got)
    if encoding == "base64":
        return {"path": path, "encoding": "base64",
                "content": base64.b64encode(data).decode()}
    return {"path": path, "encoding": "utf-8",
            "content": data.decode("utf-8", errors="replace")}


@router.get("/sandboxes/{sid}/files/content", response_class=StreamingResponse, responses={
    200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes, "
          "streamed as they are read (an aborted answer, not a short one, if it grew past "
          "the read cap meanwhile)"}})
async def download(sid: str, path: str, token: Auth, svc: Svc):
    e = svc.entry(sid, token)
    # opened now (404, not a regular file, over the cap: an error before the 200), and its
    # first chunk read: a generator that was started is closed, its file with it, by
    # close() (an unstarted one would keep its file open)
    local = local_name(path)
    chunks = await run_in_threadpool(_call, e, lambda f: f.read(local, format="stream"))
    try:
        first = await run_in_threadpool(next, chunks, b"")
    except BaseException:
        chunks.close()
        raise
    return StreamingResponse(_pump(first, chunks), media_type="application/octet-stream",
                             headers=_STREAM_HEADERS, background=BackgroundTask(
                                 chunks.close))


async def _pump(first: bytes, chunks):
    """The file's chunks, each read in a worker thread (the response's background closes
    the file however the stream ended: a worker thread's call is not abandoned on a
    cancel, anyio waits for it, so no read runs at the close)."""
    if first:
        yield first
    while True:
        chunk = await run_in_threadpool(next, chunks, None)
        if chunk is None:
            return
        yield chunk


# -- write -----------------------------------------------------------------------------------
@router.put("/sandboxes/{sid}/files")
def write(sid: str, body: WriteBody, token: Auth, svc: Svc):
    e = svc.entry(sid, token)
    data = _decode(body, "content")
    local = local_name(body.path)
    return _out(_call(e, lambda f: f.write(local, data)))


@router.put("/sandboxes/{sid}/files/content", openapi_extra={"requestBody": {
    "content": {"application/octet-stream": {}}, "required": True}})
async def write_raw(sid: str, path: str, token: Auth, svc: Svc, request: Request):
    """The request's body, as it is, written to `path` (parents made, atomic)."""
    e = svc.entry(sid, token)
    data = await request.body()
    local = local_name(path)
    info = await run_in_threadpool(_call, e, lambda f: f.write(local, data))
    return _out(info)


@router.post("/sandboxes/{sid}/files/batch")
def write_files(sid: str, body: BatchBody, token: Auth, svc: Svc):
    """Many files in one request, in turn (every content is decoded before the first is
    written)."""
    e = svc.entry(sid, token)
    items = [(local_name(f.path, f"files.{i}.path"), _decode(f, f"files.{i}.content"))
             for i, f in enumerate(body.files)]
    return {"written": _write_many(e, items)}


def _write_many(e, items: list[tuple[str, bytes]]) -> list[dict]:
    from ...runtime.files import FileNotFound, FilesError

    done: list[dict] = []
    with e.files_lock:
        files = e.sandbox.files
        for path, data in items:
            try:
                done.append(_out(files.write(path, data)))
            except FilesError as x:
                cls = FileNotFound if isinstance(x, FileNotFound) else FilesError
                raise cls(f"{x.message} ({len(done)} file(s) before it were written: "
                          f"{', '.join(d['path'] for d in done) or 'none'})",
                          path=wire_name(x.path), errno=x.errno) from None
    return done


@router.post("/sandboxes/{sid}/files/upload", openapi_extra={"requestBody": {
    "content": {"multipart/form-data": {}}, "required": True}})
async def upload(sid: str, token: Auth, svc: Svc, request: Request, path: str = "."):
    """multipart/form-data: each file part is written to `path`/its filename (a relative
    path: no `..`, not absolute). Every name is checked before the first is written."""
    e = svc.entry(sid, token)
    items: list[tuple[str, bytes]] = []
    async with request.form(max_files=MAX_UPLOAD_FILES, max_fields=MAX_UPLOAD_FILES) as form:
        for field, part in form.multi_items():
            if isinstance(part, str):
                raise ApiError(400, "invalid", f"form field {field!r} is not a file part: "
                               "send each file with a filename", field)
            items.append((_joined(path, part.filename, field), await part.read()))
    if not items:
        raise ApiError(400, "invalid", "no file parts in the form", "body")
    return JSONResponse({"written": await run_in_threadpool(_write_many, e, items)},
                        status_code=201)


def _joined(base: str, name: str | None, field: str) -> str:
    if not name or "\0" in name:
        raise ApiError(400, "invalid", f"part {field!r} has no filename", field)
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise ApiError(400, "invalid", f"part {field!r}'s filename {name[:80]!r} is absolute "
                       "or has a '..': name files relative to the path query", field)
    return posixpath.join(local_name(base), name)


@router.put("/sandboxes/{sid}/files/archive", openapi_extra={"requestBody": {
    # the tar's bytes (any content type is read as such; declared as octet-stream, which
    # generic OpenAPI tools can send, where application/x-tar has no serializer)
    "content": {"application/octet-stream": {}}, "required": True}})
async def write_archive(sid: str, path: str, token: Auth, svc: Svc, request: Request):
    """A tar (plain, gzip, bzip2 or xz) unpacked into the directory `path` (made if
    missing). Checked whole first: a member absolute or with `..`, a link leading out, a
    device node, FIFO or other special member refuses it all, and nothing is written."""
    e = svc.entry(sid, token)
    blob = await request.body()
    local = local_name(path)
    info = await run_in_threadpool(_call, e, lambda f: f.write_archive(local, blob))
    return JSONResponse(_out(info), status_code=201)


# -- the tree ----------------------------------------------------------------------------------
@router.get("/sandboxes/{sid}/files/list")
def list_files(sid: str, token: Auth, svc: Svc, path: str = ".",
               depth: Annotated[int, Query(ge=1, le=MAX_DEPTH, description="levels to "
                                           f"descend, 1 to {MAX_DEPTH}")] = 1):
    e = svc.entry(sid, token)
    local = local_name(path)
    entries = _call(e, lambda f: f.list(local, depth=depth))
    return {"entries": [_out(x) for x in entries]}


@router.get("/sandboxes/{sid}/files/info")
def info(sid: str, path: str, token: Auth, svc: Svc):
    """The entry itself (a link described, not followed)."""
    local = local_name(path)
    return _out(_call(svc.entry(sid, token), lambda f: f.info(local)))


@router.get("/sandboxes/{sid}/files/exists")
def exists(sid: str, path: str, token: Auth, svc: Svc):
    local = local_name(path)
    return {"path": path, "exists": _call(svc.entry(sid, token), lambda f: f.exists(local))}


@router.delete("/sandboxes/{sid}/files")
def remove(sid: str, path: str, token: Auth, svc: Svc):
    """A file, a link (not what it points to) or a directory tree."""
    local = local_name(path)
    _call(svc.entry(sid, token), lambda f: f.remove(local))
    return {"removed": path}


@router.post("/sandboxes/{sid}/files/rename")
def rename(sid: str, body: RenameBody, token: Auth, svc: Svc):
    old, new = local_name(body.old, "old"), local_name(body.new, "new")
    return _out(_call(svc.entry(sid, token), lambda f: f.rename(old, new)))


@router.post("/sandboxes/{sid}/files/mkdir")
def make_dir(sid: str, body: PathBody, token: Auth, svc: Svc):
    local = local_name(body.path)
    made = _call(svc.entry(sid, token), lambda f: f.make_dir(local))
    return {"path": body.path, "made": made}


# -- watch -----------------------------------------------------------------------------------
_watching: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # entry -> open watches
_watching_mu = threading.Lock()


@router.get("/sandboxes/{sid}/files/watch", response_class=StreamingResponse, responses={
    200: {"content": {"application/x-ndjson": {}, "text/event-stream": {}},
          "description": "first {\"watching\": path, \"recursive\"}, then one "
          "{type, name, path} a change, last {\"end\": why}; blank lines keep an idle "
          "stream open (SSE: events of those kinds, comments)"},
    429: {"description": f"{MAX_WATCHES} watches already open on this sandbox"}})
async def watch(sid: str, path: str, token: Auth, svc: Svc, recursive: bool = False,
                format: Literal["ndjson", "sse"] = "ndjson"):
    e = svc.entry(sid, token)
    with _watching_mu:
        n = _watching.get(e, 0)
        if n >= MAX_WATCHES:
            raise ApiError(429, "rate", f"sandbox {sid} has {n} watches open, the most it "
                           "may: stop one first", "watch", {"Retry-After": "1"})
        _watching[e] = n + 1
    try:
        local = local_name(path)
        w = await run_in_threadpool(_call, e, lambda f: f.watch(local, recursive=recursive))
    except BaseException:
        _release(e)
        raise
    media = "application/x-ndjson" if format == "ndjson" else "text/event-stream"
    stop, started = threading.Event(), threading.Event()

    def after() -> None:       # the response's end, however it ended
        stop.set()
        if not started.is_set():     # cancelled before it began: no thread owns the watch
            started.set()
            w.stop()
            _release(e)

    return StreamingResponse(_watch_stream(svc, e, w, format, stop, started),
                             media_type=media, headers=_STREAM_HEADERS,
                             background=BackgroundTask(after))


def _release(e) -> None:
    with _watching_mu:
        _watching[e] = _watching.get(e, 1) - 1


def _frame(format: str, kind: str, data: dict) -> str:
    if format == "sse":
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"
    return json.dumps(data) + "\n"


async def _watch_stream(svc, e, w, format: str, stop, started):
    """The watch's events as they come. Its own thread reads the inotify queue (and alone
    stops the watch: no fd is closed under a reader); the stream ends with the directory,
    the sandbox, the drain or the client."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue(maxsize=64)

    def put(item) -> bool:
        try:
            fut = asyncio.run_coroutine_threadsafe(q.put(item), loop)
        except RuntimeError:          # the loop is gone: the service ends
            return False
        while not stop.is_set():
            try:
                fut.result(WATCH_WAKE_S)
                return True
            except TimeoutError:
                continue
        fut.cancel()
        return False

    def reader() -> None:
        why = "stopped"
        try:
            while not stop.is_set():
                if getattr(e.sandbox, "state", "running") == "ended":
                    why = "the sandbox ended"
                    break
                if svc.draining:
                    why = "the service is shutting down"
                    break
                for ev in w.next_events(WATCH_WAKE_S):
                    if not put(("event", _out(ev))):
                        return
                if w.done:
                    why = "the directory went"
                    break
        except Exception as x:  # noqa: BLE001 - said to the client, the stream ends
            why = f"the watch failed: {x}"
        finally:
            w.stop()
            _release(e)
            put(("end", why))

    if started.is_set():
        return
    started.set()
    try:
        threading.Thread(target=reader, daemon=True, name=f"corral-watch-{e.id}").start()
        yield _frame(format, "watching", {"watching": wire_name(w.path),
                                          "recursive": w.recursive})
        while True:
            try:
                kind, data = await asyncio.wait_for(q.get(), KEEPALIVE_S)
            except TimeoutError:
                yield ": keep-alive\n\n" if format == "sse" else "\n"
                continue
            if kind == "end":
                yield _frame(format, "end", {"end": data})
                return
            yield _frame(format, data["type"], data)
    finally:
        stop.set()
