"""envd's data plane as the SDK speaks it: Connect RPC with the JSON codec (unary calls
`application/json`; server streams `application/connect+json`, 5-byte envelopes: a flag
byte and a big-endian length, the last one flagged 0x02 carrying {} or {"error"}), and
the plain-HTTP /files and /health. process.Process here; filesystem.Filesystem and /files
in fs.py.

Every call names its sandbox (E2b-Sandbox-Id) and carries its access token
(X-Access-Token, minted at create: state.py). A command is a run of the sandbox's
CommandTable (service/commands.py), as the native API's are: listed, counted, audited.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ...errors import CorralError
from ..common import ApiError, SafeJSONResponse, status_of
from .state import HOME

#: a stream's keepalive event every this many seconds (the SDK asks for <= 50);
#: CORRAL_E2B_KEEPALIVE_S sets it (from 0.1 to 50)
KEEPALIVE_S = min(50.0, max(0.1, float(os.environ.get("CORRAL_E2B_KEEPALIVE_S") or 30)))
#: one request envelope's bound (bytes)
MAX_MESSAGE = 1 << 20

#: HTTP status -> Connect code (the ApiError's kind may say better: CODE_OF_KIND)
CODE_OF_STATUS = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
                  404: "not_found", 409: "failed_precondition", 413: "resource_exhausted",
                  429: "resource_exhausted", 499: "canceled", 501: "unimplemented",
                  503: "unavailable", 504: "deadline_exceeded"}
CODE_OF_KIND = {"exists": "already_exists", "unimplemented": "unimplemented"}
STATUS_OF_CODE = {"invalid_argument": 400, "unauthenticated": 401, "permission_denied": 403,
                  "not_found": 404, "already_exists": 409, "failed_precondition": 400,
                  "resource_exhausted": 429, "canceled": 499, "unimplemented": 501,
                  "unavailable": 503, "deadline_exceeded": 504, "internal": 500}


class RpcError(Exception):
    """A Connect error. `retry_after` (whole seconds): a limit that frees by itself (the
    REST face's Limited, answered there 429 with Retry-After), said the same way here:
    the Retry-After header on the answer (a stream's, when it fails before its first
    message)."""

    def __init__(self, code: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after

    @classmethod
    def limited(cls, err) -> RpcError:
        """resource_exhausted for a limits.Limited, with its retry_after."""
        return cls("resource_exhausted", f"{err.field}: {err.message}", err.retry_after)

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def rpc_error(e: BaseException) -> RpcError:
    if isinstance(e, RpcError):
        return e
    if isinstance(e, ApiError):
        code = CODE_OF_KIND.get(e.kind) or CODE_OF_STATUS.get(e.status, "internal")
        msg = e.message if not e.field or e.field in e.message else f"{e.field}: {e.message}"
        after = e.headers.get("Retry-After")
        return RpcError(code, msg, int(after) if after and after.isdigit() else None)
    if isinstance(e, CorralError):
        from ...runtime.files import FileNotFound
        from ..common import wire_error

        e = wire_error(e)      # a path not UTF-8 named as the API writes it

        if isinstance(e, FileNotFound):
            return RpcError("not_found", str(e))
        st = status_of(e)
        if getattr(e, "errno", None) == 17:
            return RpcError("already_exists", str(e))
        if getattr(e, "errno", None) == 1 or getattr(e, "errno", None) == 13:
            return RpcError("permission_denied", str(e))
        return RpcError(CODE_OF_STATUS.get(st, "internal"), str(e))
    return RpcError("internal", f"{type(e).__name__}: {e}")


def unary_error(e: BaseException) -> JSONResponse:
    r = rpc_error(e)
    return SafeJSONResponse({"code": r.code, "message": r.message},
                        status_code=STATUS_OF_CODE.get(r.code, 500), headers=r.headers())


def envelope(msg: dict, flags: int = 0) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(body)) + body


def unenvelope(raw: bytes) -> dict:
    """The one message of a server-stream call's request (strict: one envelope, no
    compression, bounded)."""
    if len(raw) < 5:
        raise RpcError("invalid_argument", "the request is not a Connect envelope")
    flags, n = struct.unpack(">BI", raw[:5])
    if flags & 0x01:
        raise RpcError("unimplemented", "compressed messages: corral takes them plain")
    if n > MAX_MESSAGE or len(raw) != 5 + n:
        raise RpcError("invalid_argument", "the request envelope's length is wrong")
    return _obj(raw[5:])


def _obj(raw: bytes) -> dict:
    if len(raw) > MAX_MESSAGE:
        raise RpcError("resource_exhausted", f"a message is at most {MAX_MESSAGE} bytes")
    try:
        d = json.loads(raw or b"{}")
    except (ValueError, RecursionError):   # RecursionError: nesting past ~1000 levels
        raise RpcError("invalid_argument", "the message is not JSON") from None
    if not isinstance(d, dict):
        raise RpcError("invalid_argument", "the message is not a JSON object")
    return d


def deadline_s(request: Request) -> float | None:
    v = request.headers.get("connect-timeout-ms")
    if v is None:
        return None
    if not v.isdigit() or len(v) > 10:
        raise RpcError("invalid_argument", "Connect-Timeout-Ms is a whole number")
    return int(v) / 1000 or None


def unary(fn):
    """A unary RPC: fn(state, request, msg) -> dict, errors as Connect's."""
    async def call(state, request: Request):
        try:
            if not request.headers.get("content-type", "").startswith("application/json"):
                raise RpcError("invalid_argument", "unary calls are application/json "
                               "(the SDK's JSON codec)")
            msg = _obj(await request.body())
            return SafeJSONResponse(await fn(state, request, msg))
        except Exception as e:  # noqa: BLE001 - every error is the caller's answer
            return unary_error(e)
    return call


