"""Live sandboxes: one set of namespaces kept for many commands, until killed or timed out.

    sb = corral.Sandbox.create({"limits": {"memory": "1G"}}, timeout=600)
    sb.commands.run("echo hi > /scratch/a")
    srv = sb.commands.run("python3 -m http.server 8000", background=True)
    print(sb.commands.run("curl -s 127.0.0.1:8000/a").stdout)
    sb.set_timeout(60)            # 60 s from now
    sb.get_info()                 # state, created, ends, policy digest, usage so far
    sb.kill()

The sandbox ends itself when its timeout passes, when it has been idle for
limits.idle_timeout (if the policy sets one: no command running and no call made), and when
its init exits (a process inside killed it, or the holder it waits for): every process,
mount, cgroup and the egress proxy go, a teardown event says why (`sb.events`,
get_info().ended_by), and any later call raises SandboxClosed. The process that created
it supervises it (bwrap is its child); a sandbox meant to outlive that process is created
by a supervisor process of its own (runtime/supervisor.py, `corral sandbox create`).
"""

from __future__ import annotations

import os
import select
import threading
import time

from .._record import Default, Record
from ..audit import record as _audit
from ..errors import SandboxClosed, UsageError
from ..events import TeardownEvent
from . import sandbox as _sandbox
from .commands import CommandInfo, Commands
from .sandbox import Sandbox

#: bounds of a sandbox's timeout (seconds) and of its metadata
MAX_TIMEOUT_S = 7 * 86400
MAX_METADATA = 64
MAX_METADATA_TEXT = 1024
#: how often a sandbox with processes left behind by finished commands looks whether
#: they are gone (their cgroup then goes back to the pool)
LINGER_CHECK_S = 1.0
#: the next command's entrant (a forked copy of this process, ~3 MB of it its own once it
#: ran) is kept ready while the sandbox is in use: until this long after the last call or
#: command, then let go (an idle sandbox costs only bwrap, its init and the holder)
ENTRANT_KEEP_S = 10.0
#: after a command's end, the watchdog waits this long before it forks the next entrant
#: (Python work holding the GIL): the command's caller delivers its Result meanwhile
PREPARE_AFTER_S = 0.002


class SandboxInfo(Record):
    """What `sb.get_info()` returns."""

    id: str
    state: str                     # "running" | "ended"
    isolation: str
    created: float                 # time.time()
    ends: float                    # time.time() when its timeout passes
    policy_digest: str             # "sha256:" + hex of the canonical policy TOML
    idle_timeout: float | None = None
    metadata: dict = Default(dict)
    usage: dict = Default(dict)    # cpu_s, memory_bytes, memory_peak_bytes, commands, running
    ended_by: str | None = None    # "killed" | "timeout" | "idle" | "init"
    #: what the tier offers in a live sandbox: commands, shell, pty, run_code, files, ...
    offers: dict = Default(dict)


#: get_info().offers of a tier that says nothing of its own (the namespace tier's)
OFFERS = {"commands": "any argv or /bin/sh command line", "shell": True, "pty": True,
          "run_code": "stateful", "files": "the sandbox's whole tree", "background": True,
          "network": "per policy"}


def _check_timeout(seconds, field: str = "timeout") -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not 0 < seconds <= MAX_TIMEOUT_S:
        raise UsageError(f"{field} must be seconds in (0, {MAX_TIMEOUT_S}], not {seconds!r}",
                         field=field)
    return float(seconds)


def _check_metadata(metadata) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA or not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 128
            and len(v) <= MAX_METADATA_TEXT for k, v in metadata.items()):
        raise UsageError(f"metadata must be a dict of at most {MAX_METADATA} str keys "
                         f"(1-128 chars) to str values (at most {MAX_METADATA_TEXT})",
                         field="metadata")
    return dict(metadata)


def policy_digest(policy) -> str:
    import hashlib

    from ..policy.dump import dump_toml

    return "sha256:" + hashlib.sha256(dump_toml(policy).encode()).hexdigest()


