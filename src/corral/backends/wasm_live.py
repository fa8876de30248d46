"""The wasm tier's live sandbox (`corral.Sandbox.create({"isolation": "wasm"})`): one
namespace-tier sandbox (backends/namespace_live.py) kept for the sandbox's life as the
home of wasmtime's processes, each command one wasmtime process entered into it from the
host side, each guest a fresh WASI instance given the same preopens.

    live = WasmLive(backend, plan, check)          # bwrap + init running, module compiled
    cmd = live.start(["python3", "-c", "print(1)"], env, cwd="/scratch", stdin_fd=fd)
    ...                                            # runtime/commands.py supervises it
    result = cmd.on_result(result)                 # the guest's own end: timeout, oom

What a command may be: the argv forms of Python that backends/wasm.py's guest_argv takes
(`python3 -c`, `python3 SCRIPT`, `python3 -m`, `python3` with stdin), or a command line
that is nothing but one of them (no shell syntax at all: split by shlex, never run by a
shell); anything else is refused in one line (NOT_PYTHON). No terminal: WASI has none.

What persists between commands is what the guest writes in its preopens: /scratch (the
sandbox's capped scratch tmpfs) and a read-write workspace; `sb.files` reaches exactly
those (file_mounts), never the host side's /tmp (where the status files are) nor the rest
of wasmtime's sandbox. run_code's interpreter is a command like the others (one WASI
instance reading cells from stdin: guest/wasm_session.py).

Limits per command: its timeout and limits.cpu_time by the host (the command's cgroup is
killed at them: wasmtime's process and its guest with it, nothing left behind), memory by
wasmtime's process at limits.memory per guest (guest/wasm_host.py's Memories), the sandbox's cgroup at limits.memory
+ HOST_OVERHEAD for all of them together.
"""

from __future__ import annotations

import os
import shlex

from ..errors import UnsupportedRule
from ..plan import SCRATCH, WorkspaceMount
from .base import ExecLimits, TierCheck
from .namespace_live import NamespaceLive, Started
from .wasm import (
    BACKSTOP_S,
    HOST_PYTHON,
    NOT_PYTHON,
    STATUS_NAME,
    WASM32_MAX,
    WasmBackend,
    WasmSandbox,
    _is_session_runner,
    _unlink,
    guest_argv,
    guest_env,
    guest_runner,
    host_plan,
    read_status,
    wasmtime_library,
)

#: what a command line may not hold outside quotes to be taken as an argv without a shell:
#: the shell's operators, expansions, globs, redirections, comments, escapes, newlines;
#: and inside double quotes: its expansions and escapes
SHELL_SYNTAX = frozenset(";&|<>()$`*?[]{}~#\n\r\\")
IN_DOUBLE = frozenset("$`\\")
#: the runner's own wall clock for a live command: the host's timeout ends it first (the
#: command's cgroup is killed); the epoch deadline is only a backstop far away
LIVE_WALL_S = 1e6
PTY_REFUSAL = ("a terminal (sb.pty) is not offered on the wasm tier: WASI has no terminals; "
               "use isolation = \"namespace\" for sb.pty")
CWD_REFUSAL = ("cwd= other than /scratch or the workspace is not offered on the wasm tier; "
               "call os.chdir() in the code, or use isolation = \"namespace\"")


def live_argv(argv: list[str]) -> list[str]:
    """An argv for the guest from what sb.commands.run was given: an argv list as it is, a
    command line (runtime/commands.py made it ["/bin/sh", "-c", LINE]) only when LINE has
    no shell syntax and splits into a Python argv; else UnsupportedRule (NOT_PYTHON)."""
    if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]:
        line = argv[2]
        if not _plain(line):
            raise UnsupportedRule(NOT_PYTHON + " (a command line is taken only when it is "
                                  "one python3 argv without shell syntax)", field="command")
        try:
            argv = shlex.split(line)
        except ValueError:
            raise UnsupportedRule(NOT_PYTHON, field="command") from None
    return guest_argv(argv)


def _plain(line: str) -> bool:
    """Whether sh would read `line` as plain words: no shell syntax but quoting (so
    shlex.split gives the argv sh would)."""
    quote = ""
    for c in line:
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"':
            if c in IN_DOUBLE:
                return False
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c in SHELL_SYNTAX:
            return False
    return quote == ""


class WasmStarted(Started):
    """A wasm command just started: Started, plus `on_result` (runtime/commands.py calls
    it with the command's Result: the guest's own end from its status file)."""

    __slots__ = ("on_result",)


