"""The tier contract: what every tier provides, and all that the runtime, `explain`,
`doctor` and the probe may use of one.

A tier is a `Backend` subclass in a module of its own plus one row in the registry
(`backends/__init__.py`). The backend says, per op of a plan, whether it can enforce that op
on this host (`check`) and how it does (`describe`), then opens live sandboxes (`open`) that
run commands (`LiveSandbox.exec`) until closed. Nothing outside a tier's module reaches past
these names.
"""

from __future__ import annotations

from ..plan import Op, Plan
from ..result import Result

TYPE_CHECKING = False
if TYPE_CHECKING:   # typing costs `corral run` ~2 ms of imports: for the type checker only
    from typing import ClassVar, Literal

    #: how a tier answers "does the code get its own kernel?": False (it shares the
    #: host's), "user-space" (a user-space kernel such as gVisor's sits between it and the
    #: host's), or True (a kernel of its own, in a virtual machine)
    OwnKernel = Literal[False, "user-space", True]

DEFAULT_EGRESS_NOTE = ("only through the egress proxy on 127.0.0.1:3128; the sandbox has no "
                       "route and no resolver of its own")


if TYPE_CHECKING:
    from typing import assert_never
else:
    def assert_never(op) -> None:
        """The end of every match over a plan's ops: an op no case handled is a bug, and the
        tier stops there rather than run without it (the type checker proves, with the
        Op union in plan.py, that no case is missing)."""
        raise AssertionError(f"unhandled op {op!r}: every tier must handle every op "
                             f"(see backends/base.py)")


class LiveSandbox:
    """One open sandbox of a tier: a scratch area kept across execs, closed once."""

    #: a workspace in review mode: its backends.review.ReviewMount (the overlay's layers
    #: and the host workspace's fd, for runtime/changes.py), else None
    review = None

    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None, tty=None) -> Result:
        """Run argv inside and return its Result. stdin: None (/dev/null) or a readable
        fd; on_stdout/on_stderr get each chunk of bytes as it arrives.

        `tty`: a corral.linux.tty.Terminal (stdin is then None): the tier makes its pty
        (open(), or console_socket() for a runtime that makes it), gives the command the
        slave as fds 0-2 and controlling terminal, and calls start() once the command is
        started; Sandbox.exec finishes it and fills the Result's stdout."""
        raise NotImplementedError

    def close(self) -> list[str]:
        """Kill what is left, unmount, remove cgroups and scratch. Returns the teardown
        problems (each a sentence); never raises for them."""
        raise NotImplementedError


class Backend:
    """A tier. Subclasses set the class attributes and implement check, describe, open."""

    #: the value of `isolation` that selects it
    name: ClassVar[str]
    #: one line: what isolates the code ("bubblewrap + seccomp + cgroups")
    mechanism: ClassVar[str]
    own_kernel: ClassVar[OwnKernel]
    #: fixed properties of the tier that `explain` reports and the probe cites
    properties: ClassVar[dict[str, bool]]

    @property
    def egress_note(self) -> str:
        """How an allowed request leaves the sandbox on this tier (explain's network note)."""
        return DEFAULT_EGRESS_NOTE

    def auto_skip(self) -> str | None:
        """Why `isolation = "auto"` should pass this tier over on this host, or None."""
        return None

    def check(self, plan: Plan) -> list[tuple[Op, str]]:
        """The ops this tier cannot enforce on this host, each with the reason and fix.
        Raises BackendUnavailable when the tier cannot run here at all."""
        raise NotImplementedError

    def describe(self, op: Op) -> tuple[str, str]:
        """How this tier enforces an op it can enforce: (enforced_by, note), enforced_by one
        of "kernel", "supervisor", "proxy", "none"."""
        raise NotImplementedError

    def open(self, plan: Plan, events: list[dict], granted=(), upstream_ca: str | None = None
             ) -> LiveSandbox:
        """A live sandbox for a plan this tier checked. `events`: the standing events every
        Result of it carries (unenforced defaults); `granted`: the secret grants with their
        values (grants.Granted), for the proxy; `upstream_ca`: a PEM file the proxy trusts."""
        raise NotImplementedError

    def open_live(self, plan: Plan, events: list[dict], granted=(),
                  upstream_ca: str | None = None):
        """A sandbox kept running for many commands (runtime/live.py): an object with
        `start(argv, env, cwd=, stdin_fd=, tty_fd=None, cpu_seconds=None)` (cpu_seconds:
        the command's RLIMIT_CPU instead of limits.cpu_time's; passed only for
        commands.stream, run_code's interpreters, with a bound so far off that it never
        binds: the runtime bounds each cell), `release(cgroup)`, `alive()`, `close()`,
        `dir` (its RunDir), `target` (linux.enter.Target), `uid`, `gid`, `env`,
        `scratch`, `proxy` (see backends/namespace_live.py). Tiers that cannot keep one
        refuse, naming the tier that can."""
        from ..errors import BackendUnavailable

        raise BackendUnavailable(f"the {self.name} tier cannot keep a live sandbox "
                                 f"(Sandbox.create); use isolation = \"namespace\"",
                                 field="isolation")


def is_unenforced(events: list[dict], op) -> bool:
    """Whether the standing events say this op's rule is not enforced on this host."""
    return any(e.get("kind") == "unenforced" and e.get("rule") == op.rule for e in events)