def server_stream(fn):
    """A server-stream RPC: fn(state, request, msg) -> (prologue, async iterator of
    dicts); an error before the first message is still a stream, ended with it."""
    async def call(state, request: Request):
        async def body(gen):
            try:
                async for m in gen:
                    yield envelope(m)
                yield envelope({}, 0x02)
            except Exception as e:  # noqa: BLE001
                r = rpc_error(e)
                yield envelope({"error": {"code": r.code, "message": r.message}}, 0x02)

        headers = {}
        try:
            msg = unenvelope(await request.body())
            gen = await fn(state, request, msg)
        except Exception as e:  # noqa: BLE001
            headers = rpc_error(e).headers()     # a limit: when to try again
            gen = _failed(e)
        return StreamingResponse(body(gen), media_type="application/connect+json",
                                 headers=headers)
    return call


async def _failed(e: BaseException):
    raise e
    yield  # pragma: no cover - an async generator that raises at once


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(s, field: str) -> bytes:
    if not isinstance(s, str):
        raise RpcError("invalid_argument", f"{field} is base64 bytes")
    try:
        return base64.b64decode(s, validate=True)
    except ValueError:
        raise RpcError("invalid_argument", f"{field} is not base64") from None


# -- process.Process ----------------------------------------------------------------------
def _selector(msg: dict) -> int:
    sel = msg.get("process") or {}
    if "tag" in sel:
        raise RpcError("unimplemented", "process.tag: corral selects a process by pid")
    pid = sel.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise RpcError("invalid_argument", "process.pid is a positive integer")
    return pid


def _cmd(e, pid: int):
    c = e.commands.get(pid)
    if c is None:
        raise RpcError("not_found", f"process with pid {pid} not found")
    return c


def _end(r) -> dict:
    if r.exit_code is not None and r.verdict in ("ok", "error"):
        return {"exitCode": r.exit_code, "exited": True,
                "status": f"exit status {r.exit_code}"}
    sig = r.signal or 9
    d = {"exitCode": -1, "exited": False,
         "status": "signal: killed" if sig == 9 else f"signal: {sig}"}
    if r.verdict in ("timeout", "oom"):
        d["error"] = {"timeout": "its timeout passed: killed",
                      "oom": "out of memory: killed"}[r.verdict]
    return d


