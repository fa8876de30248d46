"""What every tier provides. A tier states, per op of the plan, whether it can enforce it
here (`check`), then opens live sandboxes that run commands (`open`)."""

from __future__ import annotations

from typing import Protocol

from ..plan import Op, Plan
from ..result import Result


class LiveSandbox(Protocol):
    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None, tty=None) -> Result:
        """`tty`: a corral.tty.Terminal (stdin is then None): the tier makes its pty (open(),
        or console_socket() for a runtime that makes it), gives the command the slave as
        fds 0-2 and controlling terminal, and calls start() once the command is started;
        Sandbox.exec finishes it and fills the Result's stdout."""
        ...

    def close(self) -> list[str]: ...


class Backend(Protocol):
    name: str

    def check(self, plan: Plan) -> list[tuple[Op, str]]:
        """The ops this tier cannot enforce on this host, each with the reason and fix.
        Raises BackendUnavailable when the tier cannot run at all."""
        ...

    def open(self, plan: Plan, events: list[dict], granted: list, upstream_ca: str | None
             ) -> LiveSandbox:
        """`granted`: the secret grants with their values (grants.Granted), for the proxy."""
        ...
