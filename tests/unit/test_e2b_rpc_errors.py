"""The E2B envd face's Connect errors (service/e2b/connect.py): a limit that frees by itself
keeps the REST face's Retry-After, on unary answers and on a stream that fails at once."""

import asyncio

from corral.service.common import ApiError
from corral.service.e2b.connect import RpcError, rpc_error, server_stream, unary_error
from corral.service.limits import Limited


def test_a_limit_keeps_its_retry_after():
    r = unary_error(RpcError.limited(Limited("max_running", "the server is full", 4)))
    assert r.status_code == 429 and r.headers["Retry-After"] == "4"
    assert b"max_running: the server is full" in r.body
    # an ApiError of the shared code (the debug sandbox's max_sandboxes): its header kept
    e = ApiError(429, "rate", "too many", "max_sandboxes", {"Retry-After": "5"})
    assert rpc_error(e).retry_after == 5
    assert unary_error(e).headers["Retry-After"] == "5"
    # errors that no waiting mends have none
    for e in (RpcError("resource_exhausted", "a message is at most 1 MiB"),
              ApiError(404, "not_found", "no such sandbox")):
        assert "Retry-After" not in unary_error(e).headers


def test_a_stream_refused_at_once_carries_it():
    async def full(state, request, msg):
        raise RpcError.limited(Limited("max_terminals", "the server holds 64", 5))

    class Request:
        async def body(self):
            return b"\0\0\0\0\x02{}"

    r = asyncio.run(server_stream(full)(None, Request()))
    assert r.headers["Retry-After"] == "5"