async def events(c, start: int, *, with_start: bool = True):
    """A command's ProcessEvents: start, its output from chunk `start`, keepalives, end."""
    if with_start:
        yield {"event": {"start": {"pid": c.pid}}}
    i = start
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        for stream, text in c.output_since(i):
            i += 1
            yield {"event": {"data": {stream: b64(text.encode("utf-8", "replace"))}}}
            last = loop.time()
        if c.done.is_set() and not c.output_since(i):
            yield {"event": {"end": _end(c.result)}}
            return
        left = KEEPALIVE_S - (loop.time() - last)
        if left <= 0:
            yield {"event": {"keepalive": {}}}
            last = loop.time()
            continue
        await c.notifier.wait(min(left, 15.0),
                              lambda: c.done.is_set() or bool(c.output_since(i)))


async def start(state, request, msg):
    e, face = state.sandbox(request)
    user = state.user(request.headers, face)
    if msg.get("pty") is not None:
        if user == "user":
            raise RpcError("unimplemented", "user \"user\": corral's terminals run as "
                           "the sandbox's root; user=\"user\" is for commands and files")
        from .pty import start_pty

        return await start_pty(state, request, msg, e, face)
    if msg.get("tag"):
        raise RpcError("unimplemented", "tag: corral names a process by its pid")
    proc = msg.get("process") or {}
    cmd, args = proc.get("cmd"), proc.get("args") or []
    if not isinstance(cmd, str) or not cmd or not isinstance(args, list) or not all(
            isinstance(a, str) for a in args):
        raise RpcError("invalid_argument", "process.cmd is a string and process.args a "
                       "list of strings")
    envs = proc.get("envs") or {}
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
        raise RpcError("invalid_argument", "process.envs is an object of strings")
    cwd = proc.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise RpcError("invalid_argument", "process.cwd is a string")
    env = {**face.envs, **envs}
    timeout = deadline_s(request)
    svc = state.svc

    from ..limits import Limited

    try:      # a thread waits for it till its end: the server's max_running (REST's too)
        held = svc.running.hold()
    except Limited as err:
        raise RpcError.limited(err) from None

    def on_end(c):
        try:
            r = c.result
            svc.metrics.run(r.verdict, r.usage.wall_s or 0.0, r.events)
        finally:
            held.release()

    if not cwd and face.account:
        cwd = HOME        # E2B's default working directory, the account's home
    try:
        c = await run_in_threadpool(e.commands.start, [cmd, *args], env=env or None,
                                    cwd=cwd or None, timeout=timeout, background=True,
                                    on_end=on_end, user=user)
    except BaseException:
        held.release()
        raise
    if not msg.get("stdin"):
        c.handle.close_stdin()
    return events(c, 0)


async def connect_(state, request, msg):
    e, face = state.sandbox(request)
    pid = _selector(msg)
    t = face.ptys.get(pid)
    if t is not None:
        from .pty import pty_events

        return pty_events(t, connect=True)
    c = _cmd(e, pid)
    return events(c, len(c.output_since(0)))


async def list_(state, request, msg):
    e, _ = state.sandbox(request)
    out = []
    for info in await run_in_threadpool(e.sandbox.commands.list):
        if info.detached:
            continue
        cmd = list(info.cmd)
        out.append({"pid": info.pid, "config": {"cmd": cmd[0] if cmd else "",
                                                "args": cmd[1:], "envs": {}}})
    return {"processes": out}