class Live(Sandbox):
    """A live sandbox (see the module's docstring). Made by `Sandbox.create`."""

    _STARTS_COMMANDS = True

    def __init__(self, policy=None, *, timeout: float = 300, metadata=None, env=None,
                 backend=None, learn: bool = False, user_account: bool = False) -> None:
        timeout = _check_timeout(timeout)
        self.metadata = _check_metadata(metadata)
        super().__init__(policy, env=env, backend=backend, learn=learn)
        self._lock = threading.RLock()
        self._running: list = []
        self._lingering: list = []       # (CommandHandle, cgroup) of finished commands
        self._ended: str | None = None
        self._started_count = 0
        #: the sandbox's own events: why it ended, and teardown problems
        self.events: list[dict] = []
        from .netlog import NetLog

        #: the proxy's events, for the Results of commands and the service's event stream
        self._netlog = NetLog(self.events)
        if user_account:   # an unprivileged account beside root: the namespace tier's
            if self._backend.name != "namespace":
                from ..errors import UnsupportedRule

                raise UnsupportedRule(f"user_account: the {self._backend.name} tier cannot "
                                      "give a sandbox an unprivileged uid beside its root; "
                                      "isolation = \"namespace\" can (as root)",
                                      field="user_account")
            self._live = self._backend.open_live(self.plan, self._check, self._granted,
                                                 self.policy.network.upstream_ca,
                                                 user_account=True)
        else:
            self._live = self._backend.open_live(self.plan, self._check, self._granted,
                                                 self.policy.network.upstream_ca)
        #: the account's uid inside (commands.run(user="user")), or None
        self.user_uid = None
        if user_account:
            from ..backends.namespace import USER_ID

            self.user_uid = USER_ID
        self.events += getattr(self._live, "notices", [])
        proxy = getattr(self._live, "proxy", None)
        if proxy is not None:
            proxy.lines.records = []     # which of its connections are open (netlog.py)
        if learn or self.policy.audit.syscalls:
            self._observe_syscalls()
        self._pid = os.getpid()
        _sandbox._close_at_exit(self._live)
        self.id = self._live.dir.id
        self.created = time.time()       # its timeout counts from here, on both clocks
        self._ends = time.monotonic() + timeout
        self._ends_wall = self.created + timeout
        _audit.record_sandbox(self.id, created=self.created, policy=self.policy,
                              isolation=self.isolation, origin=self._audit_origin)
        self._last_use = time.monotonic()
        idle = getattr(self.policy.limits, "idle_timeout", None)
        self.idle_timeout = float(idle) if idle else None
        self.commands = Commands(self)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        #: guards the wake pipe's fds, which the watchdog closes when it ends (a write to
        #: a closed fd's number could land in a file opened since)
        self._wake_mu = threading.Lock()
        self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                          name=f"corral-live-{self.id}")
        self._watchdog.start()

    def _observe_syscalls(self) -> None:
        """Learn mode or [audit] syscalls: each command's refused syscalls as "syscall"
        events where the tier can see them (the namespace tier: linux/seccomp_notify.py).
        Elsewhere [audit] syscalls is refused (UnsupportedRule; nothing is left running)
        and learn mode gets a notice saying they are not observed (docs/audit.md)."""
        from ..events import NoticeEvent

        observe = getattr(self._live, "observe_syscalls", None)
        if observe is None and self.policy.audit.syscalls:
            from ..errors import UnsupportedRule

            self._live.close()
            raise UnsupportedRule(
                f"the {self.isolation} tier cannot report refused syscalls; drop [audit] "
                f"syscalls, or use isolation = \"namespace\" (docs/audit.md)",
                field="audit.syscalls")
        if observe is None:
            self.events.append(NoticeEvent(
                f"refused syscalls are not observed on the {self.isolation} tier (only "
                f"a namespace-tier live sandbox reports them; docs/audit.md)").to_dict())
            return
        try:
            observe()
        except BaseException:
            self._live.close()
            raise
        if self._learner is not None:
            self._learner.observing_syscalls()

    # -- the public face ------------------------------------------------------------------
    @property
    def state(self) -> str:
        return "ended" if self._ended else "running"

    @property
    def ends(self) -> float:
        """When (time.time()) its timeout passes."""
        return self._ends_wall

    def set_timeout(self, seconds: float) -> None:
        """End the sandbox `seconds` from now (longer or shorter than before)."""
        seconds = _check_timeout(seconds)
        with self._lock:
            self._check_open()
            self._ends = time.monotonic() + seconds
            self._ends_wall = time.time() + seconds
            self._last_use = time.monotonic()
        self._wake()

    def get_info(self) -> SandboxInfo:
        with self._lock:
            if self._ended is None:
                self._last_use = time.monotonic()
            usage = {"commands": self._started_count, "running": len(self._running)}
            live = self._live
            cg = getattr(live, "sandbox_cg", None) if live is not None else None
            if cg is not None:
                u = cg.usage()
                usage.update(cpu_s=None if u.cpu_s is None else round(u.cpu_s, 6),
                             memory_peak_bytes=u.memory_peak_bytes,
                             memory_bytes=_memory_now(cg))
            return SandboxInfo(id=self.id, state=self.state, isolation=self.isolation,
                               created=self.created, ends=self.ends,
                               policy_digest=policy_digest(self.policy),
                               idle_timeout=self.idle_timeout, metadata=dict(self.metadata),
                               usage=usage, ended_by=self._ended,
                               offers=dict(getattr(live, "offers", None) or OFFERS))

    def kill(self) -> list[str]:
        """End the sandbox now: every process, mount, cgroup and the proxy go. Returns
        teardown problems (also in sb.events). Idempotent."""
        return self._end("killed", "the sandbox was killed")

    def close(self) -> list[str]:
        files, self._files = self._files, None
        if files is not None:
            files.close()
        code, self._code = self._code, None
        if code is not None and self._pid == os.getpid():
            code.close()
        return self.kill()

    @property
    def files(self):
        """The files API (corral.runtime.files) on the running sandbox's whole tree, as its
        init sees it: every path resolved by the kernel inside /proc/INIT/root
        (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), as the sandbox's user. On gvisor, whose
        root lives in gVisor's own kernel: the host directories behind its /scratch, /tmp,
        /dev/shm and workspace mounts (RESOLVE_BENEATH in each), as on a one-shot sandbox."""
        if self._files is None:
            if getattr(self._live, "files_in_guest", False):   # microvm: a guest kernel's
                from .guest_files import GuestFiles

                self._check_open()
                self._files = GuestFiles(self, cwd=self.plan.cwd)
                return self._files
            from .files import Files

            own = getattr(self._live, "file_mounts", None)   # a tier's own reach (wasm)
            if own is not None:
                self.enter_target()    # SandboxClosed once it ended
                mounts = own()
                try:
                    self._files = Files.over_mounts(mounts, *self.ids, cwd=self.plan.cwd)
                finally:
                    for _, fd, _ in mounts:
                        os.close(fd)
                return self._files
            target = self.enter_target()
            uid, gid = self.ids
            if target.root_fd < 0:
                # gvisor: the root is in gVisor's own kernel; the host holds the
                # directories behind its scratch and workspace mounts
                from ..backends.host.views import persistent_mounts

                mounts = persistent_mounts(self._live)
                try:
                    self._files = Files.over_mounts(mounts, uid, gid, cwd=self.plan.cwd)
                finally:
                    for _, fd, _ in mounts:
                        os.close(fd)
            else:
                self._files = Files(target.root_fd, uid, gid, cwd=self.plan.cwd)
        return self._files

    @property
    def user_files(self):
        """The files API as the sandbox's unprivileged account (user_account=True): its
        permissions apply, what it makes is owned by it (uid 1000 inside), and relative
        paths are from its home."""
        return self.files_for("user")

    def files_for(self, user: str = "root", cwd: str | None = None):
        """The files API as `user` ("root", or "user" in a sandbox with the account),
        relative paths from `cwd` (default: root's the policy's cwd, the account's its
        home). On a tree the host can open (the namespace tier); one object per pair."""
        if user not in ("root", "user"):
            raise UsageError(f"user {str(user)[:32]!r}: \"root\" or \"user\"", field="user")
        if user == "user" and self.user_uid is None:
            raise UsageError("this sandbox has no unprivileged account; create it with "
                             "Sandbox.create(user_account=True)", field="user")
        cwd = cwd or (self.plan.cwd if user == "root" else "/home/user")
        cache = self.__dict__.setdefault("_files_for", {})
        if (user, cwd) not in cache:
            from .files import Files

            target = self.enter_target()
            if target.root_fd < 0:
                raise UsageError("files_for: this tier's root is not a tree the host can "
                                 "open; use sb.files", field="user")
            uid, gid = self.ids if user == "root" else (self._live.user_uid,) * 2
            cache[(user, cwd)] = Files(target.root_fd, uid, gid, cwd=cwd)
        return cache[(user, cwd)]

    def open(self) -> Live:
        self._check_open()
        return self

    @property
    def pty(self):
        """Terminals in this sandbox: each a background command on a pty pair of its
        own (commands.run(tty_fd=slave)), among the sandbox's other processes."""
        from .pty import Pty

        refusal = getattr(self._live, "no_pty", None)   # a tier without terminals (wasm)
        if refusal:
            from ..errors import UnsupportedRule

            raise UnsupportedRule(refusal, field="pty")
        return Pty.for_live(self)

    def _code_session(self):
        """run_code's contexts, each interpreter a stream command of this sandbox
        (commands.stream: output bounded per cell by the session, not over its life; a
        real SIGINT for interrupts; kill() ends it and whatever it started)."""
        if self._code is None:
            from .channels import command_start
            from .session import CodeSession

            self._check_open()
            self._code = CodeSession(self, start=command_start(self))
        return self._code

    def exec(self, argv, *, stdin=None, timeout=None, on_stdout=None, on_stderr=None,
             tty: bool = False, tty_size=None):
        """Sandbox.exec on a live sandbox: argv runs in it (sb.commands.run)."""
        if tty:
            raise UsageError("a terminal in a live sandbox comes from sb.pty, not exec(tty=True)",
                             field="tty")
        return self.commands.run(list(argv), stdin=stdin, timeout=timeout,
                                 on_stdout=on_stdout, on_stderr=on_stderr)

    def __repr__(self) -> str:
        return f"<corral live sandbox {self.id} {self.state}>"

    # -- for helpers (files, pty, run_code) -----------------------------------------------
    def enter_target(self):
        """The running sandbox as a linux.enter.Target: `pidfd` and `root_fd` (an O_PATH
        fd of /proc/INIT/root) of its init, valid while the sandbox runs. Do not close
        them. Raises SandboxClosed."""
        with self._lock:
            self._check_open()
            return self._live.target

    @property
    def ids(self) -> tuple[int, int]:
        """The sandbox's (uid, gid) on the host: uid 0 inside maps to it."""
        return self._live.uid, self._live.gid

    # -- commands' side -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._ended is not None:
            why = {"killed": "it was killed", "timeout": "its timeout passed",
                   "idle": "it was idle past limits.idle_timeout",
                   "init": "its init exited (killed from inside)"}.get(self._ended,
                                                                       self._ended)
            raise SandboxClosed(f"sandbox {self.id} has ended: {why}")
        if self._pid != os.getpid():
            raise SandboxClosed(f"sandbox {self.id} belongs to process {self._pid}")

    def _command_env(self) -> dict[str, str]:
        return self._live.env

    def _command_cwd(self, cwd) -> str:
        if cwd is None:
            return self.plan.cwd
        if not isinstance(cwd, str) or "\0" in cwd or not 0 < len(cwd) <= 4096:
            raise UsageError("cwd must be a path (str, no NUL, at most 4096 bytes)",
                             field="cwd")
        from .commands import NO_BYTE_WHY, _bytes_ok

        if not _bytes_ok(cwd):      # bytes to the kernel, as argv and env are
            raise UsageError(f"cwd {NO_BYTE_WHY}", field="cwd")
        return cwd if cwd.startswith("/") else os.path.join(self.plan.cwd, cwd)

    def _events_copy(self) -> list[dict]:
        from ..backends.host.scratch import scratch_events

        live = self._live
        if live is None:
            return self._check.events()
        # the tier's standing events: its check's, and what it added itself (gvisor: the
        # deny list a runsc exec command goes without)
        return [dict(e) for e in live.events] + scratch_events(live.scratch)

    def _net_for(self, handle, most: float | None = None) -> list[dict]:
        """The proxy's events since `handle` started, at its end: what the proxy has
        written so far (the watchdog reads them as they come; this catches up), and, while
        a connection it may have opened is still open, what comes until the proxy closes
        it (at most `most` seconds, netlog.NET_WAIT_S). A command that opened none waits
        for nothing; events that come later go to the sandbox's events (netlog.py)."""
        from .netlog import NET_WAIT_S

        self._read_net(block=False)
        with self._lock:
            live = self._live
            proxy = live.proxy if live is not None else None
            fd = proxy.events_r if proxy is not None else -1
            waiting = fd >= 0 and self._netlog.pending(handle)
        if waiting:
            deadline = time.monotonic() + (NET_WAIT_S if most is None else most)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # in short slices: the watchdog may read the close instead
                poller.poll(int(min(0.01, left) * 1000) + 1)
                alive = self._read_net(block=False)
                with self._lock:
                    if not alive or not self._netlog.pending(handle):
                        break
        with self._lock:
            return self._netlog.end(handle)

    def _net_waits(self, handle) -> bool:
        """Whether the Result of `handle`, ended, waits for the proxy's events: a
        connection it may have opened is still open (_net_for), or learn mode."""
        if getattr(self, "_learner", None) is not None:
            return True
        self._read_net(block=False)
        with self._lock:
            live = self._live
            proxy = live.proxy if live is not None else None
            return proxy is not None and proxy.events_r >= 0 \
                and self._netlog.pending(handle)

    def _quick_start(self) -> bool:
        """Whether a foreground command would start now without a wait on more than its
        entrant's answer (NamespaceLive.quick_start): corral serve then starts it from
        its event loop."""
        live = self._live
        quick = getattr(live, "quick_start", None)
        return quick is not None and self._ended is None and quick()

    def _net_drop(self, handle) -> None:
        with self._lock:
            self._netlog.drop(handle)

    def _net_settle(self, quiet: float = 0.02, most: float = 0.25) -> None:
        """Read the proxy's events until none has come for `quiet` seconds (at most
        `most`): learn mode's catch-up on events the proxy writes after a command's end."""
        with self._lock:
            live = self._live
            proxy = live.proxy if live is not None else None
            fd = proxy.events_r if proxy is not None else -1
        if fd < 0:
            return
        deadline = time.monotonic() + most
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(int(min(quiet, left) * 1000)):
                return
            if not self._read_net(block=False):
                return

    def _read_net(self, block: bool = True) -> bool:
        """Read the proxy's events fd once (all there is, when not blocking). False at
        its end."""
        with self._lock:
            live = self._live
            proxy = live.proxy if live is not None else None
            if proxy is None:
                return False
            fd = proxy.events_r
            if not block:
                os.set_blocking(fd, False)
            try:
                while True:
                    try:
                        data = os.read(fd, 65536)
                    except BlockingIOError:
                        return True
                    if not data:
                        return False
                    proxy.lines(data)
                    self._netlog.take(proxy.lines.records)
                    if block:
                        return True
            finally:
                if not block:
                    os.set_blocking(fd, True)

    def _proxy_lost(self) -> None:
        """The proxy's events fd ended while the sandbox lives: the proxy died (killed,
        crashed). Its connections were cut and nothing reaches the network any more: said
        in the sandbox's events and in the Results of the commands running now."""
        with self._lock:
            if self._ended is not None:
                return
            event = TeardownEvent("the egress proxy died: connections through it were cut, "
                                  "and the sandbox has no network from now on").to_dict()
            self.events.append(event)
            self._netlog.tell(event)

    def _start_command(self, handle, argv, env, cwd, stdin_fd, tty_fd=None,
                       cpu_seconds=None, user=None):
        with self._lock:
            self._check_open()
            self._last_use = time.monotonic()
            from ..errors import SandboxSetupError

            extra = {}
            if cpu_seconds is not None and _takes_cpu_seconds(self._live):
                extra["cpu_seconds"] = cpu_seconds   # else the policy's: stricter
            if user is not None:
                extra["user"] = user
            # its Result takes the proxy's events from here (under this lock none comes
            # in before it starts)
            self._netlog.begin(handle)
            try:
                started = self._live.start(argv, env, cwd=cwd, stdin_fd=stdin_fd,
                                           tty_fd=tty_fd, **extra)
            except BaseException as e:
                self._netlog.drop(handle)
                if isinstance(e, SandboxSetupError) and not self._live.alive():
                    self._end("init", self._init_exited())
                    self._check_open()
                raise
            self._started_count += 1
            self._running.append(handle)
        if handle.background:
            self._wake()  # the watchdog prepares the next command's entrant now; for a
            # foreground command it does once the command is over (a fork holds the GIL)
        return started

    def _start_send(self, handle, argv, env, cwd, stdin_fd):
        """_start_command's first half for an event loop (after _quick_start()): the
        request sent to the entrant; (fd to wait for readable, what _start_answer
        takes), or None when the sandbox's lock is held (a command starting in a thread,
        an entrant being forked, the sandbox's end): nothing is sent then, and the caller
        starts the command in a thread instead, so an event loop never waits for it."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._check_open()
            self._last_use = time.monotonic()
            live = self._live
            self._netlog.begin(handle)      # as _start_command's
            try:
                fd, pending = live.start_send(argv, env, cwd=cwd, stdin_fd=stdin_fd)
            except BaseException:
                self._netlog.drop(handle)
                raise
            return fd, (live, pending)
        finally:
            self._lock.release()

    def _start_answer(self, handle, sent):
        """_start_command's second half: the entrant's answer read (its fd readable),
        the command counted as running; its Started. A sandbox that ended meanwhile took
        the command with it: its Result says so, as for a command running at the end."""
        from ..errors import SandboxSetupError

        live, pending = sent
        try:
            started = live.start_answer(pending)
        except BaseException as e:
            self._netlog.drop(handle)
            if isinstance(e, SandboxSetupError):
                if self._ended is None and not live.alive():
                    self._end("init", self._init_exited())
                self._check_open()
            raise
        with self._lock:
            self._started_count += 1
            self._running.append(handle)
            if self._ended is not None:
                handle._end_event = self._end_event
        return started

    def _command_ended(self, handle, sigkilled: bool = False) -> None:
        """`sigkilled`: it died of a SIGKILL nobody of ours sent: perhaps the pid
        namespace going down, whose init exits only after every process in it did."""
        live = self._live
        if self._ended is None and live is not None and not _init_alive(live, sigkilled):
            self._end("init", self._init_exited())    # before it leaves _running: its Result says so
        with self._lock:
            handle._released = True
            self._last_use = time.monotonic()
            if handle in self._running:
                self._running.remove(handle)
            if self._ended is not None:
                return    # the cgroups went with the sandbox
            if self.idle_timeout:
                self._wake()     # the idle clock starts again
            cg = handle._started.cgroup
            if not cg.emptied_now():
                self._lingering.append((handle, cg))
                self._wake()
                return
            self.events += [TeardownEvent(p).to_dict() for p in self._live.release(cg)]

    def _kill_left(self, handle) -> None:
        """Kill what a finished command left running, if its cgroup is still its own
        (lingering; an emptied one may already serve another command: never touched)."""
        with self._lock:
            if self._ended is not None:
                return
            for i, (h, cg) in enumerate(self._lingering):
                if h is handle:
                    del self._lingering[i]
                    cg.kill_all()
                    self.events += [TeardownEvent(p).to_dict()
                                    for p in self._live.release(cg)]
                    return

    def _list_commands(self) -> list[CommandInfo]:
        with self._lock:
            self._check_open()
            out = [CommandInfo(pid=h.pid, cmd=h.cmd, background=h.background,
                               started=h.started, pids=tuple(h._started.cgroup.pids()))
                   for h in self._running]
            for h, cg in self._lingering:
                pids = tuple(cg.pids())
                if pids:
                    from ..linux.enter_inside import ns_pid

                    out.append(CommandInfo(pid=ns_pid(pids[0]) or 0, cmd=h.cmd,
                                           background=h.background, started=h.started,
                                           detached=True, pids=pids))
            return out

    # -- the end --------------------------------------------------------------------------
    def _end(self, why: str, message: str) -> list[str]:
        """End it (once): under the lock, so whoever calls next finds it all gone."""
        with self._lock:
            if self._ended is not None or self._pid != os.getpid():
                return []
            self._ended = why
            live, self._live = self._live, None
            event = self._end_event = TeardownEvent(message).to_dict()
            for h in self._running:      # their Results say why they ended
                h._end_event = event
            self._wake()
            files, self._files = self._files, None   # its fds would keep mounts alive
            if files is not None:
                files.close()
            problems = []
            if live is not None and live in _sandbox._left_open:
                _sandbox._left_open.discard(live)
                problems = live.close()
            self.events.append(event)
            self.events += [TeardownEvent(p).to_dict() for p in problems]
            _audit.record_sandbox_end(self.id, why, self.events)
            return problems

    def _init_exited(self) -> str:
        """Why init exited, in words: the tier's own account where it has one (gvisor:
        the host's OOM killer ended gVisor's kernel), else _INIT_EXITED."""
        live = self._live
        why = getattr(live, "exit_reason", None)
        return (why() if why is not None else None) or _INIT_EXITED

    def _wake(self) -> None:
        with self._wake_mu:
            if self._wake_w < 0:
                return           # the watchdog has ended: nobody to wake
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    def _close_wake(self) -> None:
        """The watchdog's last act: its wake pipe goes (two fds a sandbox, else kept for
        the supervisor's life: a service making sandboxes all day ran out of fds)."""
        with self._wake_mu:
            r, w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)

    def _watch(self) -> None:
        """The sandbox's own thread: its timeout, its idle timeout, its init's exit, the
        proxy's events, and processes left by finished commands."""
        live = self._live
        pidfd = os.dup(live.target.pidfd)
        proxy = live.proxy
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        if proxy is not None:
            poller.register(proxy.events_r, select.POLLIN)
        try:
            while self._ended is None:
                now = time.monotonic()
                deadline = self._ends
                if self.idle_timeout and not self._running:
                    deadline = min(deadline, self._last_use + self.idle_timeout)
                if self._lingering:
                    deadline = min(deadline, now + LINGER_CHECK_S)
                if self._running:
                    self._prepare()
                elif now - self._last_use < ENTRANT_KEEP_S:
                    self._prepare()
                    deadline = min(deadline, self._last_use + ENTRANT_KEEP_S)
                else:
                    self._drop_entrant()
                for fd, _ in poller.poll(max(0, int((deadline - now) * 1000) + 1)):
                    if self._ended is not None:
                        return
                    if fd == pidfd:
                        self._end("init", self._init_exited())
                        return
                    if fd == self._wake_r:
                        os.read(self._wake_r, 512)
                        if not self._running:
                            # a command has just ended: its caller (a thread waiting for
                            # its Result, a service answering a request) gets the GIL
                            # first; the next entrant comes a moment later
                            time.sleep(PREPARE_AFTER_S)
                    elif proxy is not None and fd == proxy.events_r:
                        if not self._read_net(block=False):
                            poller.unregister(fd)
                            self._proxy_lost()
                now = time.monotonic()
                if self._ended is not None:
                    return
                if now >= self._ends:
                    self._end("timeout", "the sandbox's timeout passed; every process, "
                                         "mount and cgroup of it was removed")
                elif (self.idle_timeout and not self._running
                      and now >= self._last_use + self.idle_timeout):
                    self._end("idle", f"the sandbox was idle for {self.idle_timeout:g}s "
                                      f"(limits.idle_timeout); it was removed")
                elif self._lingering:
                    self._sweep_lingering()
        finally:
            os.close(pidfd)
            self._close_wake()

    def _prepare(self) -> None:
        """The next command's entrant, forked here (off the commands' own path)."""
        with self._lock:
            if self._ended is None and self._live is not None:
                try:
                    if _takes_lock(self._live.prepare):
                        # let go while it forks; while a foreground command runs, one
                        # ready is enough (a second fork would compete with it for CPU)
                        busy = any(not h.background for h in self._running)
                        self._live.prepare(lock=self._lock, busy=busy)
                    else:
                        self._live.prepare()
                except Exception:  # noqa: BLE001 - the next command makes its own and says why
                    pass

    def _drop_entrant(self) -> None:
        with self._lock:
            if self._ended is None and self._live is not None:
                self._live.drop_entrant()

    def _sweep_lingering(self) -> None:
        with self._lock:
            if self._ended is not None:
                return
            still = []
            for h, cg in self._lingering:
                if not cg.emptied_now():
                    still.append((h, cg))
                else:
                    self._live.release(cg)
            self._lingering = still