class WasmLive(NamespaceLive):
    """See the module's docstring."""

    #: runtime/live.py: what the tier offers (get_info().offers) and refuses
    offers = {"commands": "python3 argv forms only (no shell)", "shell": False,
              "pty": False, "run_code": "stateful (one WASI instance per context)",
              "files": "/scratch and the workspace (the guest's preopens)",
              "background": True, "network": False}
    no_pty = PTY_REFUSAL

    def __init__(self, backend: WasmBackend, plan, check: TierCheck) -> None:
        from .wasm_cache import ModuleCache

        self.wasm_backend, self.wasm_plan = backend, plan
        module, wt = backend._parts()
        self.cwasm = ModuleCache(backend.cache_dir).ensure(module, backend.sha256, wt)
        self.library = wasmtime_library(wt)
        self.runner = guest_runner()
        nsplan = host_plan(plan, self.library, self.cwasm, self.runner)
        nscheck = backend.ns.check(nsplan)
        self.tail = WasmSandbox.preopen_tail(plan)
        self._n = 0
        super().__init__(backend.ns, nsplan, TierCheck(nscheck.tier, tuple(
            g.replace(explicit=False) for g in nscheck.gaps)))
        self.host_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        #: what runtime/live.py gives commands as their env (env= adds to it): the guest's
        self.env = dict(guest_env(plan))

    def start(self, argv: list[str], env: dict[str, str], *, cwd: str, stdin_fd: int,
              cpu_seconds: float | None = None, tty_fd: int | None = None) -> WasmStarted:
        if tty_fd is not None:
            raise UnsupportedRule(PTY_REFUSAL, field="tty")
        if os.path.normpath(cwd) not in (SCRATCH, self.wasm_plan.cwd):
            raise UnsupportedRule(CWD_REFUSAL, field="cwd")
        gargv = live_argv(argv)
        session = _is_session_runner(argv)
        if session:
            from .. import guest

            gargv = ["python3", "-c", guest.source("wasm_session.py"), *argv[3:]]
        lim = ExecLimits.from_plan(self.wasm_plan)
        self._n += 1
        name = f"{STATUS_NAME}-{self._n}"
        status_dir = os.path.join(self.scratch, "tmp")
        _unlink(status_dir, name)
        line = [HOST_PYTHON, "-I", "-S", self.runner, self.library, self.cwasm,
                str(min(lim.memory, WASM32_MAX)), repr(float(lim.cpu) + BACKSTOP_S),
                repr(LIVE_WALL_S), "/tmp/" + name, "1" if session else "0", *self.tail,
                "--", *gargv]
        host_env = dict(self.host_env)
        for i, (k, v) in enumerate(sorted(env.items())):
            host_env[f"CORRAL_WASM_ENV_{i}"] = f"{k}={v}"
        s = super().start(line, host_env, cwd=SCRATCH, stdin_fd=stdin_fd)
        started = WasmStarted(s.pid, s.out_r, s.err_r, s.cgroup, s.before_wait, s.tally,
                              pidfd=s.pidfd, exit_status=s.exit_status)
        started.ns_pid = s.ns_pid

        def on_result(result):
            status = read_status(status_dir, name)
            _unlink(status_dir, name)
            return WasmSandbox.apply_status(result, status, lim, None)

        started.on_result = on_result
        return started

    def file_mounts(self) -> list[tuple[str, int, bool]]:
        """What sb.files reaches (backends/host/views.py): the guest's preopens that
        outlive a command, as (path inside, O_PATH fd of the host directory, writable)."""
        return wasm_file_mounts(self.scratch, self.wasm_plan, self.workspace_fd())

    def workspace_fd(self) -> int | None:
        src = getattr(self, "workspace_src", None)
        if not self.wasm_plan.find(WorkspaceMount):
            return None
        if src is not None:
            return os.open(src, _DIR)
        return os.dup(self.fds[""])


_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def wasm_file_mounts(scratch: str, plan, workspace_fd: int | None
                     ) -> list[tuple[str, int, bool]]:
    """/scratch (the scratch tmpfs's home, opened without following a link) and the
    workspace (`workspace_fd`, taken over), as the guest sees them: not /tmp nor /dev/shm,
    which no guest has."""
    out = []
    try:
        out.append((SCRATCH, os.open(os.path.join(scratch, "home"), _DIR), True))
        for op in plan.find(WorkspaceMount):
            if workspace_fd is not None:
                out.append((op.dest, workspace_fd, op.writable))
                workspace_fd = None
    except BaseException:
        for _, fd, _ in out:
            os.close(fd)
        raise
    finally:
        if workspace_fd is not None:
            os.close(workspace_fd)
    return out


__all__ = ["WasmLive", "live_argv", "wasm_file_mounts"]
