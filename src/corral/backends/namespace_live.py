"""The namespace tier's live sandbox: one bwrap for the sandbox's whole life, commands
entered into it from the host side (linux/enter.py).

    live = NamespaceLive(backend, plan, check)       # bwrap + its init running, ready
    cmd = live.start(argv, env, cwd="/scratch", stdin_fd=fd)   # a Started: pid, pipes, cgroup
    ...                                              # the runtime supervises it
    live.release(cmd.cgroup)                         # emptied: kept for the next command
    live.close()                                     # every process, mount, cgroup gone

What runs: bwrap (the supervisor's child, --die-with-parent) builds the namespaces exactly
as for a one-shot exec (namespace.py: the same options, the same gate: cgroup and rlimits
set before the namespaces exist, the seccomp program written only once bwrap reported its
child), then its own init (pid 1 inside; it reaps orphans) runs a holder, `sleep
infinity`, whose exit ends init and with it the pid namespace. Nothing of corral's runs
inside: the holder only keeps init alive. Both run as the sandbox's root (uid 0 of its
user namespace) and a command can kill them; the runtime sees init's pidfd become
readable and closes the sandbox with a teardown event.

Cgroups: the sandbox's own (memory, pids, cpu quota: sandbox-wide) holds bwrap and init;
each command gets a child cgroup of it (no limits of its own; CPU accounting, its own
kill, its own OOM counter), so the sandbox's limits bind the sum of every command.
"""

from __future__ import annotations

import os
import select
import threading
import time

from ..errors import SandboxSetupError, UsageError
from ..events import NoticeEvent
from ..linux import enter, spawner
from ..linux._sys import subreaper_acquire, subreaper_release
from ..linux.shellexec import simple_words
from ..linux.supervise import bwrap_child_pid, bwrap_status_rest, kill_pid, spawn
from ..plan import EgressProxy, Environment
from .base import ExecLimits
from .host.cgroups import destroy_cgroup, run_cgroup
from .host.proxy import start_proxy, with_relay_tasks
from .namespace import (
    USER_ID,
    NamespaceSandbox,
    _confine,
    _write_all,
)

#: what bwrap's init runs for the sandbox's life: it blocks forever and uses no CPU
HOLDER = ("/usr/bin/sleep", "infinity")
#: idle command cgroups a live sandbox keeps for its next commands
KEEP_CGROUPS = 4
#: entrants a live sandbox keeps ready (prepare()) once its commands have come faster
#: than it could prepare them (a command found none ready): a command started right after
#: another (no pause for the watchdog to prepare one) still finds one entered and waiting.
#: Until then one: the second's fork, in the pause between commands, cost a command after
#: a short pause 0.2-0.4 ms (bench/live_ab.py, 20 ms pauses; none at 100 ms)
READY_ENTRANTS = 2
#: corral's own processes in a live sandbox's cgroup beyond a one-shot run's (bwrap and
#: its init count there too): the holder, the entrants waiting for the next commands and
#: one on its way out; added to limits.pids so the commands keep the policy's count
OWN_PIDS = 2 + READY_ENTRANTS


class Started:
    """A command just started inside: its host pid, the read ends of its stdout and
    stderr, and its cgroup. `pidfd` and `exit_status`: the command's pidfd and how to get
    its wait status once that says it exited (the entrant's zygote reaps it: it is not
    our child; linux/enter.py), or -1 and None for a child of ours. The owner closes
    `pidfd` (close_pidfd())."""

    __slots__ = ("before_fd", "before_wait", "cgroup", "direct", "err_r", "exit_status",
                 "ns_pid", "out_r", "pid", "pidfd", "tally")

    def __init__(self, pid: int, out_r: int, err_r: int, cgroup, before_wait=None,
                 tally=None, pidfd: int = -1, exit_status=None, ns_pid: int = 0) -> None:
        self.pid, self.out_r, self.err_r, self.cgroup = pid, out_r, err_r, cgroup
        #: to call before reaping pid (supervise's before_wait): the entrant's own reaping
        self.before_wait = before_wait
        #: readable once before_wait() would not wait (the entrant's pidfd), or -1
        self.before_fd = -1
        self.pidfd, self.exit_status = pidfd, exit_status
        #: a /bin/sh -c line exec'd without the shell (linux/shellexec.py): a death by a
        #: signal of its own is reported as the shell would (commands.py)
        self.direct = False
        #: its pid inside the sandbox (0: not known; never the host's, which says where
        #: the host's other processes are)
        self.ns_pid = ns_pid
        #: the refused syscalls seen, when observed (linux/seccomp_notify.Tally)
        self.tally = tally

    def syscall_events(self) -> list[dict]:
        """The command's refused syscalls as "syscall" events (none unobserved)."""
        if self.tally is None:
            return []
        from .host.syscalls import syscall_events

        return syscall_events(self.tally)