async def send_input(state, request, msg):
    e, face = state.sandbox(request)
    pid = _selector(msg)
    inp = msg.get("input") or {}
    t = face.ptys.get(pid)
    if t is not None:
        from .pty import write_pty

        await write_pty(t, unb64(inp.get("pty", inp.get("stdin", "")), "input.pty"))
        return {}
    c = _cmd(e, pid)
    data = unb64(inp.get("stdin", ""), "input.stdin")
    await write_one(c.handle, c.handle.send_stdin, data, "corral-e2b-stdin",
                    busy=f"process {c.pid} has a write to its stdin waiting already",
                    ended=f"process {c.pid}'s stdin is closed (or it ended)")
    return {}


async def write_one(target, send, data: bytes, thread: str, *, busy: str, ended: str) -> None:
    """`send(data)` in a thread of its own (service.common.own_thread: the target's program
    decides whether it reads), one write waiting a target (a process's stdin, a terminal)
    at a time: a second meanwhile is resource_exhausted (`busy`), a target gone
    failed_precondition (`ended`)."""
    from ..common import WRITERS, own_thread

    if not WRITERS.claim(target):
        raise RpcError("resource_exhausted", f"{busy} (it is not reading); send one at a "
                       "time")

    def write() -> None:
        try:
            send(data)
        finally:
            WRITERS.release(target)
    try:
        await own_thread(asyncio.get_running_loop(), write, thread)
    except OSError:
        raise RpcError("failed_precondition", ended) from None


async def close_stdin(state, request, msg):
    e, _ = state.sandbox(request)
    _cmd(e, _selector(msg)).handle.close_stdin()
    return {}


async def send_signal(state, request, msg):
    """SIGKILL and SIGTERM both kill the command and every process it started (its
    cgroup): corral has no gentler stop."""
    e, face = state.sandbox(request)
    pid = _selector(msg)
    sig = msg.get("signal")
    if sig not in ("SIGNAL_SIGKILL", "SIGNAL_SIGTERM", 9, 15):
        raise RpcError("invalid_argument", "signal is SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    t = face.ptys.get(pid)
    await run_in_threadpool((t or _cmd(e, pid)).handle.kill)
    return {}


async def update(state, request, msg):
    _, face = state.sandbox(request)
    pid = _selector(msg)
    t = face.ptys.get(pid)
    if t is None:
        raise RpcError("not_found", f"no terminal with pid {pid}")
    from .pty import resize

    await resize(t, msg.get("pty"))
    return {}


async def health(state, request):
    """204 while the sandbox runs; 502 once it has ended (or was never), which the SDK's
    is_running() and its probe after a failed call read as "not running"."""
    try:
        state.sandbox(request)
    except ApiError as e:
        if e.status != 404:
            raise
        return Response(status_code=502)
    return Response(status_code=204)


def app(state) -> Starlette:
    from . import fs

    def r(path, fn, methods=("POST",)):
        async def call(request: Request):
            return await fn(state, request)
        return Route(path, call, methods=list(methods))

    P, F = "/process.Process/", "/filesystem.Filesystem/"
    return Starlette(routes=[
        r(P + "Start", server_stream(start)), r(P + "Connect", server_stream(connect_)),
        r(P + "List", unary(list_)), r(P + "SendInput", unary(send_input)),
        r(P + "CloseStdin", unary(close_stdin)), r(P + "SendSignal", unary(send_signal)),
        r(P + "Update", unary(update)),
        r(F + "Stat", unary(fs.stat)), r(F + "MakeDir", unary(fs.make_dir)),
        r(F + "Move", unary(fs.move)), r(F + "ListDir", unary(fs.list_dir)),
        r(F + "Remove", unary(fs.remove)),
        r(F + "CreateWatcher", unary(fs.create_watcher)),
        r(F + "GetWatcherEvents", unary(fs.get_watcher_events)),
        r(F + "RemoveWatcher", unary(fs.remove_watcher)), r(F + "WatchDir", server_stream(fs.watch_dir)),
        r("/files", fs.read, ("GET",)), r("/files", fs.write, ("POST",)),
        r("/health", health, ("GET",)),
    ], exception_handlers={ApiError: _on_error, RpcError: _on_error})


async def _on_error(request, e):
    return unary_error(e)
