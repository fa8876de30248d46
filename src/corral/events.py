"""The events a Result carries: what a limit stopped, what a tier could not enforce, what
went wrong at teardown, what the egress proxy decided, where a secret was sent. This is
the audit schema.

Each kind is a frozen record; `to_dict()` gives the plain dict that `Result.events` holds
and `Result.to_json()` prints ("kind" first, then the fields in order, optional fields
only when set). Build them with the class methods, so each message is written once.

    kind         fields
    limit        limit, stream (output only), message
    unenforced   rule, tier, reason
    teardown     message
    notice       message (informative: the outcome is unchanged)
    exec         command, errno (a name such as "ENOENT"), message
    net          host, port, decision ("allow" | "deny"), reason, bytes_in, bytes_out
    secret       name, host, port, decision ("injected" | "withheld" | ...), reason
    audit        message (the audit store lost this run's record: the run went on)
    syscall      name, number, errno (a name such as "EPERM"), count, message (only for the
                 entry counting the numbers past the per-command cap): calls the seccomp
                 profile refused, where the path observes them (docs/audit.md)
    refused      error (the error's kind: "policy", "unsupported", "unavailable", "ceiling",
                 ...), field (the rule or key, when one), message: the run never started
"""

from __future__ import annotations

from ._record import Record


class Event(Record):
    KIND = ""

    def to_dict(self) -> dict:
        d = {"kind": self.KIND}
        for f in self._fields:
            v = getattr(self, f)
            if v is not None:
                d[f] = v
        return d


class LimitEvent(Event):
    KIND = "limit"
    limit: str
    stream: str | None = None
    message: str = ""

    @classmethod
    def timeout(cls, seconds: float) -> LimitEvent:
        return cls("timeout", message=f"wall clock limit of {seconds:g}s reached; every "
                                      f"process of the run was killed")

    @classmethod
    def cpu_time(cls, seconds: float) -> LimitEvent:
        return cls("cpu_time", message=f"CPU time limit of {seconds:g}s reached; every "
                                       f"process of the run was killed")

    @classmethod
    def memory(cls, kills: int, limit: int) -> LimitEvent:
        return cls("memory", message=f"the memory cgroup killed {kills} process(es) at the "
                                     f"{limit} byte limit")

    @classmethod
    def output(cls, stream: str, cap: int) -> LimitEvent:
        return cls("output", stream, f"{stream} past {cap} bytes was dropped")

    @classmethod
    def terminal_output(cls, cap: int) -> LimitEvent:
        return cls("output", "stdout", f"terminal output past {cap} bytes was not kept in "
                                       f"the Result (all of it was shown)")

    @classmethod
    def scratch_full(cls) -> LimitEvent:
        return cls("scratch", message="/scratch (with /tmp and /dev/shm) is full")

    @classmethod
    def scratch_inodes(cls) -> LimitEvent:
        return cls("scratch_inodes", message="/scratch ran out of inodes")


class ExecEvent(Event):
    """The command never started: its name, the errno of the failed exec, corral's line."""
    KIND = "exec"
    command: str
    errno: str
    message: str


class UnenforcedEvent(Event):
    KIND = "unenforced"
    rule: str
    tier: str
    reason: str


class TeardownEvent(Event):
    KIND = "teardown"
    message: str


class NoticeEvent(Event):
    """Something worth knowing that changed nothing of the run's outcome (the egress
    proxy's zygote was replaced, say)."""

    KIND = "notice"
    message: str


class NetEvent(Event):
    KIND = "net"
    host: str
    port: int
    decision: str
    reason: str
    bytes_in: int = 0
    bytes_out: int = 0


class SecretEvent(Event):
    KIND = "secret"
    name: str
    host: str
    port: int
    decision: str
    reason: str


class AuditEvent(Event):
    """The audit store (corral.audit) could not keep this run's record: the run itself
    went on unchanged."""

    KIND = "audit"
    message: str

    @classmethod
    def lost(cls, why: str) -> AuditEvent:
        return cls(f"the audit record of this run was lost: {why} (the run itself was "
                   f"not affected; see docs/audit.md)")


class SyscallEvent(Event):
    """Calls of one syscall the seccomp profile refused during a command, with the errno
    it answered (the same as unobserved) and how many times: observed only where corral
    loads the program itself (a live namespace-tier sandbox, a process-tier run), with
    [audit] syscalls or in learn mode (linux/seccomp_notify.py)."""

    KIND = "syscall"
    name: str
    number: int
    errno: str
    count: int
    message: str | None = None

    @classmethod
    def others(cls, count: int, cap: int) -> SyscallEvent:
        return cls("other", -1, "", count, f"refused calls of syscalls past the first "
                                          f"{cap} distinct ones, counted together")


class RefusedEvent(Event):
    """corral refused the run before it started (a policy error, a rule the tier cannot
    enforce, no tier here, beyond a service token's ceiling): the one event of a run
    recorded with the verdict "refused" (audit/record.py: record_refused)."""

    KIND = "refused"
    error: str
    field: str | None = None
    message: str = ""


KINDS = {c.KIND: c for c in (LimitEvent, ExecEvent, UnenforcedEvent, TeardownEvent, NetEvent,
                             SecretEvent, NoticeEvent, AuditEvent, RefusedEvent,
                             SyscallEvent)}
