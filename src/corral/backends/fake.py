"""A tier that isolates nothing and runs nothing: each exec answers from a handler.

Like httpx's MockTransport, it lets the logic of corral's faces (the SDK's serialisation,
the service's auth and ceilings, the MCP tools' schemas) be tested without a kernel. It
makes no containment claim: every op is "enforced" by nobody, `explain` says so, and no
policy can name it (`isolation = "fake"` is not a tier); only code that builds it itself,
`Sandbox(policy, backend=FakeBackend(handler))`, gets one.

It is also the proof that a tier is one module on `base.py` plus one registry row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..plan import Op, Plan
from ..result import Result
from .base import Backend, LiveSandbox, TierCheck

#: handler(argv, stdin bytes or None) -> Result
Handler = Callable[[list[str], "bytes | None"], Result]


def _echo(argv: list[str], stdin: bytes | None) -> Result:
    """The default handler: exit 0, stdout the argv joined by spaces and a newline."""
    return Result(verdict="ok", exit_code=0, signal=None, stdout=" ".join(argv) + "\n",
                  isolation="fake")


class FakeBackend(Backend):
    name = "fake"
    mechanism = "none: scripted results for tests (nothing is isolated or run)"
    own_kernel = False
    properties: ClassVar[dict[str, bool]] = {}

    def __init__(self, handler: Handler | None = None, *,
                 close_problems: tuple[str, ...] = ()) -> None:
        """`close_problems`: what each of its sandboxes reports from close()."""
        self.handler = handler or _echo
        self.close_problems = list(close_problems)
        self.opened: list[FakeSandbox] = []

    def check(self, plan: Plan) -> TierCheck:
        return TierCheck.of(self.name, plan, [])

    def describe(self, op: Op) -> tuple[str, str]:
        return "none", "the fake tier enforces nothing"

    def open(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None
             ) -> FakeSandbox:
        sb = FakeSandbox(self, check.admit(self.name).events())
        self.opened.append(sb)
        return sb


class FakeSandbox(LiveSandbox):
    def __init__(self, backend: FakeBackend, events: list[dict]) -> None:
        self.backend, self.events = backend, events
        self.calls: list[list[str]] = []
        self.closed = False

    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None) -> Result:
        if self.closed:
            raise RuntimeError("exec on a closed fake sandbox")
        data = None
        if stdin is not None:
            import os

            chunks = []
            while chunk := os.read(stdin, 65536):
                chunks.append(chunk)
            data = b"".join(chunks)
        self.calls.append(list(argv))
        r = self.backend.handler(list(argv), data)
        r.events = [*self.events, *r.events]
        for cb, text in ((on_stdout, r.stdout), (on_stderr, r.stderr)):
            if cb is not None and text:
                cb(text.encode())
        return r

    def close(self) -> list[str]:
        self.closed = True
        return list(self.backend.close_problems)
