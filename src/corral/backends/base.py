"""The tier contract: what every tier provides, and all that the runtime, `explain`,
`doctor` and the probe may use of one.

A tier is a `Backend` subclass in a module of its own plus one row in the registry
(`backends/__init__.py`). The backend says which ops of a plan it cannot enforce on this
host (`check`, a typed `TierCheck` of `Gap`s) and how it enforces the others (`describe`),
then opens live sandboxes (`open(plan, check)`, on that very check) that run commands
(`LiveSandbox.exec`) until closed. Nothing outside a tier's module reaches past these names.

    check = backend.check(plan)          # TierCheck(tier, gaps): each Gap an op and why not
    check.refused                        # gaps in rules the policy set: runtime refuses
    check.events()                       # one "unenforced" event per default left out
    live = backend.open(plan, check)     # the tier sets up what check.enforces(op)
    lim = ExecLimits.from_plan(plan)     # what every tier's exec reads of the limits
"""

from __future__ import annotations

from .._record import Record
from ..plan import CpuTime, MemoryLimit, Op, OutputCap, PidsLimit, Plan, Rlimit, WallClock
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

    #: a workspace in review mode: its backends.host.review.ReviewMount (the overlay's layers
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

    def check(self, plan: Plan) -> TierCheck:
        """What this tier cannot enforce of the plan on this host: a TierCheck (build it
        with `TierCheck.of(self.name, plan, [(op, reason and fix), ...])`), which `open`
        then takes. Raises BackendUnavailable when the tier cannot run here at all."""
        raise NotImplementedError

    def describe(self, op: Op) -> tuple[str, str]:
        """How this tier enforces an op it can enforce: (enforced_by, note), enforced_by one
        of "kernel", "supervisor", "proxy", "none"."""
        raise NotImplementedError

    def open(self, plan: Plan, check: TierCheck, granted=(), upstream_ca: str | None = None
             ) -> LiveSandbox:
        """A live sandbox for a plan and this tier's check of it (`check.admit(self.name)`
        first): `check.enforces(op)` says which ops to set up, `check.events()` are the
        standing events every Result of it carries (the defaults left unenforced);
        `granted`: the secret grants with their values (grants.Granted), for the proxy;
        `upstream_ca`: a PEM file the proxy trusts."""
        raise NotImplementedError

    def open_live(self, plan: Plan, check: TierCheck, granted=(),
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


def is_explicit(rule: str, plan: Plan) -> bool:
    """Whether the policy set this rule (or a rule under it) itself, rather than leaving
    it at its default."""
    return bool(rule) and (rule in plan.explicit or any(
        e.startswith(rule + ".") for e in plan.explicit) or (
        rule == "network.mode" and any(e.startswith("network.") for e in plan.explicit)))


class Gap(Record):
    """One op of a plan that a tier cannot enforce on this host."""

    op: Op
    #: why not, and the fix ("no usable memory cgroup: ...")
    reason: str
    #: the policy set this rule itself: the run is refused (nothing runs); else the rule
    #: is a default, and the run goes ahead with an "unenforced" event saying so
    explicit: bool = False
    #: the tiers that could enforce it on this host, in the registry's order: filled by
    #: runtime.tiers for a refusal (asking every other tier costs a run's start, so a
    #: default left unenforced does not ask)
    could: tuple = ()

    @property
    def rule(self) -> str:
        """The policy rule ("limits.memory"), or the op's type for an op of the tier
        itself ("Namespaces")."""
        return self.op.rule or type(self.op).__name__


class TierCheck(Record):
    """A tier's answer to `check(plan)`, which its `open(plan, check)` takes: the ops it
    cannot enforce here, each a Gap. Read by the runtime (refuse or run), explain (the
    "none" rows), doctor and the tier itself (what to leave out at set-up)."""

    tier: str
    gaps: tuple = ()

    @classmethod
    def of(cls, tier: str, plan: Plan, missing) -> TierCheck:
        """From a tier's (op, reason) pairs, each marked explicit or default by the plan."""
        return cls(tier, tuple(Gap(op, why, is_explicit(op.rule, plan)) for op, why in missing))

    @property
    def refused(self) -> tuple:
        """The gaps in rules the policy set: the tier must not run this plan."""
        return tuple(g for g in self.gaps if g.explicit)

    @property
    def unenforced(self) -> tuple:
        """The gaps in defaults: the run goes ahead, and every Result says so."""
        return tuple(g for g in self.gaps if not g.explicit)

    def gap(self, op: Op) -> Gap | None:
        for g in self.gaps:
            if g.op is op or g.op == op:
                return g
        return None

    def enforces(self, op: Op) -> bool:
        return self.gap(op) is None

    def events(self) -> list[dict]:
        """The standing events of every Result of a sandbox opened on this check: one
        "unenforced" event per default left unenforced (fresh dicts on every call)."""
        defaults = [g for g in self.gaps if not g.explicit]
        if not defaults:
            return []
        from ..events import UnenforcedEvent  # only when there is one: off a plain run's path

        return [UnenforcedEvent(g.rule, self.tier, g.reason).to_dict() for g in defaults]

    def admit(self, tier: str) -> TierCheck:
        """The check, for `tier`'s open(): a check of another tier, or one that refuses
        the plan, is a bug in the caller, and nothing is opened on it."""
        if self.tier != tier or self.refused:
            raise AssertionError(f"the {tier} tier was opened on {self!r}: open() takes "
                                 f"that tier's own check, with nothing refused")
        return self


class ExecLimits(Record):
    """The per-exec limits of a plan, as one typed record: what every tier's exec reads
    instead of looking each op up by type.

        lim = ExecLimits.from_plan(plan, timeout)
        lim.wall, lim.cpu, lim.cap, lim.rlimits["nofile"], lim.memory, lim.pids
    """

    wall: float                       # seconds of wall clock (the exec's timeout, if given)
    cpu: float                        # seconds of CPU time, summed over the run
    cap: int                          # bytes kept of each output stream
    rlimits: dict                     # {"nofile" | "fsize" | "core": value}
    memory: int                       # bytes, swap and scratch pages included
    pids: int                         # processes and threads alive at once

    @classmethod
    def from_plan(cls, plan: Plan, timeout: float | None = None) -> ExecLimits:
        """Every plan has exactly one op of each of these (plan.build_plan makes them)."""
        (wall,), (cpu,), (cap,) = plan.find(WallClock), plan.find(CpuTime), plan.find(OutputCap)
        (memory,), (pids,) = plan.find(MemoryLimit), plan.find(PidsLimit)
        return cls(wall=wall.seconds if timeout is None else timeout, cpu=cpu.seconds,
                   cap=cap.bytes, rlimits={op.name: op.value for op in plan.find(Rlimit)},
                   memory=memory.bytes, pids=pids.count)
