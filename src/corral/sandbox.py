"""The public lifecycle: Sandbox (create, exec, close) and run().

    with corral.Sandbox({"limits": {"memory": "1G"}}) as sb:
        sb.exec(["python3", "-c", "open('/scratch/x', 'w').write('kept')"])
        print(sb.exec(["cat", "/scratch/x"]).stdout)      # /scratch persists between execs

Each exec is a fresh set of namespaces and a fresh cgroup; its processes end with it.
"""

from __future__ import annotations

import os

from .errors import BackendUnavailable, UnsupportedRule
from .plan import Plan, build_plan
from .policy import Policy, load_policy, policy_from_dict
from .result import Result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def coerce_policy(policy: Policy | dict | str | os.PathLike | None) -> Policy:
    """A Policy from a Policy, a dict in the TOML layout, or a TOML file path."""
    if policy is None:
        return Policy()
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, dict):
        return policy_from_dict(policy)
    return load_policy(os.fspath(policy))


def _is_explicit(rule: str, plan: Plan) -> bool:
    return bool(rule) and (rule in plan.explicit or any(
        e.startswith(rule + ".") for e in plan.explicit) or (
        rule == "network.mode" and any(e.startswith("network.") for e in plan.explicit)))


def check_tier(tier: str, plan: Plan):
    """(backend, refusals, unenforced) for a tier: refusals are the (op, reason) pairs of
    explicit rules it cannot enforce. Raises BackendUnavailable."""
    from .backends import get_backend

    backend = get_backend(tier)
    missing = backend.check(plan)
    refusals = [(op, why) for op, why in missing if _is_explicit(op.rule, plan)]
    unenforced = [(op, why) for op, why in missing if not _is_explicit(op.rule, plan)]
    return backend, refusals, unenforced


def _tiers_that_could(rule: str, plan: Plan, skip: str) -> list[str]:
    from .backends import KNOWN

    could = []
    for tier in KNOWN:
        if tier == skip:
            continue
        try:
            _, refusals, _ = check_tier(tier, plan)
        except BackendUnavailable:
            continue
        if not any(op.rule == rule for op, _ in refusals):
            could.append(tier)
    return could


def prepare(policy: Policy, host_env: Mapping[str, str] | None = None):
    """Plan the policy and check it against the tier: (backend, plan, standing events).

    A rule the user set explicitly that the tier cannot enforce raises UnsupportedRule
    naming the rule and a tier that could (nothing runs); a default it cannot enforce
    becomes an "unenforced" event. `isolation = "auto"` takes the first tier of
    AUTO_ORDER that is available here and enforces every explicit rule."""
    from .backends import AUTO_ORDER

    plan = build_plan(policy, os.environ if host_env is None else host_env)
    if plan.tier == "auto":
        reasons = []
        for tier in AUTO_ORDER:
            try:
                backend, refusals, unenforced = check_tier(tier, plan)
            except BackendUnavailable as e:
                reasons.append(f"{tier}: {e.message}")
                continue
            skip = getattr(backend, "auto_skip", lambda: None)()
            if skip:
                reasons.append(f"{tier}: {skip}")
                continue
            if not refusals:
                break
            reasons.append(f"{tier}: cannot enforce {refusals[0][0].rule}")
        else:
            raise BackendUnavailable("no tier here enforces this policy: " + "; ".join(reasons),
                                     field="isolation")
    else:
        backend, refusals, unenforced = check_tier(plan.tier, plan)
        if refusals:
            op, reason = refusals[0]
            could = _tiers_that_could(op.rule, plan, backend.name)
            hint = (f"; isolation = \"{could[0]}\" could" if could
                    else "; no tier available here could")
            raise UnsupportedRule(f"the {backend.name} tier cannot enforce it on this host: "
                                  f"{reason}{hint}", field=op.rule)
    events = [{"kind": "unenforced", "rule": op.rule or type(op).__name__,
               "tier": backend.name, "reason": why} for op, why in unenforced]
    return backend, plan, events


