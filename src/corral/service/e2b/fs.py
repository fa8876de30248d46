"""envd's filesystem.Filesystem (Connect, JSON) and plain-HTTP /files, over the sandbox's
files API (runtime/files.py): every path resolved by the kernel inside the sandbox's own
root, never on the host; the files API's caps (bytes a read or write moves, entries a list
returns) and the service's body cap hold here as on the native routes."""

from __future__ import annotations

import asyncio
import datetime
import posixpath
import stat as stat_mod

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..common import local_name, wire_name
from .connect import KEEPALIVE_S, RpcError, unary_error
from .state import HOME

TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY",
         "symlink": "FILE_TYPE_SYMLINK"}
EVENTS = {"add": "EVENT_TYPE_CREATE", "modify": "EVENT_TYPE_WRITE",
          "remove": "EVENT_TYPE_REMOVE", "rename": "EVENT_TYPE_RENAME",
          "chmod": "EVENT_TYPE_CHMOD"}
#: the deepest files.list(depth=) (the files API's caps.entries bounds the answer too)
MAX_DEPTH = 32


def _path(msg: dict, key: str = "path") -> str:
    """The path `key` of a request, its quoted components (a name that is not UTF-8, as
    entry() lists it: common.wire_name) made the sandbox's names again."""
    p = msg.get(key)
    if not isinstance(p, str) or not p or "\0" in p or len(p) > 4096:
        raise RpcError("invalid_argument", f"{key} is a non-empty path")
    return local_name(p, key)


def entry(info) -> dict:
    mode = info.mode
    kind = {"file": stat_mod.S_IFREG, "dir": stat_mod.S_IFDIR,
            "symlink": stat_mod.S_IFLNK}.get(info.type, 0)
    d = {"name": wire_name(info.name), "type": TYPES.get(info.type, "FILE_TYPE_UNSPECIFIED"),
         "path": wire_name(info.path), "size": str(info.size), "mode": mode,
         "permissions": stat_mod.filemode(kind | mode), "owner": "root", "group": "root",
         "modifiedTime": datetime.datetime.fromtimestamp(
             info.mtime, datetime.timezone.utc).isoformat().replace("+00:00", "Z"),
         "isSymlink": info.type == "symlink"}
    if info.symlink_target is not None:
        d["symlinkTarget"] = wire_name(info.symlink_target)
    return d


def _home(face, p: str) -> str:
    """A relative path from /home/user where the sandbox has the account (as _files)."""
    return posixpath.join(HOME, p) if face.account and not p.startswith("/") else p


async def _files(state, request, fn, headers=None):
    e, face = state.sandbox(request)
    user = state.user(request.headers if headers is None else headers, face)

    def call():
        with e.files_lock:
            if not face.account:
                return fn(e.sandbox.files)
            # relative paths from /home/user, the commands' default cwd, for both users
            return fn(e.sandbox.files_for(user or "root", HOME))
    return await run_in_threadpool(call)


async def stat(state, request, msg):
    p = _path(msg)
    return {"entry": entry(await _files(state, request, lambda f: f.info(p)))}


async def make_dir(state, request, msg):
    p = _path(msg)

    def mk(f):
        if not f.make_dir(p):
            raise RpcError("already_exists", f"directory {wire_name(p)} already exists")
        return f.info(p)
    return {"entry": entry(await _files(state, request, mk))}


async def move(state, request, msg):
    src, dst = _path(msg, "source"), _path(msg, "destination")
    return {"entry": entry(await _files(state, request, lambda f: f.rename(src, dst)))}


async def list_dir(state, request, msg):
    p = _path(msg)
    depth = msg.get("depth", 1) or 1
    if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise RpcError("invalid_argument", f"depth is from 1 to {MAX_DEPTH}")

    def ls(f):
        if f.info(p).type != "dir":
            raise RpcError("invalid_argument", f"path {wire_name(p)} is not a directory")
        return f.list(p, depth=depth)
    return {"entries": [entry(i) for i in await _files(state, request, ls)]}


async def remove(state, request, msg):
    p = _path(msg)
    await _files(state, request, lambda f: f.remove(p))
    return {}


async def watch_dir(state, request, msg):
    """WatchDir: start, then each change (inotify in the sandbox's tree, runtime/watch.py)
    as a FilesystemEvent, keepalives between; ends with the sandbox."""
    p = _path(msg)
    recursive = msg.get("recursive") is True
    e, face = state.sandbox(request)
    p = _home(face, p)
    w = await run_in_threadpool(_watch, e, p, recursive)

    async def gen():
        loop = asyncio.get_running_loop()
        try:
            yield {"start": {}}
            last = loop.time()
            while not w.done:
                evs = await run_in_threadpool(w.next_events, 1.0)
                for ev in evs:
                    yield {"filesystem": _event(ev)}
                    last = loop.time()
                if loop.time() - last >= KEEPALIVE_S:
                    yield {"keepalive": {}}
                    last = loop.time()
                if state.svc.registry.get(e.owner, e.id) is None:
                    raise RpcError("unavailable", "the sandbox ended")
        finally:
            w.stop()
    return gen()


