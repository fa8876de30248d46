"""The hot path of POST /sandboxes/{sid}/exec, beside FastAPI's route: a foreground
command's Result (no stream, no background), answered by plain ASGI code.

`sb.commands.run("true")` over HTTP is mostly framework work: FastAPI's dependency
solving, pydantic's validation of the body, and the route's wait built of tasks and
`asyncio.wait_for` cost more CPU than the command's own start. This layer takes only a
request it can fully check itself: the body a JSON object with only ExecBody's fields,
each of ExecBody's strict type and range, exactly one of argv and cmd, no background, no
query but `stream=none`, and a bearer token that verifies. Anything else, and any
request whose answer would be an error before the token was charged (a bad body, a
missing or wrong token), goes on to FastAPI's route unchanged (the body replayed): its
errors, 401s and 422s are the documented ones, and the route stays in /openapi.json as
the description of both. What follows the token's check (its rate, the sandbox lookup,
the stdin decoding, max_concurrent, the command's own failure) is answered here with the
same error bodies and statuses the app's exception handlers give.

Its command, on the namespace tier with an entrant ready, is started and watched by the
event loop itself (service/commands.py CommandTable.start's `loop`; runtime/commands.py
CommandHandle._watch_on): no thread hand-off at its start nor at its end.

It sits inside BodyCap (the body is capped before it is read) and Counted (metrics), and
after E2B's Dispatch. CORRAL_SERVE_LEAN=0 turns it off (for side by side measurements).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import threading

from .wire import FLUSH

log = logging.getLogger("corral.serve")

_PATH = re.compile(r"/sandboxes/([^/]+)/exec")
_FIELDS = frozenset({"argv", "cmd", "stdin", "stdin_encoding", "env", "cwd", "timeout",
                     "background"})
#: the longest wait for a change before the loop looks again (as routes/commands.py)
WAKE_S = 15.0
#: a command still running this long gets a watcher of its client's disconnect (a task
#: reading the request's receive); a shorter one ends before a kill would matter, and
#: making, running and cancelling that task was a good part of this path's event loop work
GONE_AFTER_S = 0.05


def _no_constant(name: str):
    raise ValueError(name)


def parse_body(body: bytes) -> dict | None:
    """ExecBody's fields from `body` if it is one FastAPI would take as it is and this
    layer serves (foreground, argv or cmd); None otherwise (FastAPI answers it)."""
    try:
        d = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if type(d) is not dict or not _FIELDS.issuperset(d):
        return None
    argv, cmd = d.get("argv"), d.get("cmd")
    if (argv is None) == (cmd is None):
        return None
    if argv is not None and (type(argv) is not list or not argv
                             or any(type(a) is not str for a in argv)):
        return None
    for k in ("cmd", "stdin", "cwd"):
        if d.get(k) is not None and type(d[k]) is not str:
            return None
    if d.get("stdin_encoding", "utf-8") not in ("utf-8", "base64") \
            or type(d.get("stdin_encoding", "")) is not str:
        return None
    env = d.get("env")
    if env is not None and (type(env) is not dict or any(
            type(v) is not str for v in env.values())):
        return None
    t = d.get("timeout")
    if t is not None and (type(t) not in (int, float) or not math.isfinite(t)
                          or not 0 < t <= 86400):
        return None
    if d.get("background", False) is not False:
        return None
    return d


class _Wake:
    """A Notifier waiter that resolves the current future (set from any thread through
    the loop's call_soon_threadsafe)."""

    __slots__ = ("fut",)

    def __init__(self, fut) -> None:
        self.fut = fut

    def set(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)


class _OnDone:
    """The loop of a waiter (Notifier's (loop, waiter) pair) woken only once the command
    is done: its start and its output chunks wake no one here (a foreground command's
    Result is all this path sends), so the event loop sleeps while it runs instead of
    taking the GIL from the thread that starts and supervises it. From the loop's own
    thread (a command it watches itself) the wake-up needs no write to the loop's pipe."""

    __slots__ = ("loop", "done", "thread")

    def __init__(self, loop, done) -> None:
        self.loop, self.done, self.thread = loop, done, threading.get_ident()

    def call_soon_threadsafe(self, fn) -> None:
        if self.done.is_set():
            if threading.get_ident() == self.thread:
                self.loop.call_soon(fn)
            else:
                self.loop.call_soon_threadsafe(fn)


class _Later:
    """What a command watched by the loop leaves until its answer is sent (its audit
    record queued, the sandbox's watchdog woken: each wakes a thread that would take the
    GIL from the answer): run then, or at once once the request is over."""

    __slots__ = ("fns", "open")

    def __init__(self) -> None:
        self.fns: list = []
        self.open = True

    def __call__(self, fn) -> None:
        if self.open:
            self.fns.append(fn)
        else:
            fn()

    def run(self) -> None:
        self.open = False
        fns, self.fns = self.fns, []
        for fn in fns:
            try:
                fn()
            except Exception:  # noqa: BLE001 - the answer is sent; said in the log
                log.exception("corral serve: after an exec's answer")


class LeanExec:
    """ASGI middleware: see the module's docstring."""

    def __init__(self, app, svc) -> None:
        self.app, self.svc = app, svc
        self.on = os.environ.get("CORRAL_SERVE_LEAN", "1") != "0"
        #: a command started and watched from the event loop where it can be (no thread
        #: hop at its start nor at its end: service/commands.py); CORRAL_SERVE_LOOP=0 off
        self.here = os.environ.get("CORRAL_SERVE_LOOP", "1") != "0"

    async def __call__(self, scope, receive, send):
        if (not self.on or scope["type"] != "http" or scope["method"] != "POST"
                or scope.get("query_string", b"") not in (b"", b"stream=none")):
            return await self.app(scope, receive, send)
        m = _PATH.fullmatch(scope["path"])
        if m is None:
            return await self.app(scope, receive, send)
        msg = await receive()      # BodyCap's replay: the whole body in one message
        body = msg.get("body", b"") if msg["type"] == "http.request" else b""
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return msg

        if msg["type"] != "http.request" or msg.get("more_body"):
            return await self.app(scope, replay, send)
        d = parse_body(body)
        token = self._token(scope) if d is not None else None
        if token is None:
            return await self.app(scope, replay, send)
        with self.svc.metrics.mu:
            self.svc.metrics.lean += 1
        later = _Later()
        try:
            try:
                result = await self._run(token, m.group(1), d, receive, later)
            except BaseException as e:
                resp = _error_response(e, scope)
                if resp is None:
                    raise
                return await resp(scope, receive, send)
            body = render(result)
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-length", b"%d" % len(body)),
                (b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            flush = scope.get("extensions", {}).get(FLUSH)  # wire.py: the answer goes now
            if flush is not None:
                flush()
        finally:
            later.run()

    def _token(self, scope):
        value = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                value = v
                break
        if value is None:
            return None
        scheme, _, rest = value.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not rest.strip():
            return None
        return self.svc.tokens.verify(rest.strip())

    async def _run(self, token, sid: str, d: dict, receive, later=None) -> dict:
        from .routes.commands import _bytes, _count

        svc = self.svc
        svc.rates.admit(token.name, token.rate, token.burst)       # Limited: 429
        e = svc.entry(sid, token)                                     # 404
        stdin = _bytes(d.get("stdin"), d.get("stdin_encoding", "utf-8"), "stdin")   # 400
        argv = d["argv"] if d.get("argv") is not None else ["/bin/sh", "-c", d["cmd"]]
        slot = svc.work(token)       # max_concurrent, max_running (as the route's)
        slot.__enter__()                                              # 429
        loop = asyncio.get_running_loop()
        c = None
        key = None
        # what the wait needs is made before the command goes to its thread: the event
        # loop then sleeps at once, and the thread has the GIL to start it
        wake = _Wake(loop.create_future())
        gone = None
        try:
            c = e.commands.start(argv, env=d.get("env"), cwd=d.get("cwd"), stdin=stdin,
                                 timeout=d.get("timeout"), on_end=lambda c: _count(svc, c),
                                 loop=loop if self.here else None, defer=later)
            if c.here:
                with svc.metrics.mu:
                    svc.metrics.lean_loop += 1
            key = (_OnDone(loop, c.done), wake)
            with c.notifier._mu:
                c.notifier._waiters.add(key)
            while not c.done.is_set():
                timer = loop.call_later(WAKE_S if gone else GONE_AFTER_S, wake.set)
                try:
                    await wake.fut
                finally:
                    timer.cancel()
                wake.fut = loop.create_future()
                if gone is None:
                    if not c.done.is_set():     # a client gone already: at once
                        gone = loop.create_task(_gone(receive))
                        gone.add_done_callback(lambda _t, w=wake: w.set())
                elif gone.done() and not c.done.is_set():
                    from .common import ApiError

                    raise ApiError(499, "disconnected", "the client went away; the "
                                   "command was killed")
            if c.error is not None:
                raise c.error
            return c.result.to_dict()
        except BaseException:
            if c is not None and not c.done.is_set():
                c.cancel()
            raise
        finally:
            if key is not None:
                with c.notifier._mu:
                    c.notifier._waiters.discard(key)
            if gone is not None:
                gone.cancel()
            slot.__exit__(None, None, None)


def render(result: dict) -> bytes:
    """The Result's JSON as the app's SafeJSONResponse renders it (starlette's JSON; a
    string with a surrogate escape in common.wire_json's form), without building a
    Response: its class machinery is a good part of this path's CPU."""
    try:
        return _dumps(result)
    except UnicodeEncodeError:
        from .common import wire_json

        return _dumps(wire_json(result))


def _dumps(v) -> bytes:
    return json.dumps(v, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


async def _gone(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _error_response(e: BaseException, scope):
    """The app's exception handlers' answer for `e` (service/app.py), or None to let it
    propagate (a cancellation)."""
    from ..errors import CorralError
    from .ceiling import Exceeds
    from .common import ApiError, corral_error, error
    from .limits import Limited

    if isinstance(e, ApiError):
        return error(e.status, e.kind, e.message, e.field, e.headers)
    if isinstance(e, Limited):
        return error(429, "rate", e.message, e.field, {"Retry-After": str(e.retry_after)})
    if isinstance(e, Exceeds):
        return error(403, "ceiling", e.message, e.field)
    if isinstance(e, CorralError):
        return corral_error(e)
    if isinstance(e, Exception):
        log.exception("corral serve: POST %s failed", scope.get("path"))
        return error(500, "internal", "the server failed on this request (its log says "
                     "why)", None)
    return None