def _pid_inside(entrant, pid: int, pidfd: int) -> tuple[int, object]:
    """(the pid inside the sandbox of the command `pid` just started, how to get its wait
    status). Read from its pidfd's fdinfo while it runs; a command that ended at once
    may have been reaped (by the zygote) before this looks: then its status has been
    sent, with the pid inside that the zygote read before reaping it, and is taken now
    (its pidfd says it exited: nothing to wait for but that message). 0 if neither says."""
    inside = enter.ns_pid_of(pidfd) if pidfd >= 0 else None
    if inside is not None or pidfd < 0 or not enter._exited(pidfd):
        return inside or 0, entrant.exit_status
    status = entrant.exit_status(pid)

    def told(_pid: int, status=status) -> int:
        return status
    return entrant.ns_pid or 0, told


def _started(entrant, cg, tally, pid: int, out_r: int, err_r: int) -> Started:
    """The Started of the command `entrant` just started."""
    pidfd, entrant.b_pidfd = entrant.b_pidfd, -1
    inside, exit_status = _pid_inside(entrant, pid, pidfd)
    started = Started(pid, out_r, err_r, cg, entrant.reap, tally, pidfd=pidfd,
                      exit_status=exit_status, ns_pid=inside)
    started.direct = entrant.direct
    started.before_fd = entrant.pidfd if entrant.pid else -1
    return started