class Sandbox:
    """A live sandbox: one policy, a scratch area kept across execs, closed on exit."""

    def __init__(self, policy: Policy | dict | str | None = None, *,
                 env: Mapping[str, str] | None = None) -> None:
        self.policy = coerce_policy(policy)
        host_env = os.environ if env is None else env   # read here, by name (env.pass)
        self._backend, self.plan, self._events = prepare(self.policy, host_env)
        self._granted = []
        if self.policy.secrets:  # read the values now: a missing one is an error, not a run
            from .grants import resolve
            from .plan import EgressProxy

            (proxy,) = self.plan.find(EgressProxy)
            self._granted = resolve(self.policy, dict(proxy.grants), host_env)
        self._live = None
        self._pid = 0

    @property
    def isolation(self) -> str:
        return self._backend.name

    def open(self) -> Sandbox:
        if self._live is None:
            self._live = self._backend.open(self.plan, self._events, self._granted,
                                            self.policy.network.upstream_ca)
            self._pid = os.getpid()
            _close_at_exit(self._live)
        return self

    def exec(self, argv: list[str], *, stdin: int | bytes | None = None, timeout: float | None = None,
             on_stdout=None, on_stderr=None) -> Result:
        """Run argv inside. stdin: None (/dev/null), bytes, or a readable fd (not a tty).

        on_stdout / on_stderr, if given, are called with each chunk of output as it
        arrives, as **bytes** (up to limits.output per stream, like the Result): a chunk
        is whatever one read returned, so it may end inside a UTF-8 sequence, and the
        output need not be text at all. The Result's stdout and stderr are the whole
        streams decoded as UTF-8 with invalid bytes replaced; wrap a callback in
        `corral.TextChunks(fn)` to get str chunks decoded the same way as they arrive."""
        self.open()
        fd, close_fd = _stdin_fd(stdin)
        try:
            return self._live.exec(list(argv), stdin=fd, on_stdout=on_stdout,
                                   on_stderr=on_stderr, timeout=timeout)
        finally:
            if close_fd:
                os.close(fd)

    def close(self) -> list[str]:
        """Kill what is left, unmount, delete scratch. Returns teardown problems. In a
        forked child of the process that opened it, only forgets it: it is the parent's."""
        live, self._live = self._live, None
        if live is None or self._pid != os.getpid() or live not in _left_open:
            return []   # not open, its parent's, or closed already by the exit hook
        _left_open.discard(live)
        return live.close()

    def __enter__(self) -> Sandbox:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_live", None) is not None:
            self.close()


#: the live (backend) sandboxes this process opened and has not closed, closed by an
#: atexit hook (a Sandbox dropped without close() still closes its own, in __del__), and
#: the process they belong to (a forked child inherits the set, not the sandboxes)
_left_open: set = set()
_left_open_pid = 0


def _close_at_exit(live) -> None:
    global _left_open, _left_open_pid
    if _left_open_pid != os.getpid():
        import atexit

        _left_open, _left_open_pid = set(), os.getpid()
        # after the cgroup pool's drain was registered (at import), so it runs before it
        atexit.register(_close_left_open, _left_open_pid)
    _left_open.add(live)


def _close_left_open(pid: int) -> None:
    while pid == os.getpid() and _left_open:
        _left_open.pop().close()


def _stdin_fd(stdin) -> tuple[int | None, bool]:
    if stdin is None:
        return None, False
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        fd = os.memfd_create("corral-stdin", os.MFD_CLOEXEC)
        os.write(fd, bytes(stdin))
        os.lseek(fd, 0, os.SEEK_SET)
        return fd, True
    if isinstance(stdin, int):
        if os.isatty(stdin):
            from .errors import UsageError

            raise UsageError("stdin is a terminal; a sandbox never gets the caller's "
                             "terminal: pipe the input in instead", field="--stdin")
        return stdin, False
    raise TypeError("stdin must be None, bytes or a file descriptor")


class TextChunks:
    """An on_stdout / on_stderr callback that passes `fn` str instead of bytes: the chunks
    decoded as UTF-8 incrementally (a sequence split between two chunks is decoded whole
    once its end arrives; invalid bytes become U+FFFD, as in Result.stdout). Call
    `close()` after the exec for a sequence the output left unfinished.

        sb.exec(argv, on_stdout=corral.TextChunks(print_text))
    """

    def __init__(self, fn) -> None:
        import codecs

        self.fn = fn
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if text:
            self.fn(text)

    def close(self) -> None:
        text = self._decoder.decode(b"", final=True)
        if text:
            self.fn(text)


def run(argv: list[str], policy: Policy | dict | str | None = None, **kw) -> Result:
    """Run one command in a fresh sandbox and return its Result."""
    with Sandbox(policy) as sb:
        return sb.exec(argv, **kw)


__all__ = ["Sandbox", "TextChunks", "run", "coerce_policy", "prepare", "Plan"]