def _watch(e, p: str, recursive: bool):
    """A watch made with the files lock held by the worker thread that makes it: never by
    the event loop across an await (a second call would block the loop on the lock, and
    the first could then never resume to release it)."""
    with e.files_lock:
        return e.sandbox.files.watch(p, recursive=recursive)


#: watchers one sandbox holds at once (CreateWatcher)
MAX_WATCHERS = 64


def _event(ev) -> dict:
    if ev.type == "overflow":
        raise RpcError("resource_exhausted", "the kernel dropped events (too many at "
                       "once): list the directory again")
    return {"name": wire_name(ev.name), "type": EVENTS.get(ev.type, "EVENT_TYPE_UNSPECIFIED")}


async def create_watcher(state, request, msg):
    """The sync SDK's watch_dir: a watcher polled with GetWatcherEvents."""
    import secrets

    p = _path(msg)
    e, face = state.sandbox(request)
    p = _home(face, p)
    if len(face.watchers) >= MAX_WATCHERS:
        raise RpcError("resource_exhausted", f"this sandbox has {MAX_WATCHERS} watchers; "
                       "stop one first", retry_after=1)   # as REST's watches cap
    w = await run_in_threadpool(_watch, e, p, msg.get("recursive") is True)
    wid = "w_" + secrets.token_hex(8)
    face.watchers[wid] = w
    return {"watcherId": wid}


def _watcher(face, msg):
    w = face.watchers.get(msg.get("watcherId") or "")
    if w is None:
        raise RpcError("not_found", "no such watcher (stopped, or never made here)")
    return w


async def get_watcher_events(state, request, msg):
    _, face = state.sandbox(request)
    w = _watcher(face, msg)
    evs = await run_in_threadpool(w.get_new_events)
    return {"events": [_event(ev) for ev in evs]}


async def remove_watcher(state, request, msg):
    _, face = state.sandbox(request)
    w = _watcher(face, msg)
    face.watchers.pop(msg.get("watcherId"), None)
    w.stop()
    return {}


# -- plain HTTP /files --------------------------------------------------------------------
def _user_param(request):
    """/files names its user in ?username= (or, as the Connect calls, the Authorization
    header): a Basic header made of it, for state.user to judge."""
    import base64

    u = request.query_params.get("username")
    if u is None:
        return request.headers
    if len(u) > 64:
        raise RpcError("invalid_argument", "username is at most 64 characters")
    return {"authorization": "Basic " + base64.b64encode(f"{u}:".encode()).decode()
            } if u else {}


async def read(state, request: Request):
    try:
        who = _user_param(request)
        p = request.query_params.get("path")
        if not p or "\0" in p:
            raise RpcError("invalid_argument", "path is a query parameter")
        p = local_name(p)
        data = await _files(state, request, lambda f: f.read(p, "bytes"), who)
    except Exception as e:  # noqa: BLE001
        r = unary_error(e)
        return r
    return Response(data, media_type="application/octet-stream")


async def write(state, request: Request):
    """POST /files: multipart (field "file", each part's filename its path) or one
    application/octet-stream body for ?path=. Answers [{path, name, type}]."""
    try:
        who = _user_param(request)
        qpath = request.query_params.get("path")
        ctype = request.headers.get("content-type", "")
        if request.headers.get("content-encoding", "identity") not in ("identity", ""):
            raise RpcError("unimplemented", "Content-Encoding: corral takes uploads "
                           "plain (write with gzip=False)")
        items: list[tuple[str, bytes]] = []
        if ctype.startswith("multipart/form-data"):
            # as a context: each part's spooled file (on disk past 1 MiB) closed at its end
            async with request.form(max_files=1000, max_fields=1000) as form:
                for key, part in form.multi_items():
                    if isinstance(part, str):
                        continue
                    name = part.filename or ""
                    path = qpath if (qpath and len(form) == 1) else name
                    items.append((local_name(path), await part.read()))
        else:
            if not qpath:
                raise RpcError("invalid_argument", "path is a query parameter")
            items.append((local_name(qpath), await request.body()))
        if not items:
            raise RpcError("invalid_argument", "no file in the request")
        for path, _ in items:
            if not path or "\0" in path or len(path) > 4096:
                raise RpcError("invalid_argument", "each file names its path")

        def put(f):
            out = []
            for path, data in items:
                w = f.write(path, data)
                out.append({"path": wire_name(w.path),
                            "name": wire_name(posixpath.basename(w.path)), "type": "file"})
            return out
        return JSONResponse(await _files(state, request, put, who))
    except Exception as e:  # noqa: BLE001
        return unary_error(e)
