"""From what was observed to the Result: limit events, the verdict, and what an exec
failure inside means (a missing #! interpreter is read by a second short command); and
the execs of a one-shot sandbox running now (Inflight), so that its close() ends them.

The execs of a one-shot sandbox running now, so that its close() ends them.

    inflight = Inflight()
    with inflight.run() as slot:      # in exec(): one slot per running exec
        ...; slot.kill = kill          # once the exec's processes exist
    inflight.end_all()                # in close(), before the run dir goes

An exec runs in its caller's thread; the sandbox may be closed from another while it
runs (a code context's interpreter, one long exec in a thread of its own, that outlived
its context: runtime/channels.ExecChannel). end_all() calls each running exec's kill()
and waits until each has returned: its processes, its cgroup and its hold on the
caller's child-subreaper flag go before the sandbox does."""

from __future__ import annotations

import _thread
import time

from ...linux.supervise import MAX_NAME, ExecFailed, Outcome, _errno_name, exec_failure

#: read inside the sandbox: the first 256 bytes of the file a command name resolves to
#: (PATH for a bare name, as execvp looks it up), for interpreter_inside
_HEAD_SCRIPT = ('p=$1; case $p in */*) ;; *) p=$(command -v -- "$p") || exit 3;; esac; '
                'exec head -c 256 -- "$p"')


def interpreter_inside(sb, name: str) -> str | None:
    """The interpreter that a file's #! line names, when exec of `name` said ENOENT inside
    sandbox `sb` although the file is there (what is missing is its interpreter). The file
    is read by a second, short command in the same sandbox (the only safe view of it: its
    mounts, its symlinks, its uid); only on that failure path. None if it cannot tell."""
    from ...linux.supervise import shebang_interpreter

    if getattr(sb, "_looking_up", False):
        return None   # /bin/sh itself was not found: no second level
    sb._looking_up = True
    try:
        r = sb.exec(["/bin/sh", "-c", _HEAD_SCRIPT, "sh", name], timeout=30)
    except Exception:  # noqa: BLE001 - a message only: without it, "not found" stays
        return None
    finally:
        sb._looking_up = False
    if r.verdict != "ok":
        return None
    return shebang_interpreter(r.stdout.encode(errors="surrogateescape")[:256])


def finish(outcome: Outcome, *, exit_code: int | None, sig: int | None, events: list[dict],
           usage, oom_kills: int, wall: float, cpu: float, memory: int, cap: int,
           isolation: str, failed: tuple[str, ExecFailed] | None = None):
    """The Result of one command: limit events from what was observed, then the verdict.
    Shared by every tier (each decodes exit_code and sig its own way). `failed`: (the
    command's name, how its exec failed) when it never started (exec_failure words it)."""
    from ...result import Result, decide_verdict

    stderr = outcome.stderr.text()
    if failed is not None:
        from ...events import ExecEvent

        name, e = failed
        exit_code, line = exec_failure(name, e.errno, e.interpreter)
        sig, stderr = None, line + "\n"
        events.append(ExecEvent(name[:MAX_NAME], _errno_name(e.errno), line).to_dict())
    timed_out = outcome.timed_out
    if sig == 24 and not timed_out:  # SIGXCPU: RLIMIT_CPU, the second layer of cpu_time
        timed_out = "cpu_time"
    if timed_out or oom_kills or outcome.stdout.truncated or outcome.stderr.truncated:
        from ...events import LimitEvent  # events.py: off the path of a run that went well
    if timed_out == "timeout":
        events.append(LimitEvent.timeout(wall).to_dict())
    elif timed_out == "cpu_time":
        events.append(LimitEvent.cpu_time(cpu).to_dict())
    if oom_kills:
        events.append(LimitEvent.memory(oom_kills, memory).to_dict())
    for name, stream in (("stdout", outcome.stdout), ("stderr", outcome.stderr)):
        if stream.truncated:
            events.append(LimitEvent.output(name, cap).to_dict())
    verdict = decide_verdict(exit_code=exit_code, signal=sig, oom_kills=oom_kills,
                             timed_out=timed_out)
    return Result(verdict=verdict, exit_code=exit_code, signal=sig,
                  stdout=outcome.stdout.text(), stderr=stderr,
                  stdout_truncated=outcome.stdout.truncated,
                  stderr_truncated=outcome.stderr.truncated, usage=usage, events=events,
                  isolation=isolation)


# -- the execs running now ---------------------------------------------------------------
#: how long end_all() waits for the execs it killed to finish their teardown
CLOSE_WAIT_S = 10.0


class Slot:
    __slots__ = ("done", "kill")

    def __init__(self) -> None:
        self.kill = None
        self.done = _thread.allocate_lock()
        self.done.acquire()


class _Run:
    __slots__ = ("inflight", "slot")

    def __init__(self, inflight: Inflight) -> None:
        self.inflight, self.slot = inflight, Slot()

    def __enter__(self) -> Slot:
        self.inflight._slots[id(self.slot)] = self.slot
        return self.slot

    def __exit__(self, *exc) -> None:
        self.inflight._slots.pop(id(self.slot), None)
        self.slot.done.release()


class Inflight:
    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: dict[int, Slot] = {}

    def run(self) -> _Run:
        return _Run(self)

    def running(self) -> bool:
        """Is any exec still running (one end_all() could not wait out)?"""
        return bool(self._slots)

    def end_all(self, wait: float = CLOSE_WAIT_S) -> None:
        slots = list(self._slots.values())
        for slot in slots:
            if slot.kill is not None:
                slot.kill()
        deadline = time.monotonic() + wait
        for slot in slots:
            if slot.done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                slot.done.release()
