"""The public lifecycle: Sandbox (create, exec, close) and run().

    with corral.Sandbox({"limits": {"memory": "1G"}}) as sb:
        sb.exec(["python3", "-c", "open('/scratch/x', 'w').write('kept')"])
        print(sb.exec(["cat", "/scratch/x"]).stdout)      # /scratch persists between execs

Each exec is a fresh set of namespaces and a fresh cgroup; its processes end with it.
"""

from __future__ import annotations

import os
import sys as _sys
import time

from ..audit import record as _audit
from ..errors import CorralError
from ..plan import Plan
from ..policy import Policy
from ..result import Result
from .tiers import coerce_policy, prepare

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class Sandbox:
    """A live sandbox: one policy, a scratch area kept across execs, closed on exit."""

    #: whether corral starts each command itself (runtime/live.py's Live), which is what
    #: [audit] syscalls needs (docs/audit.md, "Refused syscalls")
    _STARTS_COMMANDS = False

    def __init__(self, policy: Policy | dict | str | None = None, *,
                 env: Mapping[str, str] | None = None, backend=None,
                 learn: bool = False, _argv: list[str] | None = None) -> None:
        """`backend`: a tier's Backend instance to use instead of the policy's isolation
        (for tests of the faces with backends.fake.FakeBackend). `learn`: learn mode
        (runtime/learn.py): a permissive run that records what it needed;
        `learned_policy()` then writes the policy that would have let it succeed.
        A policy refused here (PolicyError, UnsupportedRule, ...) is recorded in the audit
        store as a run with the verdict "refused" (`_argv`: the command it was for)."""
        try:
            self._set_up(policy, env, backend, learn)
        except CorralError as e:
            refused(e, _argv or [], policy)
            raise
        self._fresh_state()

    def _fresh_state(self) -> None:
        self._live = None
        self._pid = 0
        #: the Result of the last exec: close() adds its teardown problems to its events
        self._last: Result | None = None
        #: what went wrong when the sandbox was closed (each a sentence); also added to the
        #: last Result's events as "teardown" events, so run() and the CLI show them
        self.teardown_problems: list[str] = []
        self._files = None
        self._code = None       # the code contexts (runtime.session), made on first use
        #: the audit store's (face, actor) of whoever made it, and the last exec's run id
        self._audit_origin = _audit.origin()
        self.last_run_id: str | None = None
        self.last_run_started: float | None = None

    def _set_up(self, policy, env, backend, learn: bool) -> None:
        if learn and isinstance(policy, dict):   # its network is the proxy, in learn mode
            net = policy.get("network")
            policy = {**policy, "network": {"mode": "allow",
                                            **(net if isinstance(net, dict) else {})}}
        self.policy = coerce_policy(policy)
        if self.policy.install.requested():   # [install]: the installed image, made once
            from ..images.policy_install import resolve_install

            self.policy = resolve_install(self.policy)
        self._learner = None
        if learn:
            from .learn import Learner, learn_policy

            self._learner = Learner(self.policy)
            self.policy = learn_policy(self.policy)
        host_env = os.environ if env is None else env   # read here, by name (env.pass)
        self._backend, self.plan, self._check = prepare(self.policy, host_env, backend,
                                                        learn=learn)
        if (self.policy.audit.syscalls and not self._STARTS_COMMANDS
                and not getattr(self._backend, "observes_syscalls", False)):
            from ..errors import UnsupportedRule

            raise UnsupportedRule(
                f"a one-shot run on the {self._backend.name} tier cannot report refused "
                f"syscalls (its seccomp program is not loaded by corral); drop [audit] "
                f"syscalls, or use a live sandbox of the namespace tier "
                f"(corral.Sandbox.create, corral sandbox create) or the process tier",
                field="audit.syscalls")
        self._granted = []
        if self.policy.secrets:  # read the values now: a missing one is an error, not a run
            from ..grants import resolve
            from ..plan import EgressProxy

            (proxy,) = self.plan.find(EgressProxy)
            self._granted = resolve(self.policy, dict(proxy.grants), host_env)

    def _sibling(self) -> Sandbox:
        """A new, unopened sandbox of this one's policy, with its plan, tier check and
        secret values as they were made for this one (nothing planned or checked again;
        each grant's ttl counted from the sibling's making): for a pool of like sandboxes
        made ahead (scale/node.py's Warm)."""
        if self._learner is not None:
            from ..errors import UsageError

            raise UsageError("a sandbox in learn mode has no siblings; make each with "
                             "learn=True", field="learn")
        sb = object.__new__(type(self))
        sb.policy, sb._learner, sb._backend = self.policy, None, self._backend
        sb.plan, sb._check = self.plan, self._check
        if self._granted:
            import time

            from ..grants import Granted

            # the values as read for this one; each grant's ttl counts from now (the
            # sibling's making, before it opens), not from this one's
            now = time.time()
            sb._granted = [Granted(g.secret, g.placeholder, g.value, now + g.secret.ttl)
                           for g in self._granted]
        else:
            sb._granted = []
        sb._fresh_state()
        sb._audit_origin = self._audit_origin
        return sb

    @classmethod
    def create(cls, policy: Policy | dict | str | None = None, *, timeout: float = 300,
               metadata: Mapping[str, str] | None = None,
               env: Mapping[str, str] | None = None, backend=None, detached: bool = False,
               learn: bool = False, user_account: bool = False):
        """A live sandbox: one set of namespaces kept for many commands (sb.commands),
        ended by sb.kill(), by its timeout (seconds) or when its init dies. See
        runtime/live.py and docs/sessions.md. detached=True: a supervisor process of its
        own keeps it (it outlives this process; others reach it with connect(id)).
        learn=True: learn mode (runtime/learn.py; not with detached).
        user_account=True: an unprivileged account beside its root (uid 1000 inside, a
        host uid of its own, home /home/user): commands.run(..., user="user"); the
        namespace tier only, with corral as root."""
        if detached and learn:
            from ..errors import UsageError

            raise UsageError("learn mode needs the sandbox in this process: drop "
                             "detached=True (or learn=True)", field="learn")
        if detached and user_account:
            from ..errors import UsageError

            raise UsageError("user_account: not for a detached sandbox (yet); create it "
                             "in this process", field="user_account")
        if detached:
            from .remote import connect
            from .supervisor import start_detached

            return connect(start_detached(coerce_policy(policy), timeout=timeout,
                                          metadata=metadata, env=env))
        from .live import Live

        return Live(policy, timeout=timeout, metadata=metadata, env=env, backend=backend,
                    learn=learn, user_account=user_account)

    @staticmethod
    def connect(sandbox_id: str):
        """A live sandbox that a supervisor process keeps (created with detached=True or
        by `corral sandbox create`), from any process of the same uid on this host."""
        from .remote import connect

        return connect(sandbox_id)

    @property
    def isolation(self) -> str:
        return self._backend.name

    def open(self) -> Sandbox:
        if self._live is None:
            self._live = self._backend.open(self.plan, self._check, self._granted,
                                            self.policy.network.upstream_ca)
            self._pid = os.getpid()
            _close_at_exit(self._live)
            observe = getattr(self._live, "observe_syscalls", None)   # the process tier
            if observe is not None and (self.policy.audit.syscalls
                                        or self._learner is not None):
                observe()
                if self._learner is not None:
                    self._learner.observing_syscalls()
        return self

    def exec(self, argv: list[str], *, stdin: int | bytes | None = None, timeout: float | None = None,
             on_stdout=None, on_stderr=None, tty: bool = False,
             tty_size: tuple[int, int] | None = None) -> Result:
        """Run argv inside. stdin: None (/dev/null), bytes, or a readable fd (not a tty).

        on_stdout / on_stderr, if given, are called with each chunk of output as it
        arrives, as **bytes** (up to limits.output per stream, like the Result): a chunk
        is whatever one read returned, so it may end inside a UTF-8 sequence, and the
        output need not be text at all. The Result's stdout and stderr are the whole
        streams decoded as UTF-8 with invalid bytes replaced; wrap a callback in
        `corral.TextChunks(fn)` to get str chunks decoded the same way as they arrive.

        tty=True: the command gets a pseudo-terminal of its own as stdin, stdout, stderr and
        controlling terminal (see corral.linux.tty); `stdin` (None, bytes, or a readable fd, which
        may be the caller's terminal) is typed into it, on_stdout gets everything it shows,
        uncapped, and the Result's stdout keeps the first limits.output bytes of that one
        stream (stderr is empty; on_stderr is not called). tty_size: (rows, cols); by
        default the size of a terminal stdin (followed as it changes when called from the
        main thread), else 24x80."""
        self.open()
        run_id, started = _audit.new_id(), time.time()
        fd, close_fd = _stdin_fd(stdin, tty=tty)
        try:
            if not tty:
                result = self._live.exec(list(argv), stdin=fd, on_stdout=on_stdout,
                                         on_stderr=on_stderr, timeout=timeout)
            else:
                result = self._exec_tty(list(argv), fd, on_stdout, timeout, tty_size)
        finally:
            if close_fd:
                os.close(fd)
        self._last = result
        if self._learner is not None:
            self._learner.add(result)
        self.last_run_id, self.last_run_started = run_id, started
        if getattr(self, "audit_runs", True):   # False: its owner records it (scale/node.py)
            _audit.record_run(run_id, started, result, policy=self.policy, plan=self.plan,
                              argv=list(argv), isolation=self.isolation,
                              origin=self._audit_origin, stdin=stdin)
        return result

    @property
    def files(self):
        """The files API (corral.runtime.files) on what outlives each exec: /scratch, /tmp,
        /dev/shm and the workspace (namespace and gvisor tiers)."""
        if self._files is None:
            from ..backends.host.views import persistent_mounts
            from .files import Files

            self.open()
            mounts = persistent_mounts(self._live)
            try:
                self._files = Files.over_mounts(mounts, self._live.uid, self._live.gid,
                                                cwd=self.plan.cwd)
            finally:
                for _, fd, _ in mounts:
                    os.close(fd)
        return self._files

    @property
    def pty(self):
        """Terminals inside: `sb.pty.create(cols, rows, cmd="bash", on_data=...)`
        (corral.runtime.pty)."""
        from .pty import Pty

        return Pty.for_sandbox(self)

    def _exec_tty(self, argv, stdin, on_output, timeout, size) -> Result:
        from ..linux.tty import Terminal
        from ..plan import OutputCap

        cap = self.plan.find(OutputCap)[0].bytes
        term = Terminal(stdin, on_output, cap, size)
        try:
            result = self._live.exec(argv, stdin=None, timeout=timeout, tty=term)
        except BaseException:
            term.finish(errors=False)   # the run's own error is the one to see
            raise
        text = term.finish()
        result.stdout, result.stdout_truncated = text, term.truncated
        result.stderr, result.stderr_truncated = "", False
        if term.truncated:
            from ..events import LimitEvent

            result.events.append(LimitEvent.terminal_output(cap).to_dict())
        return result

    # -- write review (a workspace in mode "review": runtime/changes.py) -----------------
    def _review(self):
        from ..errors import UsageError

        if self._live is None and self._pid:
            raise UsageError("the sandbox is closed, and its changes went with it; list "
                             "and apply them before close() (or the end of `with`)",
                             field="review")
        self.open()
        review = getattr(self._live, "review", None)
        if review is None:
            raise UsageError("the workspace is not in review mode; set filesystem.workspace "
                             "mode = \"review\" (corral run --workspace PATH:review)",
                             field="filesystem.workspace.mode")
        return review

    def changes(self) -> list:
        """What the sandbox changed in the workspace so far (runtime.changes.Change:
        added, modified, deleted; mode, sizes, a diff of text files, conflicts and
        refusals), the host workspace itself untouched."""
        from .changes import list_changes

        return list_changes(self._review())

    def apply_changes(self, paths=None, *, exact: bool = False):
        """Copy the changes at or below `paths` (None: all; exact=True: only those paths,
        with the new directories they need) to the host workspace, except conflicts (the
        host changed the path while the sandbox ran) and refusals (a link out of the
        workspace, a device node, FIFO or socket, set-id bits). Returns a
        runtime.changes.Applied (applied, conflicts, refused)."""
        from .changes import apply

        return apply(self._review(), paths, exact=exact)

    def discard_changes(self) -> None:
        """Forget every change: the workspace looks inside as the host's is (no command
        may be running)."""
        self._review().discard()

    def changes_patch(self, paths=None) -> tuple[bytes, list]:
        """The changes as a git-style patch (`git apply` takes it), and [(path, why)] of
        those it leaves out (refusals, conflicts, directories, files over 64 MiB)."""
        from .changes import patch

        return patch(self._review(), paths)

    # --- learn mode (runtime/learn.py) ---

    def _learning(self):
        from ..errors import UsageError

        if self._learner is None:
            raise UsageError("this sandbox is not in learn mode; make it with learn=True",
                             field="learn")
        if self.policy.filesystem.workspace is not None and (self._live is not None
                                                             or not self._pid):
            self._learner.add_changes(self.changes())
        return self._learner

    def learned(self) -> dict:
        """What the commands so far needed (hosts and ports, refusals, peak memory, wall
        and CPU time, workspace writes): runtime.learn.Learner.observed()."""
        return self._learning().observed()

    def learned_policy(self, margin: float = 1.5) -> str:
        """The least-privilege policy (TOML, each rule commented with the observation that
        produced it) that would have let the commands so far succeed; limits are the use
        times `margin`. Call it before close() when there is a workspace."""
        return self._learning().policy_toml(margin)

    # --- run_code and code contexts: runtime.session (imported on first use) ---

    def _code_session(self):
        if self._code is None:
            from .session import CodeSession

            self.open()
            self._code = CodeSession(self)
        return self._code

    def run_code(self, code: str, *, language: str | None = None, context=None,
                 timeout: float | None = None, on_stdout=None, on_stderr=None,
                 on_result=None, on_error=None, env=None):
        """Run a cell in a persistent interpreter and return its Execution (results,
        logs, error, execution_count: E2B's shape). See runtime.session and
        docs/sessions.md; language "python" (the default), "javascript" or "bash".
        env: variables set for this cell only (put back after it; python and
        javascript)."""
        extra = {"env": env} if env else {}
        return self._code_session().run_code(
            code, language=language, context=context, timeout=timeout, on_stdout=on_stdout,
            on_stderr=on_stderr, on_result=on_result, on_error=on_error, **extra)

    def create_context(self, language: str = "python", cwd: str | None = None, *,
                       engine: str | None = None):
        """A code context (runtime.session.CodeSession.create_context): engine "auto"
        (an IPython kernel where the image's python has ipykernel, else corral's runner),
        "ipykernel" or "runner"."""
        return self._code_session().create_context(language, cwd, engine=engine)

    def list_contexts(self) -> list:
        return self._code_session().list_contexts() if self._code else []

    def restart_context(self, context) -> None:
        self._code_session().restart_context(context)

    def remove_context(self, context) -> None:
        self._code_session().remove_context(context)

    def close(self, *, _defer: bool = False) -> list[str]:
        """Kill what is left, unmount, delete scratch. Returns teardown problems. In a
        forked child of the process that opened it, only forgets it: it is the parent's.
        `_defer` (run()'s one-shot sandbox): a tier that can (the namespace tier) leaves
        the removal of what is left empty to its teardown thread (backends/host/
        deferred.py); its problems then reach a later Result (run() below)."""
        files, self._files = self._files, None
        if files is not None:
            files.close()

        code, self._code = self._code, None
        if code is not None and self._pid == os.getpid():
            code.close()
        live, self._live = self._live, None
        if live is None or self._pid != os.getpid() or live not in _left_open:
            return []   # not open, its parent's, or closed already by the exit hook
        _left_open.discard(live)
        if _defer and self.last_run_id is not None and getattr(live, "defers_teardown", False):
            problems = live.close(defer_as=self.last_run_id)
        else:
            problems = live.close()
        if problems:
            self.teardown_problems += problems
            if self._last is not None:   # kept, never dropped: the last Result carries them
                from ..events import TeardownEvent  # off the path of a run that went well

                events = [TeardownEvent(p).to_dict() for p in problems]
                self._last.events += events
                if self.last_run_id is not None:
                    _audit.record_events(self.last_run_id, events)
        return problems

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


