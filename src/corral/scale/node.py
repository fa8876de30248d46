"""One machine's side of a batch: its warm sandboxes and running one job in one.

`NodeRunner.run(wire)` takes a job as it travels (scale/jobs.Job.to_wire(), with the
batch's policy as a dict) and returns its output line as a dict: the Result's JSON fields
plus `id`, `node`, `attempt`, `run_id`, `started`, `ended` and a `receipt` signed with
this machine's key (audit/receipt.py); or, when the job was refused, `id`, `node`,
`attempt` and `error` ({kind, field, message}: the usual one-line error). Everything is
checked again here, whoever sent it: the job's fields, its policy within the batch's, and
whether this machine's corral can enforce that policy (a tier that cannot refuses, as
`corral run` would: the job never runs weaker).

Sandboxes: every job is one exec in a sandbox (runtime/sandbox.py: fresh namespaces and
a fresh cgroup for the command; every process of it ends with it). By default each job
gets a sandbox nobody used, taken from a warm pool (Warm: planned, checked against the
tier, its run directory and scratch made ahead by a thread of the pool) and closed after
the job. With `[batch] reuse = true` a sandbox runs job after job; between two jobs its
/scratch, /tmp and /dev/shm are emptied (through the files API, as the sandbox's user, no
link followed); a sandbox that cannot be emptied is closed, never handed on. Jobs whose
own policy differs from the batch's get a sandbox of their own (no pool).

Why not live sandboxes (runtime/live.py, one set of namespaces for many commands): a job
is one command, and a live sandbox costs a holder process, its namespaces and a forked
entrant per command on top of the command's own; an exec in an opened Sandbox is what
`corral.run` does, at raw bwrap's pace (docs/benchmarks.md).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from ..errors import CorralError, UsageError
from .jobs import job_policy, parse_job

#: sandboxes a policy's pool keeps ready, at most
POOL_MAX = 64


def node_name() -> str:
    import socket

    return socket.gethostname()


def error_line(job_id, node: str, attempt: int, e: CorralError) -> dict:
    """The output line of a refused job: the error's kind, field and message (`corral
    run` prints it as "FIELD: MESSAGE")."""
    return {"id": job_id, "node": node, "attempt": attempt, "error": e.to_dict()}


def host_tiers() -> list[str]:
    """The tiers this host runs the default policy on (with that tier named), as `corral
    doctor` finds them: what a node offers when the cluster advertises no corral_*
    resources (scale/ray.py)."""
    from ..backends import KNOWN
    from ..policy import policy_from_dict
    from ..runtime.tiers import prepare

    out = []
    for tier in KNOWN:
        try:
            prepare(policy_from_dict({"isolation": tier}))
        except CorralError:
            continue
        out.append(tier)
    return out


class NodeRunner:
    """This machine's sandboxes for batch jobs; `run()` is called from many threads."""

    def __init__(self, node: str | None = None, slots: int = 2) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise UsageError(f"slots must be a positive int, not {slots!r}", field="slots")
        self.node = node or node_name()
        self.slots = slots
        self._mu = threading.Lock()
        self._pools: dict[str, Warm] = {}         # policy key -> its warm pool
        self._refused: dict[str, CorralError] = {}
        self._idle: dict[str, list] = {}          # policy key -> reusable sandboxes
        self._digests: dict[str, tuple] = {}      # policy key -> (toml, image digest)
        self._checked: dict[str, object] = {}     # policy key -> its Policy (no overrides)
        self._templates: dict[str, object] = {}   # policy key -> an unopened Sandbox of it
        self._base_key: tuple = (None, None)      # (the batch's dict, its policy key)
        self._key_dir: str | None = None          # where this machine's signing key is
        self._closed = False

    def prepare(self, base: dict) -> None:
        """Make now, once, what every job without a policy of its own needs: the batch's
        Policy (checked), its plan checked against the tier (or the refusal every such
        job's line will carry), its TOML and image digest for the receipts, this
        machine's signing key read, and the modules a job's run, receipt and line use
        imported. The local driver calls it before it forks its workers (scale/local.py),
        which then plan, check and import nothing of their own per job; without it the
        first job of each policy does it."""
        from ..audit import receipt as rc
        from ..audit import record, spool  # noqa: F401 - imported now, not per job
        from ..backends.host import views  # noqa: F401 - scratch wiped between reuses
        from ..policy.dump import dump_toml
        from ..runtime import files  # noqa: F401 - job files, scratch wiped between reuses
        from .jobs import Job

        key = self._key(base, None)
        try:
            policy = self._policy(key, base, Job(id=0, argv=("true",)))
            sb = self._template(key, policy)
        except CorralError:
            return      # kept (_refused) for each job's line, or raised again per job
        try:
            from ..audit.spool import image_digest

            self._digests[key] = (dump_toml(sb.policy), image_digest(sb.plan, sb.policy))
            self._key_dir = rc.key_dir()
            rc._private_key(self._key_dir)
            rc.corral_version()     # importlib.metadata: ~30 ms, once, not in every worker
            spool.local_user()
        except Exception:  # noqa: BLE001 - each job's receipt says why it has none
            pass

    # -- one job --
    def run(self, wire: dict, base: dict, attempt: int = 1) -> dict:
        """The output line of one job (see the module's docstring)."""
        job_id = wire.get("id") if isinstance(wire, dict) else None
        try:
            job = parse_job(wire, f"job {job_id!r}")
            key = self._key(base, job.policy)
            policy = self._policy(key, base, job)
            sb = self._claim(key, policy, fresh=bool(job.policy))
        except CorralError as e:
            return error_line(job_id, self.node, attempt, e)
        try:
            return self._run_in(sb, key, job, attempt)
        finally:
            self._release(key, sb, policy)

    def _key(self, base: dict, overrides: dict | None) -> str:
        """_policy_key(), made once for the batch's own policy (the same dict each job)."""
        if overrides:
            return _policy_key(base, overrides)
        known, key = self._base_key
        if known is not base:
            key = _policy_key(base, None)
            self._base_key = (base, key)
        return key

    def _template(self, key: str, policy):
        """The batch policy's unopened Sandbox: planned and checked against the tier once
        (a refusal kept for every later job); the pool's sandboxes are its siblings."""
        from ..runtime.sandbox import Sandbox

        with self._mu:
            sb = self._templates.get(key)
            refused = self._refused.get(key)
        if sb is not None:
            return sb
        if refused is not None:
            raise refused
        try:
            sb = Sandbox(policy)
        except CorralError as e:
            with self._mu:
                self._refused[key] = e
            raise
        with self._mu:
            if len(self._templates) >= POOL_MAX:
                self._templates.clear()
            return self._templates.setdefault(key, sb)

    def _policy(self, key: str, base: dict, job):
        """The job's Policy (jobs.job_policy), made once per batch policy: a job without
        overrides gets the batch's, checked the first time; one with overrides is checked
        alone each time (it has a sandbox of its own anyway)."""
        if job.policy:
            return job_policy(base, job)
        policy = self._checked.get(key)
        if policy is None:
            policy = job_policy(base, job)
            with self._mu:
                if len(self._checked) >= POOL_MAX:
                    self._checked.clear()
                self._checked[key] = policy
        return policy

    def _run_in(self, sb, key: str, job, attempt: int) -> dict:
        from ..audit.record import new_id

        started = time.time()
        sb.audit_runs = False     # the batch's driver records it (with the receipt)
        try:
            for path, text in job.files:
                sb.files.write(path, text.encode("utf-8", "surrogateescape"))
            stdin = job.stdin.encode("utf-8", "surrogateescape") if job.stdin is not None \
                else None
            result = sb.exec(list(job.argv), stdin=stdin)
        except CorralError as e:
            return error_line(job.id, self.node, attempt, e)
        except OSError as e:    # the files API's own errors are CorralErrors; not these
            return error_line(job.id, self.node, attempt,
                              CorralError(f"the job's files could not be written: {e}",
                                          field="files"))
        ended = time.time()
        run_id = new_id()
        receipt = self._receipt(key, sb, job, run_id, started, ended, result, stdin)
        line = {"id": job.id, "node": self.node, "attempt": attempt, "run_id": run_id,
                "started": started, "ended": ended}
        line.update(result.to_dict())      # after the receipt: its own event, if any
        line["receipt"] = receipt
        return line

    def _receipt(self, key, sb, job, run_id, started, ended, result, stdin) -> dict | None:
        """This machine's signed receipt of the job (audit/receipt.py); None (and an
        `audit` event) when it cannot sign."""
        from ..audit import receipt as rc
        from ..audit.spool import image_digest, local_user
        from ..policy.dump import dump_toml

        try:
            known = self._digests.get(key)
            if known is None:
                known = self._digests[key] = (dump_toml(sb.policy),
                                              image_digest(sb.plan, sb.policy))
            body = rc.body(run_id=run_id, started=started, ended=ended, tier=sb.isolation,
                           policy_toml=known[0], image_digest=known[1], argv=list(job.argv),
                           stdin=stdin or b"",
                           stdout=result.stdout.encode("utf-8", "surrogateescape"),
                           stderr=result.stderr.encode("utf-8", "surrogateescape"),
                           changes=None, events=result.events, verdict=result.verdict,
                           exit_code=result.exit_code, signal=result.signal,
                           usage=result.usage.to_dict(), actor=local_user())
            if self._key_dir is None:   # the state directory, looked up once a runner
                self._key_dir = rc.key_dir()
            return rc.sign(body, self._key_dir)
        except Exception as e:  # noqa: BLE001 - a receipt is never worth the job's result
            result.events.append({"kind": "audit", "message": f"no receipt for this job: "
                                                              f"{e or type(e).__name__}"})
            return None

    # -- sandboxes --
    def _claim(self, key: str, policy, *, fresh: bool):
        from ..runtime.sandbox import Sandbox

        if fresh:
            return Sandbox(policy).open()
        with self._mu:
            if self._closed:
                raise UsageError("the node's runner is closed", field="batch")
            if policy.batch.reuse:
                idle = self._idle.setdefault(key, [])
                if idle:
                    return idle.pop()
            refused = self._refused.get(key)
            if refused is not None:
                raise refused
            pool = self._pools.get(key)
        if pool is None:
            # plan and tier check (once: prepare() may have done it): a refusal now, not
            # in the pool
            template = self._template(key, policy)
            with self._mu:
                if self._closed:
                    raise UsageError("the node's runner is closed", field="batch")
                pool = self._pools.get(key)
                if pool is None:
                    pool = self._pools[key] = Warm(template, min(self.slots, POOL_MAX))
        try:
            return pool.claim()
        except CorralError as e:
            with self._mu:
                self._refused[key] = e
            raise

    def _release(self, key: str, sb, policy) -> None:
        if policy.batch.reuse and not self._closed and _wipe(sb):
            with self._mu:
                if not self._closed:
                    self._idle.setdefault(key, []).append(sb)
                    return
        # closed by the pool's thread, off the job's path (unmounting its scratch waits
        # for the kernel's RCU grace period: ~3 ms a job of a slot's time otherwise)
        pool = self._pools.get(key)
        if pool is None or not pool.retire(sb):
            sb.close()

    def close(self) -> None:
        """Close every sandbox this runner keeps (pools, reusable ones)."""
        with self._mu:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
            idle = [sb for v in self._idle.values() for sb in v]
            self._idle = {}
        for p in pools:
            p.close()
        for sb in idle:
            sb.close()


#: used sandboxes a pool's thread may have waiting to be closed; past it, the job's
#: thread closes its own
RETIRED_MAX = 8


class Warm:
    """Opened sandboxes of one policy kept ready (run directory, scratch mounted, seccomp
    program loaded), each handed out once, refilled by a thread of its own, which also
    closes the used ones handed back (retire()). Each is a sibling of `template` (an
    unopened Sandbox of the policy): planned and checked against the tier once, for all."""

    def __init__(self, template, size: int) -> None:
        self.template, self.size = template, size
        self.ready: deque = deque()
        self.retired: deque = deque()
        self.cv = threading.Condition()
        self.closed = False
        self.error: CorralError | None = None
        self.thread = threading.Thread(target=self._fill, daemon=True, name="corral-warm")
        self.thread.start()

    def _fill(self) -> None:
        while True:
            with self.cv:
                while not self.closed and len(self.ready) >= self.size and not self.retired:
                    self.cv.wait()
                if self.closed:
                    return
                used = self.retired.popleft() if len(self.ready) >= self.size else None
            if used is not None:     # the next one first: a job may be waiting for it
                used.close()
                continue
            try:
                sb = self.template._sibling().open()
            except CorralError as e:
                with self.cv:
                    self.error = e
                    self.cv.notify_all()
                return
            with self.cv:
                if self.closed:
                    sb.close()
                    return
                self.ready.append(sb)
                self.cv.notify_all()

    def claim(self):
        with self.cv:
            while not self.ready:
                if self.error is not None:
                    raise self.error
                if self.closed:
                    raise UsageError("the node's runner is closed", field="batch")
                self.cv.wait()
            sb = self.ready.popleft()
            self.cv.notify_all()
            return sb

    def retire(self, sb) -> bool:
        """Have the pool's thread close `sb` (its job is over, every process of it
        gone); False when it cannot (closed, failed, behind): the caller closes it."""
        with self.cv:
            if self.closed or self.error is not None or len(self.retired) >= RETIRED_MAX:
                return False
            self.retired.append(sb)
            self.cv.notify_all()
            return True

    def close(self) -> None:
        with self.cv:
            self.closed = True
            ready, self.ready = list(self.ready), deque()
            self.cv.notify_all()
        self.thread.join(60)
        with self.cv:
            ready += self.retired
            self.retired = deque()
        for sb in ready:
            sb.close()


def _wipe(sb) -> bool:
    """Empty the scratch of a reused sandbox (/scratch, /tmp, /dev/shm) as its user, no
    link followed. False when anything is left: then it is not reused."""
    from ..backends.host.views import SCRATCH_MOUNTS

    try:
        files = sb.files
        for _, dest in SCRATCH_MOUNTS:
            for entry in files.list(dest, depth=1):
                files.remove(entry.path)
            if files.list(dest, depth=1):
                return False
        return True
    except (CorralError, OSError):
        return False


def _policy_key(base: dict, overrides: dict | None) -> str:
    import json

    return json.dumps([base, overrides], sort_keys=True, default=str)



__all__ = ["NodeRunner", "error_line", "host_tiers", "node_name"]
