"""ASGI middleware: the request-body cap, before any handler reads a body."""

from __future__ import annotations

import json


class BodyCap:
    """A request whose body passes `limit` bytes (by Content-Length, or as it arrives) is
    answered 413 and never reaches the app."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return await self._reply(send, 400, "content-length is not a number")
                if n > self.limit:
                    return await self._reply(send, 413, f"the body is {n} bytes, over the "
                                             f"cap of {self.limit}")
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._reply(send, 413, f"the body is over the cap of {self.limit} "
                                         "bytes")
            if not msg.get("more_body"):
                break
        body, done = b"".join(chunks), False

        async def replay():
            nonlocal done
            if done:
                return await receive()
            done = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    async def _reply(self, send, status, message):
        kind = "too_large" if status == 413 else "bad_request"
        data = json.dumps({"error": {"kind": kind, "field": "body", "message": message}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})
