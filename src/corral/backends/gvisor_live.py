"""The gvisor tier's live sandbox: one runsc sandbox (one Sentry, one gofer) for the
sandbox's whole life, each command started into it from the host with `runsc exec`.

    live = GvisorLive(backend, plan, check)           # runsc run + its init running, ready
    cmd = live.start(argv, env, cwd="/scratch", stdin_fd=fd)   # a Started: pid, pipes, group
    ...                                               # the runtime supervises it
    live.release(cmd.cgroup)
    live.close()                                      # every process, mount, cgroup gone

What runs: `runsc run` (our child, with a parent-death signal, in the sandbox's cgroup, in
its user namespace: gvisor.py's one-shot exec, steps 1-7) on a bundle whose process is the
sandbox's init, `/bin/sh -c 'while :; do sleep 1000000; done'`: pid 1 of gVisor's kernel,
holding the container open and reaping the processes commands leave behind (dash waits
for any child). Nothing of corral's runs inside. `runsc run` returns when that init exits
(a process inside killed it: gVisor, unlike Linux, lets pid 1 be SIGKILLed from inside),
and the runtime sees that as the sandbox's init exiting (`target.pidfd` is runsc run's).

Each command is `runsc exec --process FILE` (a host process of ours, not in the sandbox's
cgroup): the Sentry creates the command as a new session in the container, with the
container's rlimits (RLIMIT_NPROC: the policy's pids, counted over every command), no
capabilities, and our pipes (or a terminal's slave) as its stdio. runsc exec waits for it
and exits with its status (128+N for a signal). The process file (args, env, cwd) is
written 0600 in the run dir, so no environment value is on a host command line.

What differs from the namespace tier, and why (docs/sessions.md says the same):
 - a command's processes are tasks of gVisor's kernel, not host processes: there is no
   host cgroup per command. A command's kill (its timeout, cpu_time, kill(), the output
   drain) is SIGKILL through `runsc kill --pid` to the command and each descendant the
   Sentry lists for it (`runsc ps`: PID/PPID, the kernel's own table), repeated until
   none is left. A process the command left behind once it exited (`server &`) belongs to
   init, not to the command: it runs until it exits or the sandbox ends.
 - cpu_time per command is read from the sandbox's cgroup counter (every runsc process of
   it, gVisor's own CPU included) since the command started: never more than the limit,
   though a command may be stopped early while others use the CPU too.
 - seccomp.py's deny list inside gVisor (OCI seccomp) applies to processes forked by the
   container's own process; `runsc exec` starts commands without it. The Sentry still
   serves every system call under runsc's own host filter; the live sandbox reports the
   deny list as unenforced (an event on every Result).
 - memory: one host cgroup around the Sentry and gofer; when it is exhausted the host's
   OOM killer takes a gVisor process and the sandbox ends (an "init" event).
"""

from __future__ import annotations

import json
import os
import select
import threading
import time

from ..errors import SandboxSetupError, UsageError
from ..events import UnenforcedEvent
from ..linux import limits, spawner
from ..linux._sys import set_pdeathsig, subreaper_acquire, subreaper_release
from ..linux.supervise import ExecFailed, errno_from_message, kill_pid, spawn
from ..plan import EgressProxy, Seccomp
from .gvisor import PIDS_OVERHEAD, SIGKILL, GvisorSandbox
from .gvisor_runsc import _reap, remove_state
from .host.cgroups import destroy_cgroup, run_cgroup, with_relay_tasks

#: the container's own process: pid 1 of gVisor's kernel for the sandbox's life
HOLDER = ("/bin/sh", "-c", "while :; do sleep 1000000; done")
#: runsc exec's failure to start a command (runsc exits 128 before anything ran)
EXEC_FAILED_PREFIX = "executing processes for container: "
#: runsc exits with this when it failed itself
RUNSC_FAILED = 128
#: how long the sandbox may take to be running, and a command to be started
READY_S = 30.0
START_S = 30.0
#: the most of a state file or pid file that is read (runsc writes them; bounded anyway)
STATE_MAX = 1 << 20
#: how long a command that runsc exec could not wait for waits for the sandbox's end
INIT_EXIT_WAIT_S = 0.25
#: rounds of `runsc ps` + stop, and of kill + `runsc ps`, before a command's kill gives up
KILL_ROUNDS = 8
PS_TIMEOUT_S = 10.0
#: host tasks per task of the sandbox in its pids cgroup, a second layer under RLIMIT_NPROC
#: inside gVisor: on the ptrace platform each process of the sandbox costs about 18 host
#: threads (its stub and the Sentry's threads tracing it; measured with runsc 20221219),
#: so the one-shot exec's 3 per task would end the Sentry long before RLIMIT_NPROC
PIDS_PER_TASK = 32
_PATH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
SECCOMP_REASON = ("gVisor applies the OCI seccomp deny list to the container's own "
                  "process tree only; runsc exec starts a live sandbox's commands without "
                  "it (gVisor's Sentry still serves every system call, under runsc's host "
                  "filter); the namespace tier applies it to every command")