def _stdin_fd(stdin, *, tty: bool = False) -> tuple[int | None, bool]:
    if stdin is None:
        return None, False
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        fd = os.memfd_create("corral-stdin", os.MFD_CLOEXEC)
        os.write(fd, bytes(stdin))
        os.lseek(fd, 0, os.SEEK_SET)
        return fd, True
    if isinstance(stdin, int):
        if os.isatty(stdin) and not tty:  # with tty, only its bytes are relayed
            from ..errors import UsageError

            raise UsageError("stdin is a terminal; a sandbox never gets the caller's "
                             "terminal: pipe the input in instead, or use -t/--tty for a "
                             "terminal of the sandbox's own", field="--stdin")
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


def refused(e: CorralError, argv, policy) -> None:
    """Record a run refused before it started (audit.record.record_refused), once."""
    if getattr(e, "audit_recorded", False):
        return
    e.audit_recorded = True
    _audit.record_refused(argv, e.kind, e.message, e.field,
                          policy=policy if isinstance(policy, Policy) else None)


def run(argv: list[str], policy: Policy | dict | str | None = None, **kw) -> Result:
    """Run one command in a fresh sandbox and return its Result.

    Every process of the run is gone when it returns; on the namespace tier the removal
    of its emptied scratch tmpfs, run directory and cgroups may still be under way on a
    background thread (backends/host/deferred.py). A problem there reaches the Result of
    the next run() of the same thread as a "teardown" event naming the run it belongs to
    (and that run's audit record), or stderr at exit; never another thread's Result."""
    sb = Sandbox(policy, _argv=argv)
    try:
        sb.open()
        if getattr(sb._live, "defers_teardown", False):
            sb._live.one_shot = True     # one exec, then close(_defer=True): see namespace.py
        result = sb.exec(argv, **kw)
    except BaseException:
        sb.close()
        raise
    sb.close(_defer=True)
    deferred = _sys.modules.get("corral.backends.host.deferred")
    if deferred is not None:
        _earlier_teardown(result, deferred.DEFERRED.take_problems(this_thread=True))
    return result


def _earlier_teardown(result: Result, problems) -> None:
    """Problems of the deferred teardown of this thread's earlier runs: "teardown" events
    of this Result, naming the run, and of that run's own audit record."""
    if not problems:
        return
    from ..events import TeardownEvent

    for run_id, dir_id, p in problems:
        result.events.append(TeardownEvent(
            f"an earlier run's teardown (run {run_id}, run dir {dir_id}): {p}").to_dict())
        if run_id is not None:
            _audit.record_events(run_id, [TeardownEvent(p).to_dict()])


__all__ = ["Sandbox", "TextChunks", "run", "coerce_policy", "prepare", "Plan"]