def _takes_cpu_seconds(live) -> bool:
    """Whether the tier's live sandbox takes start(cpu_seconds=) (backends/base.py); one
    that does not gives every command limits.cpu_time, run_code's interpreters too."""
    return _takes(live.start, "cpu_seconds")


def _takes_lock(prepare) -> bool:
    """Whether the tier's prepare() takes the sandbox's lock to let go while it forks
    (and `busy`: a foreground command runs)."""
    return _takes(prepare, "lock")


#: (function, parameter) -> whether it takes it: inspect.signature once a method, not at
#: every command (the watchdog asks at each wake-up)
_TAKES: dict = {}


def _takes(method, name: str) -> bool:
    fn = getattr(method, "__func__", method)
    key = (fn, name)
    got = _TAKES.get(key)
    if got is None:
        import inspect

        try:
            got = name in inspect.signature(method).parameters
        except (TypeError, ValueError):
            got = False
        if len(_TAKES) < 256:
            _TAKES[key] = got
    return got


def _init_alive(live, wait: bool) -> bool:
    if not wait:
        return live.alive()
    target = live.target
    if target is None:
        return False
    poller = select.poll()
    poller.register(target.pidfd, select.POLLIN)
    return not poller.poll(INIT_EXIT_WAIT_MS)


#: how long a command's end waits for init's, when the command died of a stray SIGKILL
INIT_EXIT_WAIT_MS = 250
_INIT_EXITED = ("the sandbox's init (pid 1 inside) exited: a process inside killed it or "
                "the holder it waits for; every process, mount and cgroup of the sandbox "
                "was removed")


def _memory_now(cg) -> int | None:
    d = cg._dirs.get("memory") or cg._dirs.get("cgroup2")
    if d is None:
        return None
    name = "memory.usage_in_bytes" if cg.version == "v1" else "memory.current"
    try:
        with open(os.path.join(d, name)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


__all__ = ["Live", "SandboxInfo", "policy_digest"]