class _InitTarget:
    """What the runtime watches for the sandbox's end: a pidfd of `runsc run`, which
    exits when the container's init does. There is no root fd: gVisor's root lives in
    its own kernel (the files API works on the host directories behind its mounts)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.root_fd = -1

    def alive(self) -> bool:
        if self.pidfd < 0:
            return False
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class GvisorStarted:
    """A command started with runsc exec: its host pid (runsc exec, our child: wait on
    it, never signal it), the read ends of its stdout and stderr, its pid inside, and its
    process group (`cgroup`: the object the runtime kills, signals, times and releases;
    see CommandGroup)."""

    __slots__ = ("before_wait", "cgroup", "err_r", "ns_pid", "out_r", "pid", "tty")

    #: runsc exec reports a signal as 128+N (commands.py decodes it so)
    signal_exit_codes = True

    def __init__(self, pid: int, out_r: int, err_r: int, ns_pid: int, group,
                 tty: bool = False) -> None:
        self.pid, self.out_r, self.err_r, self.ns_pid = pid, out_r, err_r, ns_pid
        self.cgroup = group
        self.before_wait = group.exited
        self.tty = tty

    def final_status(self, status: int) -> int:
        """The command's wait status from runsc exec's: when the sandbox ended under the
        command, runsc exec cannot wait for it and fails itself (exit 128: "sandbox is
        not running"); the command was killed with the sandbox, so SIGKILL's status."""
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == RUNSC_FAILED:
            target = self.cgroup._live.target
            if target is None or not _alive_after(target, INIT_EXIT_WAIT_S):
                return SIGKILL
        return status

    def resized(self) -> None:
        """Call after a terminal command's window size changed (TIOCSWINSZ on the host
        master): gVisor reads the new size from the host terminal but raises no SIGWINCH
        for it, so it is sent here. runsc exec forwards a signal to the terminal's
        foreground process group inside when the command has a terminal (and only then)."""
        if self.tty and not self.cgroup._exited:
            try:
                os.kill(self.pid, 28)   # SIGWINCH; pid is ours and not reaped yet
            except ProcessLookupError:
                pass


class CommandGroup:
    """A command's processes inside gVisor, as far as the host can reach them: the command
    and its descendants in the Sentry's process table. Quacks like the RunCgroup a
    namespace command has (kill_all, cpu_seconds, pids, usage)."""

    version = "gvisor"

    def __init__(self, live: GvisorLive, ns_pid: int, exec_pid: int) -> None:
        self._live = live
        self.ns_pid = ns_pid
        self._exec_pid = exec_pid
        self._exited = False
        self._emptied = False
        cg = live.sandbox_cg
        self._cpu0 = (cg.cpu_seconds() or 0.0) if cg is not None else 0.0
        self._oom0 = _oom_kills(cg)

    def exited(self) -> None:
        """runsc exec is about to be reaped: the command itself has exited."""
        self._exited = True
        self._live.forget_exec(self._exec_pid)

    def cpu_seconds(self) -> float:
        cg = self._live.sandbox_cg
        if cg is None:   # the sandbox ended: its cgroup's last count
            return max(0.0, (self._live.final_usage.cpu_s or 0.0) - self._cpu0)
        return max(0.0, (cg.cpu_seconds() or 0.0) - self._cpu0)

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL the command and every descendant the Sentry lists for it. Once the
        command has exited, what it left behind is init's: nothing is done then."""
        if self._emptied:
            return
        if not self._exited:
            self._live.kill_tree(self.ns_pid, timeout)
        self._emptied = True

    def pids(self) -> list[int]:
        """No host processes of its own (its processes are gVisor's tasks)."""
        return []

    def emptied_now(self) -> bool:
        """Whether nothing of the command lingers for the host to kill once it exited: on
        gVisor what it left running is init's from then on (see kill_all), never listed
        as the command's, so the group counts as emptied."""
        self._emptied = True
        return True

    def signal(self, signum: int) -> None:
        """Send signum to the command itself inside (`runsc kill --pid`), e.g. SIGINT for
        an interrupt. Never signal the Started's host pid: that is runsc exec, which dies
        of it (this runsc forwards nothing) and leaves the command unsupervised."""
        if not self._exited and not self._emptied:
            self._live.signal_pids({self.ns_pid}, str(int(signum)))

    #: what runtime/commands.CommandHandle.send_signal uses for this tier
    signal_command = signal

    def usage(self):
        """cpu_s since the command started, for the whole sandbox (gVisor's own included);
        the sandbox's memory peak; OOM kills in the sandbox's cgroup since it started."""
        cg = self._live.sandbox_cg
        # the sandbox may have ended first (an OOM kill of gVisor's own ends it): then
        # its cgroup's last counts, read by close() before it removed the cgroup. close()
        # may run meanwhile (the watchdog saw gVisor end): a cgroup removed between the
        # look at sandbox_cg and the read reads as no counts, and its last ones are there
        u = cg.usage() if cg is not None else None
        if u is None or u.oom_kills is None:
            u = self._live.final_usage
        oom = None if u.oom_kills is None else max(0, u.oom_kills - self._oom0)
        return limits.Usage(cpu_s=self.cpu_seconds(), memory_peak_bytes=u.memory_peak_bytes,
                            oom_kills=oom)


def _alive_after(target: _InitTarget, seconds: float) -> bool:
    """Whether runsc run is still there after waiting up to `seconds` for its exit."""
    if target.pidfd < 0:
        return False
    poller = select.poll()
    poller.register(target.pidfd, select.POLLIN)
    return not poller.poll(int(seconds * 1000))


def _oom_kills(cg) -> int:
    if cg is None:
        return 0
    try:
        return cg.usage().oom_kills or 0
    except OSError:
        return 0


class GvisorLive(GvisorSandbox):
    """A gvisor-tier sandbox kept running; see the module's docstring."""

    def __init__(self, backend, plan, check, granted=None, upstream_ca=None) -> None:
        self.runsc_pid = 0
        self.target = None
        self.sandbox_cg = None
        self.proxy = None
        self.net = None
        self._subreaper = False
        self._cmds = 0
        self._cmd_lock = threading.Lock()
        self._execs: set[int] = set()     # runsc exec processes not yet reaped
        self.cid = ""
        #: the sandbox cgroup's counts as close() removed it (for a command's Result then)
        self.final_usage = limits.Usage(cpu_s=None, memory_peak_bytes=None, oom_kills=None)
        super().__init__(backend, plan, check, granted, upstream_ca)  # closes on failure
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- start ----------------------------------------------------------------------------
    def _start(self) -> None:
        plan = self.plan
        if plan.find(Seccomp) and not any(e.get("kind") == "unenforced" and e.get("rule")
                                          == "Seccomp" for e in self.events):
            self.events.append(UnenforcedEvent("Seccomp", "gvisor", SECCOMP_REASON).to_dict())
        self.cid = f"{self.dir.id}-live"
        spec = dict(self.spec)
        self.env = dict(e.split("=", 1) for e in spec["process"]["env"])
        spec["process"] = dict(spec["process"], args=list(HOLDER), terminal=False)
        cg = self.sandbox_cg = run_cgroup(self.dir, self.cid, plan, self.check,
                                          pids=with_relay_tasks(plan, lambda n: n * PIDS_PER_TASK
                                                                + PIDS_OVERHEAD))
        egress = plan.find(EgressProxy)
        if egress:
            from .gvisor_net import ProxyNet

            path = os.path.join(self.dir.path, "netns-live")
            self.dir.mounts.append(path)   # close() and the stale sweep unmount it too
            self.net = ProxyNet.create(path, owner=self.userns)
            spec["linux"] = dict(spec["linux"], namespaces=[
                dict(ns, path=path) if ns["type"] == "network" else ns
                for ns in spec["linux"]["namespaces"]])
        tmp = os.path.join(self.bundle, "config.json.tmp")
        with open(tmp, "w") as f:
            json.dump(spec, f)
        os.replace(tmp, os.path.join(self.bundle, "config.json"))
        attach = cg.attach_fds() if cg is not None else []
        devnull_r = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        devnull_w = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            if egress:
                from ..grants import proxy_config
                from .host.proxy import start_proxy

                config = proxy_config(egress[0].config_json, self.granted, self.ca,
                                      self.upstream_ca)
                # from the spawner thread: the parent-death signals of runsc and the
                # proxy must not fire when the thread that created the sandbox exits
                self.proxy = spawner.call(start_proxy, config, self.net.take_listener(),
                                          attach, self.uid, self.gid)
            child_setup = self.runsc_child_setup(attach, self.net is not None)

            argv = self.runsc_argv(self.cid)
            subreaper_acquire()    # the gofer and Sentry, if runsc goes first
            self._subreaper = True
            pid, _, _ = spawner.call(spawn, argv[0], argv, dict(_PATH_ENV),
                                     stdin_fd=devnull_r, pass_fds=(), child_setup=child_setup,
                                     stdout_fd=devnull_w)
            self.runsc_pid = pid
            self.target = _InitTarget(pid)
            self._wait_running()
        finally:
            for fd in (*attach, devnull_r, devnull_w):
                os.close(fd)

    def _wait_running(self) -> None:
        """Return once runsc says the container runs (its state file, in the run dir)."""
        name = f"{self.cid}_sandbox:{self.cid}.state"
        path = os.path.join(self.state, name)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if not self.target.alive():
                from .gvisor_runsc import runsc_error

                why = runsc_error(self.log) or "no message in its log"
                raise SandboxSetupError(f"runsc run failed: {why}", step="runsc")
            try:
                with open(path, "rb") as f:
                    state = json.loads(f.read(STATE_MAX))
            except (FileNotFoundError, ValueError):
                state = None
            if isinstance(state, dict) and state.get("status") == "running":
                return
            time.sleep(0.002)
        raise SandboxSetupError(f"the gVisor sandbox was not running after {READY_S:g}s",
                                step="runsc")

    def _runsc(self, *args: str, log: str | None = None) -> list[str]:
        return [self.backend.runsc or "runsc", f"--root={self.state}",
                f"--log={log or os.devnull}", "--log-format=json", *args]

    # -- commands -------------------------------------------------------------------------
    def start(self, argv: list[str], env: dict[str, str], *, cwd: str, stdin_fd: int,
              cpu_seconds: float | None = None, tty_fd: int | None = None) -> GvisorStarted:
        """Start argv inside with runsc exec. Raises supervise.ExecFailed when it could not
        be executed (nothing ran), UsageError for a working directory that is not there,
        SandboxSetupError when the sandbox is not running.

        `tty_fd`: a terminal's slave as its stdin, stdout, stderr and controlling terminal
        (the process file's terminal: true; the Sentry makes it the new session's).

        `cpu_seconds` sets no rlimit here: runsc 20221219's exec ignores a process file's
        rlimits and gives every command the container's (the policy's, RLIMIT_CPU
        limits.cpu_time + 1 s included); a command's own cpu_time is the supervisor's,
        read from the sandbox's cgroup counter (CommandGroup.cpu_seconds)."""
        if self.target is None or not self.target.alive():
            raise SandboxSetupError("the sandbox is not running", step="enter")
        with self._cmd_lock:
            self._cmds += 1
            n = self._cmds
        base = os.path.join(self.dir.path, f"cmd-{n}")
        proc = dict(self.spec["process"], args=list(argv), cwd=cwd,
                    env=[f"{k}={v}" for k, v in env.items()], terminal=tty_fd is not None)
        fd = os.open(base + ".json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     0o600)
        with open(fd, "w") as f:
            json.dump(proc, f)
        pid_file, log = base + ".pid", base + ".log"
        a = self._runsc("exec", "--process", base + ".json",
                        f"--internal-pid-file={pid_file}", self.cid, log=log)
        # runsc exec only talks to the sandbox over its control socket (in the state dir):
        # it needs neither the sandbox's user namespace nor its cgroup. It runs in a session
        # of its own: this runsc does not forward signals to the command but dies of them,
        # which would leave the command running unsupervised, so a ^C on the caller's
        # terminal must not reach it (signal a command with CommandGroup.signal). Should
        # this process die, runsc exec and runsc run die (parent-death signals), and the
        # Sentry with the latter.
        parent = os.getpid()

        def child_setup() -> None:
            os.setsid()
            set_pdeathsig(SIGKILL)
            if os.getppid() != parent:
                os._exit(125)

        try:
            pid, out_r, err_r = spawner.call(
                spawn, a[0], a, dict(_PATH_ENV),
                stdin_fd=tty_fd if tty_fd is not None else stdin_fd, pass_fds=(),
                stdout_fd=tty_fd, child_setup=child_setup)
        except BaseException:
            _unlink(base + ".json")
            raise
        self._execs.add(pid)
        try:
            ns_pid = self._started_pid(pid, pid_file)
        except BaseException:
            for r in (out_r, err_r):
                if r >= 0:
                    os.close(r)
            self._reap_exec(pid)
            raise
        finally:
            _unlink(base + ".json")
        if ns_pid is None:    # runsc exec ended before the command ran: it says why
            for r in (out_r, err_r):
                if r >= 0:
                    os.close(r)
            status = self._reap_exec(pid)
            _unlink(pid_file)
            raise self._start_failure(status, log, argv[0], cwd)
        _unlink(pid_file)
        _unlink(log)
        return GvisorStarted(pid, out_r, err_r, ns_pid, CommandGroup(self, ns_pid, pid),
                             tty=tty_fd is not None)

    def _started_pid(self, pid: int, pid_file: str) -> int | None:
        """The command's pid inside (runsc exec writes it once the Sentry started it), or
        None if runsc exec exited first."""
        pidfd = os.pidfd_open(pid)
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            deadline = time.monotonic() + START_S
            wait_ms = 0
            while time.monotonic() < deadline:
                ns = _read_pid(pid_file)
                if ns is not None:
                    return ns
                if poller.poll(wait_ms):
                    return _read_pid(pid_file)
                wait_ms = min(wait_ms + 1, 5)
            kill_pid(pid)
            raise SandboxSetupError(f"runsc exec did not start the command in {START_S:g}s",
                                    step="runsc")
        finally:
            os.close(pidfd)

    def _reap_exec(self, pid: int) -> int:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = 0
        self._execs.discard(pid)
        return status

    def forget_exec(self, pid: int) -> None:
        self._execs.discard(pid)

    def _start_failure(self, status: int, log: str, name: str, cwd: str) -> Exception:
        from .gvisor_runsc import LOG_MAX

        try:
            with open(log, "rb") as f:
                text = f.read(LOG_MAX).decode(errors="replace")
        except FileNotFoundError:
            text = ""
        _unlink(log)
        error = None
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if (isinstance(entry, dict) and entry.get("level") == "error"
                    and isinstance(entry.get("msg"), str)):
                error = entry["msg"]
        if error is None or not error.startswith(EXEC_FAILED_PREFIX):
            if not self.alive():
                return SandboxSetupError("the sandbox is not running", step="enter")
            return SandboxSetupError(f"runsc exec failed (status {status}): "
                                     f"{(error or 'no message')[:300]}", step="runsc")
        errno = errno_from_message(error)
        if "failed to find initial working directory" in error:
            why = os.strerror(errno) if errno else "not found"
            return UsageError(f"cannot use {cwd!r} as the working directory inside the "
                              f"sandbox: {why}", field="cwd")
        if errno and ("error finding executable " in error or "failed to load " in error):
            failed = ExecFailed(errno)
            if "failed to load " in error:
                from .host.finish import interpreter_inside

                failed.interpreter = interpreter_inside(self, name)
            return failed
        return SandboxSetupError(f"runsc exec failed: {error[:300]}", step="runsc")

    def kill_tree(self, ns_pid: int, timeout: float = 5.0) -> None:
        """SIGKILL ns_pid and every descendant the Sentry lists for it. Each is stopped
        first (SIGSTOP), until a listing finds none unstopped, so that no process of the
        tree runs on, forks, or sees a child die while the others are signalled one by
        one (a shell would go on to its next line); then every one is killed, and the
        listing repeated until none is left."""
        deadline = time.monotonic() + timeout
        stopped: set[int] = set()
        for _ in range(KILL_ROUNDS):
            new = _descendants(self.processes(), ns_pid) - stopped
            if not new or time.monotonic() > deadline:
                break
            self.signal_pids(new, "STOP")
            stopped |= new
        for _ in range(KILL_ROUNDS):
            if stopped:
                self.signal_pids(stopped, "KILL")
            if time.monotonic() > deadline:
                return
            stopped = _descendants(self.processes(), ns_pid)
            if not stopped:
                return

    def signal_pids(self, pids: set[int], sig: str) -> None:
        """`runsc kill --pid=P` for each pid at once; returns when each has answered."""
        procs = [spawn_quiet(self._runsc("kill", f"--pid={p}", self.cid, sig))
                 for p in sorted(pids)]
        for p in procs:
            try:
                os.waitpid(p, 0)
            except ChildProcessError:
                pass

    def processes(self) -> dict[int, set[int]]:
        """{pid: its ppids} of every process inside, from the Sentry (`runsc ps`), or {} when
        the sandbox is not running."""
        import subprocess

        if self.target is None:
            return {}
        try:
            p = subprocess.run(self._runsc("ps", self.cid), capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=PS_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError):
            return {}
        if p.returncode:
            return {}
        return parse_ps(p.stdout)

    def release(self, group) -> list[str]:
        return []

    def prepare(self) -> None:
        """Nothing to prepare ahead: runsc exec needs no entrant."""

    def drop_entrant(self) -> None:
        pass

    def alive(self) -> bool:
        return self.target is not None and self.target.alive()

    def exit_reason(self) -> str | None:
        """Why the sandbox ended by itself, when the host can tell: its memory cgroup's
        OOM killer took one of gVisor's processes (the Sentry or the gofer), which ends
        gVisor's kernel and every process in it."""
        if _oom_kills(self.sandbox_cg):
            return ("the sandbox's memory (limits.memory, gVisor's own included) ran out: "
                    "the host's OOM killer ended gVisor's kernel and with it every process "
                    "of the sandbox; every process, mount and cgroup of the sandbox was "
                    "removed")
        return None

    # -- teardown -------------------------------------------------------------------------
    def close(self) -> list[str]:
        """SIGKILL runsc run (its gofer and Sentry go with it) and everything left in the
        sandbox's cgroup, reap them, drop runsc's state, stop the proxy, unmount the netns,
        remove the cgroup, the mounts and the run dir. Idempotent."""
        problems: list[str] = []
        target, self.target = self.target, None
        if self.proxy is not None:   # its last events first; it is in the cgroup too
            proxy, self.proxy = self.proxy, None
            for e in proxy.stop():
                if e.get("kind") == "teardown":
                    problems.append(e.get("message", "the egress proxy failed"))
        cg = self.sandbox_cg
        members: set[int] = set(cg.pids()) if cg is not None else set()
        if cg is not None:
            try:
                u = cg.usage()
                self.final_usage = limits.Usage(cpu_s=cg.cpu_seconds(),
                                                memory_peak_bytes=u.memory_peak_bytes,
                                                oom_kills=u.oom_kills)
            except OSError:
                pass
        if self.runsc_pid:
            kill_pid(self.runsc_pid)
            for p in list(self._execs):   # their supervisors reap them
                kill_pid(p)
            if cg is not None:
                members.update(cg.pids())
                try:
                    cg.kill_all()
                except SandboxSetupError as e:
                    problems.append(e.message)
            try:
                os.waitpid(self.runsc_pid, 0)
            except ChildProcessError:
                pass
            _reap(members - {self.runsc_pid})
            self.runsc_pid = 0
        if target is not None:
            target.close()
        if self.cid and getattr(self, "state", None) and os.path.isdir(self.state):
            problems += [e["message"] for e in remove_state(self.state, self.cid)]
        if self.net is not None:
            net, self.net = self.net, None
            more = net.close()
            problems += more
            if not more and net.path in self.dir.mounts:
                self.dir.mounts.remove(net.path)
        if self.sandbox_cg is not None:
            cg, self.sandbox_cg = self.sandbox_cg, None
            problems += destroy_cgroup(cg)
        if self._subreaper:
            self._subreaper = False
            subreaper_release()
        problems += super().close()
        return problems


def spawn_quiet(argv: list[str]) -> int:
    """argv with /dev/null as stdio: its pid."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        pid, _, _ = spawn(argv[0], argv, dict(_PATH_ENV), stdin_fd=null, pass_fds=(),
                          stdout_fd=null)
    finally:
        os.close(null)
    return pid


def parse_ps(out: bytes) -> dict[int, set[int]]:
    """`runsc ps` (UID PID PPID C TTY STIME TIME CMD): {pid: the ppids claimed for it}.
    CMD is the process's own name (hostile: up to 15 bytes it chose, a newline included),
    so a line is taken only with numeric UID, PID and PPID, and a pid a forged line names
    again keeps every parent claimed: a command's kill then takes more of the sandbox's
    processes, never fewer (the forger is inside and could kill them itself anyway)."""
    table: dict[int, set[int]] = {}
    for line in out[:STATE_MAX].splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and all(f.isdigit() and len(f) < 10 for f in fields[:3]):
            table.setdefault(int(fields[1]), set()).add(int(fields[2]))
    return table


def _descendants(table: dict[int, set[int]], root: int) -> set[int]:
    if root not in table:
        return set()
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppids in table.items():
            if parent in ppids and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def _read_pid(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read(32).strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() and len(text) < 10 else None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