class NamespaceLive(NamespaceSandbox):
    """A namespace-tier sandbox kept running; see the module's docstring."""

    def __init__(self, backend, plan, check, granted=None, upstream_ca=None, *,
                 user_account: bool = False) -> None:
        """`user_account`: an unprivileged account beside root (namespace.USER_ID, home
        USER_HOME): start(user=USER_ID) runs a command as it."""
        self.user_account = user_account
        self.bwrap_pid = 0
        self.init_pid = 0
        self.target = None
        self.sandbox_cg = None
        self.proxy = None
        #: events about the sandbox's start that change nothing of it (runtime/live.py
        #: puts them in sb.events): the egress proxy's zygote replaced, say
        self.notices: list[dict] = []
        self._status_r = -1
        self._free: list = []     # emptied command cgroups
        self._forking = threading.Condition(threading.Lock())
        self._forks = 0           # entrants being forked with the caller's lock let go
        self._entrants: list = []    # (Entrant, its cgroup) for the next commands, oldest first
        #: how many prepare() keeps: 1, READY_ENTRANTS once a command found none ready
        self._want = 1
        self._taken = 0           # commands that took a prepared or new entrant
        self._cmds = 0
        self._subreaper = False
        self._init_fd = -1
        #: the seccomp listeners' observer (observe_syscalls()), else None
        self.observer = None
        super().__init__(backend, plan, check, granted, upstream_ca)  # closes on failure
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- start ----------------------------------------------------------------------------
    def _start(self) -> None:
        plan = self.plan
        lim = ExecLimits.from_plan(plan)
        self.rlimits = (lim.rlimits["nofile"], lim.rlimits["fsize"], int(lim.cpu) + 1)
        self.env = dict(plan.find(Environment)[0].env)
        self.program = enter.Program(self.bpf)
        cg = self.sandbox_cg = run_cgroup(self.dir, f"{self.dir.id}-live", plan, self.check,
                                          pids=with_relay_tasks(plan, lambda n: n + OWN_PIDS))
        if cg is None:
            raise SandboxSetupError("a live sandbox needs a cgroup of its own (every command "
                                    "gets a child of it) and this host has none usable; "
                                    "see `corral doctor`", step="cgroup")
        _check_hierarchy(cg)
        attach = cg.attach_fds()
        uid, gid = self.uid, self.gid
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        args_r, args_w = os.pipe()
        status_r, status_w = os.pipe()
        gate_r, gate_w = os.pipe()
        ours, theirs = [args_w, gate_w], [args_r, status_w, gate_r]
        try:
            line, blob = self.bwrap_line(list(HOLDER), args_r=args_r, gate_r=gate_r,
                                         status_w=status_w)
            subreaper_acquire()
            self._subreaper = True
            try:
                # from the spawner thread: bwrap's --die-with-parent fires when the
                # thread that forked it exits, not only the process (linux/spawner.py)
                pid, out_r, err_r = spawner.call(spawn, line[0], line, {}, stdin_fd=devnull,
                                                 pass_fds=(*theirs, *self.fds.values()),
                                                 uid=uid if self.root else None,
                                                 gid=gid if self.root else None)
            finally:
                for fd in theirs:
                    os.close(fd)
                theirs = []
            self.bwrap_pid = pid
            self._status_r = status_r
            os.close(out_r)
            try:
                if not _confine(pid, attach, nofile=lim.rlimits["nofile"],
                                fsize=lim.rlimits["fsize"],
                                cpu_seconds=None, as_ids=(uid, gid) if self.root else None):
                    raise SandboxSetupError("bubblewrap exited at once", step="bwrap")
                _write_all(args_w, blob)
                os.close(args_w)
                ours.remove(args_w)
                init = bwrap_child_pid(status_r, block=True)
                if init is None:
                    raise SandboxSetupError("bubblewrap failed: " + _err_text(err_r),
                                            step="bwrap")
                self.init_pid = init
                self._init_fd = os.pidfd_open(init)
                os.write(gate_w, self.bpf)
                os.close(gate_w)    # bwrap reads its program up to EOF
                ours.remove(gate_w)
            except BrokenPipeError:
                raise SandboxSetupError("bubblewrap failed: " + _err_text(err_r),
                                        step="bwrap") from None
            finally:
                os.close(err_r)
            egress = plan.find(EgressProxy)
            if egress:
                from ..grants import proxy_config
                from .host.launch import listen_in_netns

                config = proxy_config(egress[0].config_json, self.granted, self.ca,
                                      self.upstream_ca)
                self.proxy = spawner.call(start_proxy, config, listen_in_netns(init), attach,
                                          uid, gid, live=True)
                if self.proxy.notice:
                    self.notices.append(NoticeEvent(self.proxy.notice).to_dict())
            self._wait_holder()
            self.target = enter.Target(init, pidfd=self._init_fd)
            self._init_fd = -1
        finally:
            for fd in (*ours, *theirs, *attach):
                os.close(fd)
            os.close(devnull)

    def _wait_holder(self) -> None:
        """Return once init's child (the holder) runs, so that a command entered next sees
        the finished root (bwrap builds it before it forks init; init forks the holder
        right away: this is bounded polling of /proc, a few ms at most)."""
        deadline = time.monotonic() + 10
        path = f"/proc/{self.init_pid}/task/{self.init_pid}/children"
        while time.monotonic() < deadline:
            try:
                with open(path, "rb") as f:
                    if f.read().strip():
                        return
            except OSError as e:
                raise SandboxSetupError(f"reading {path}: {e.strerror}", step="bwrap") from None
            if not _alive(self._init_fd):
                raise SandboxSetupError("the sandbox's init exited at once", step="bwrap")
            time.sleep(0.0005)
        raise SandboxSetupError("the sandbox's init did not start its holder",
                                step="bwrap")

    # -- observing refused syscalls ------------------------------------------------------
    def observe_syscalls(self) -> None:
        """From now on each command's seccomp program is loaded with a listener and every
        call it refuses is answered by this sandbox's observer, with the same errno, and
        counted (linux/seccomp_notify.py; docs/audit.md). Call before the first command."""
        if self.observer is not None:
            return
        from ..linux.seccomp_notify import Observer, notifying

        try:
            prog = notifying(self.bpf)
        except ValueError as e:
            raise SandboxSetupError(f"the seccomp program cannot be observed: {e}",
                                    step="seccomp") from None
        self.drop_entrant()   # one prepared without a listener
        self.observer = Observer(self.bpf, name=f"corral-seccomp-{self.dir.id}")
        self.program = enter.Program(prog, listen=True)

    # -- commands -------------------------------------------------------------------------
    def start(self, argv: list[str], env: dict[str, str], *, cwd: str, stdin_fd: int,
              cpu_seconds: float | None = None, tty_fd: int | None = None,
              user: int | None = None) -> Started:
        """Start argv inside, in a cgroup of its own (a child of the sandbox's), through
        the entrant prepared ahead (prepare()) or a new one. Raises supervise.ExecFailed
        when its exec failed inside (nothing ran), SandboxSetupError when the sandbox
        cannot be entered (it is gone; step "enter") or the command started but could not
        be handed over (step "handover": it is killed with its cgroup here, and the
        entrant waited until it was reaped).

        `tty_fd`: a terminal's slave as its stdin, stdout, stderr and controlling terminal
        (util-linux setsid --ctty runs first, as namespace.py's tty exec does); the
        Started's out_r and err_r are then -1 (read the master)."""
        words = None
        if tty_fd is None and len(argv) == 3 and argv[0] == "/bin/sh" and argv[1] == "-c":
            words = simple_words(argv[2])   # exec'd without the shell if the same
        if tty_fd is not None:
            from .namespace import SETSID

            if not os.access(SETSID, os.X_OK):
                raise SandboxSetupError(f"a terminal needs util-linux's {SETSID}",
                                        step="tty")
            argv = [SETSID, "--ctty", "--", *argv]
            stdin_fd = tty_fd
        if self.target is None or not self.target.alive():
            raise SandboxSetupError("the sandbox is not running", step="enter")
        if user not in (None, 0):   # an entrant of its own, that account's id
            if not self.user_account or user != USER_ID:
                raise UsageError(f"user {user}: this sandbox has no such account (only "
                                 f"{USER_ID}, in a sandbox made with a user account)",
                                 field="user")
            cg = self._cgroup()
            attach = cg.attach_fds()
            try:
                entrant = enter.Entrant(self.target, attach, self.program, uid=user)
            except BaseException:
                self.release(cg)
                raise
            finally:
                for fd in attach:
                    os.close(fd)
        else:
            entrant, cg = self._take_entrant()
        nofile, fsize, cpu = self.rlimits
        if cpu_seconds is not None:
            cpu = int(cpu_seconds) + 1
        for again in (True, False):
            tally = None
            try:
                if self.observer is not None:
                    # answered before anything runs under it: the command's start (its
                    # vfork child before exec holds the entrant) must never wait on a
                    # refusal
                    entrant.wait_ready()
                    if entrant.listener >= 0:
                        fd, entrant.listener = entrant.listener, -1
                        tally = self.observer.watch(fd)
                pid, out_r, err_r = entrant.start(argv, env, cwd=cwd, stdin_fd=stdin_fd,
                                                  rlimits=(nofile, fsize, cpu),
                                                  stdout_fd=tty_fd, words=words)
            except (BrokenPipeError, ConnectionResetError):
                entrant, cg = self._entrant_again(entrant, cg,
                                                  last=not again or user not in (None, 0))
                continue
            except BaseException:
                self._let_go(entrant, cg)
                raise
            break
        return _started(entrant, cg, tally, pid, out_r, err_r)

    def _entrant_again(self, entrant, cg, *, last: bool):
        """After the entrant died between _take_entrant's look and its read of the request,
        or before it was even ready (it never had the request: nothing ran): let it go
        and take a new one, or, on the last try or with the sandbox gone, raise
        SandboxSetupError (step "enter")."""
        self._let_go(entrant, cg)
        if last or not self.alive():
            raise SandboxSetupError("the sandbox's entrant died before it took the command; "
                                    "nothing ran", step="enter") from None
        return self._take_entrant()

    def start_send(self, argv: list[str], env: dict[str, str], *, cwd: str,
                   stdin_fd: int):
        """start()'s first half, for a caller that waits for the entrant's answer itself
        (an event loop: corral serve's foreground command, after quick_start()): the
        request sent to a prepared entrant; returns (fd to wait for readable, what
        start_answer() takes). No terminal, no other account, no observer (start())."""
        words = None
        if len(argv) == 3 and argv[0] == "/bin/sh" and argv[1] == "-c":
            words = simple_words(argv[2])
        if self.target is None or not self.target.alive():
            raise SandboxSetupError("the sandbox is not running", step="enter")
        entrant, cg = self._take_entrant()
        nofile, fsize, cpu = self.rlimits
        for again in (True, False):
            try:
                sent = entrant.send(argv, env, cwd=cwd, stdin_fd=stdin_fd,
                                    rlimits=(nofile, fsize, cpu), words=words)
            except (BrokenPipeError, ConnectionResetError):
                entrant, cg = self._entrant_again(entrant, cg, last=not again)
                continue
            except BaseException:
                self._let_go(entrant, cg)
                raise
            return entrant.sock, (entrant, cg, sent)
        raise AssertionError("unreachable")

    def start_answer(self, pending) -> Started:
        """start()'s second half: the entrant's answer to start_send()'s request read
        (once its socket is readable: else this blocks until it comes), the command's
        Started, or start()'s errors. Every start_send() is answered so (its command
        may run already)."""
        entrant, cg, sent = pending
        try:
            pid, out_r, err_r = entrant.answer(sent)
        except (BrokenPipeError, ConnectionResetError):
            self._let_go(entrant, cg)
            raise SandboxSetupError("the sandbox's entrant ended before it took the "
                                    "command", step="enter") from None
        except BaseException:
            self._let_go(entrant, cg)
            raise
        return _started(entrant, cg, None, pid, out_r, err_r)

    def prepare(self, lock=None, busy: bool = False) -> None:
        """Fork the next commands' entrants ahead (linux/enter.Entrant): in their cgroups
        and the sandbox's namespaces, waiting; one, or READY_ENTRANTS once a command found
        none ready (_take_entrant), but one while `busy` (a command runs: the forks and
        setns of more would compete with it). `lock`:
        the caller's lock (held), let go while the zygote forks each, so that a command's
        start or end never waits for that."""
        most = 1 if busy else self._want
        while len(self._entrants) < most and self.target is not None:
            self._prepare_one(lock)

    def _prepare_one(self, lock=None) -> None:
        cg = self._cgroup()
        attach = cg.attach_fds()
        target, program = self.target, self.program
        try:
            with self._forking:     # close() waits for it: target's fds stay open
                self._forks += 1
            if lock is not None:
                lock.release()
            try:
                entrant = enter.Entrant(target, attach, program)
            finally:
                with self._forking:
                    self._forks -= 1
                    self._forking.notify_all()
                if lock is not None:
                    lock.acquire()
        except BaseException:
            self.release(cg)
            raise
        finally:
            for fd in attach:
                os.close(fd)
        if self.target is None or program is not self.program:
            entrant.close()     # closed, or observed since, meanwhile: not for a command
            if self.target is not None:
                cg.kill_all()
                self.release(cg)
            return
        self._entrants.append((entrant, cg))

    def _cgroup(self):
        while self._free:
            cg = self._free.pop()
            try:
                if cg.renew(max_residue=None):
                    return cg
            except SandboxSetupError:
                pass
            destroy_cgroup(cg)
        self._cmds += 1
        return self.sandbox_cg.child(f"c{self._cmds}")

    def release(self, cg) -> list[str]:
        """A command's cgroup once it is empty (kill_all() done): kept for reuse or
        removed. Returns teardown problems."""
        if self.target is not None and len(self._free) < KEEP_CGROUPS and cg._emptied \
                and cg.version == "v1":
            self._free.append(cg)
            return []
        return destroy_cgroup(cg)

    def drop_entrant(self) -> None:
        """Let the prepared entrants go (an idle sandbox need not keep them)."""
        while self._entrants:
            self._let_go(*self._entrants.pop())

    def quick_start(self) -> bool:
        """Whether start() would return without waiting on more than the entrant's answer
        (a prepared entrant ready, no syscall observer to hand its listener to): the
        service then starts a foreground command from its event loop (runtime/commands.py
        Commands._begin), not from a thread. Read without the sandbox's lock: a hint,
        which Live._start_send acts on only if that lock is free."""
        if self.observer is not None or not self._entrants:
            return False
        entrant = self._entrants[0][0]
        if entrant._ready:
            return True
        try:
            return bool(select.select([entrant.sock], (), (), 0)[0])
        except (OSError, ValueError):
            return False

    def _take_entrant(self):
        """A prepared entrant (and its cgroup) still waiting, or a new one: one that died
        while it waited (Entrant.waiting) is let go, never handed a command."""
        self._taken += 1
        while self._entrants:
            entrant, cg = self._entrants.pop(0)
            if entrant.waiting():
                return entrant, cg
            self._let_go(entrant, cg)
        if self._taken > 1:     # (the first may come before the sandbox's first is ready)
            self._want = READY_ENTRANTS    # commands come faster than one is prepared
        self._prepare_one()
        return self._entrants.pop(0)

    def _let_go(self, entrant, cg) -> None:
        try:
            entrant.close()
        except OSError:
            pass
        cg.kill_all()
        self.release(cg)

    def alive(self) -> bool:
        return self.target is not None and self.target.alive()

    # -- teardown -------------------------------------------------------------------------
    def close(self) -> list[str]:
        """Kill init (the whole pid namespace goes with it), reap bwrap, stop the proxy,
        remove every cgroup, the mounts and the run dir. Idempotent."""
        problems: list[str] = []
        with self._forking:       # an entrant being forked still uses the target's fds
            self._forking.wait_for(lambda: self._forks == 0, timeout=10)
        ready, self._entrants = self._entrants, []
        for entrant, _ in ready:
            entrant.close()       # its cgroup goes with the sandbox's
        if self.observer is not None:
            observer, self.observer = self.observer, None
            observer.close()      # the listeners too: a call still refused gets ENOSYS
        target, self.target = self.target, None
        if target is None and self._init_fd >= 0:   # failed before the Target was made
            target = enter.Target.__new__(enter.Target)
            target.pidfd, target.root_fd, self._init_fd = self._init_fd, -1, -1
        if target is not None:
            try:
                import _signal

                _signal.pidfd_send_signal(target.pidfd, 9)
            except ProcessLookupError:
                pass
            poller = select.poll()
            poller.register(target.pidfd, select.POLLIN)
            poller.poll(2000)
        if self.bwrap_pid:
            kill_pid(self.bwrap_pid)
            try:
                os.waitpid(self.bwrap_pid, 0)
            except ChildProcessError:
                pass
            self.bwrap_pid = 0
        if target is not None:
            try:   # bwrap's monitor reaps it, unless it went first: then it is ours
                os.waitid(os.P_PIDFD, target.pidfd, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                pass
            target.close()
        if self._status_r >= 0:
            bwrap_status_rest(self._status_r)
            os.close(self._status_r)
            self._status_r = -1
        if self.proxy is not None:
            proxy, self.proxy = self.proxy, None
            for e in proxy.stop():
                if e.get("kind") == "teardown":
                    problems.append(e.get("message", "the egress proxy failed"))
        free, self._free = self._free, []
        for cg in free:
            problems += destroy_cgroup(cg)
        if self.sandbox_cg is not None:
            cg, self.sandbox_cg = self.sandbox_cg, None
            problems += destroy_cgroup(cg)   # children (commands still listed) first
        if self._subreaper:
            self._subreaper = False
            subreaper_release()
        problems += super().close()
        return problems


def _alive(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)


def _check_hierarchy(cg) -> None:
    """Fail closed when the memory cgroup is not hierarchical (cgroup v1 with
    use_hierarchy = 0): the sandbox's memory limit would not cover its commands."""
    if cg.version != "v1":
        return
    d = cg._dirs.get("memory")
    if d is None:
        return
    path = os.path.join(d, "memory.use_hierarchy")
    try:
        with open(path) as f:
            on = f.read().strip() == "1"
        if not on:
            with open(path, "w") as f:
                f.write("1")
            on = True
    except OSError as e:
        raise SandboxSetupError(f"{path}: {e.strerror}; a live sandbox needs a "
                                f"hierarchical memory cgroup", step="cgroup",
                                errno=e.errno) from None


def _err_text(err_r: int) -> str:
    """The last line bwrap wrote to its stderr (it has exited or is about to)."""
    poller = select.poll()
    poller.register(err_r, select.POLLIN)
    data = b""
    deadline = time.monotonic() + 2
    while len(data) < 8192 and time.monotonic() < deadline:
        if not poller.poll(200):
            continue
        chunk = os.read(err_r, 4096)
        if not chunk:
            break
        data += chunk
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else "no message"
