"""The microvm tier's live sandbox (`corral.Sandbox.create({"isolation": "microvm", ...})`):
one VM (restored from the warm template, backends/microvm.py) kept for the sandbox's life,
its agent switched to live mode (an L frame): many commands at once, each with an id,
served over the control channel.

    live = MicrovmLive(plan, check, mode="restore", snapshot=fd, net=...)
    started = live.start(argv, env, cwd="/scratch", stdin_fd=fd)   # runtime/commands.py
    ...

runtime/commands.py supervises a command through a host process, its pipes and its
cgroup. Here the command runs in the guest, so each command gets on the host:
- a stand-in: a tiny /bin/sh of ours (no privilege, no fds but a status pipe) that waits
  for how the guest command ended and ends the same way (exit N, or kill itself with
  signal N): the process runtime/commands.py reaps and decodes;
- two pipes, which the channel's reader fills with the command's O and E frames;
- a GuestCommand in place of the cgroup: kill_all() sends a kill (k) for the command's
  guest cgroup, and if the agent does not report the end within KILL_GRACE the VM is ended
  (every command of it ends, killed); signal_command() sends one signal (g) to the
  command's own process; usage() is the guest's account (CPU, OOM kills of its cgroup).

The host treats the guest as hostile: frames are typed and bounded (MAX_FRAME), a frame for
a command never started (or already ended), a malformed start or end, a flooded console,
or a start not answered within START_TIMEOUT ends the VM, with a teardown event. A guest
that floods a command's output fills that command's pipe: the output cap (limits.output)
is runtime/commands.py's, as on every tier.

Per command the guest agent gives: uid 1000, a session and a cgroup of its own (what it
leaves running is killed at its end), RLIMIT_CPU (limits.cpu_time), RLIMIT_NPROC
(limits.pids), RLIMIT_NOFILE. A terminal (sb.pty) is a pty of the guest's: its output is
written to the host terminal's slave (set raw: the guest's pty has the line discipline),
what is typed is read from it, and a resize is sent on (z frames). The files API (sb.files) works through commands in the guest (runtime/guest_files.py).
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import threading

from ..errors import SandboxSetupError, UnsupportedRule
from ..plan import SCRATCH, Environment
from .microvm import KILL_GRACE, MAX_FRAME, FrameReader, MicrovmSandbox, frame, parse_exit
from .namespace_live import Started

#: how long the agent has to answer a command's start
START_TIMEOUT = 30.0
#: the stand-in: reads "x CODE" or "s SIGNAL" and ends that way; anything else (the
#: supervisor gone, the VM gone) ends it with SIGKILL
STAND_IN = ('read a b; case "$a" in x) exit "$b";; s) kill -"$b" $$; '
            'exit $((128 + $b));; esac; kill -9 $$')
SH = "/bin/sh"


#: the stand-in's signals at their defaults (one we ignore would stay ignored in sh)
_SIGNALS = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


class _Target:
    """What runtime/live.py watches: QEMU's end is the sandbox's init exiting."""

    def __init__(self, pid: int) -> None:
        self.pid, self.pidfd, self.root_fd = pid, os.pidfd_open(pid), -1

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class MicrovmStarted(Started):
    """Started, plus `on_result` (runtime/commands.py calls it with the Result)."""

    __slots__ = ("on_result",)


def _winsize(fd: int) -> dict:
    import fcntl
    import termios

    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return {"rows": rows or 24, "cols": cols or 80}


class GuestUsage:
    __slots__ = ("cpu_s", "memory_peak_bytes", "oom_kills")

    def __init__(self, cpu_s, oom_kills) -> None:
        self.cpu_s, self.memory_peak_bytes, self.oom_kills = cpu_s, None, oom_kills


class GuestCommand:
    """A command in the guest, in the place runtime/commands.py keeps a cgroup."""

    #: the guest's CPU counter is not sampled while it runs: RLIMIT_CPU in the guest
    #: enforces limits.cpu_time, and the end reports it
    cpu_seconds = None

    def __init__(self, live: MicrovmLive, cid: int, cpu_limit: float) -> None:
        self.live, self.id, self.cpu_limit = live, cid, cpu_limit
        self.idb = struct.pack(">I", cid)
        self.started = threading.Event()
        self.guest_pid = 0
        self.end: dict | None = None
        self.ended = threading.Event()
        self.out_w = self.err_w = self.status_w = -1
        #: a terminal's host slave (raw), where the guest pty's output goes
        self.tty_w = -1
        self.size: dict | None = None
        self.standin = 0

    # -- runtime/commands.py's side
    def kill_all(self) -> None:
        if self.ended.is_set():
            return
        t = threading.Timer(KILL_GRACE, self._unanswered)
        t.daemon = True
        t.start()
        self.live._send(frame(b"k", self.idb))

    def _unanswered(self) -> None:
        if not self.ended.is_set():
            self.live._violation("the agent did not answer a kill")

    def signal_command(self, sig: int) -> None:
        if not self.ended.is_set() and 0 < int(sig) < 65:
            self.live._send(frame(b"g", self.idb + bytes([int(sig)])))

    def usage(self) -> GuestUsage:
        e = self.end or {}
        return GuestUsage(e.get("cpu"), e.get("oom", 0))

    def emptied_now(self) -> bool:
        return True   # the agent killed what the command left running at its end

    def pids(self) -> list[int]:
        return [self.standin] if not self.ended.is_set() else []

    def kill_guest(self) -> None:
        self.kill_all()

    # -- the channel reader's side
    def finish(self, end: dict | None) -> None:
        """The guest's end (None: the VM is gone: the stand-in dies of SIGKILL)."""
        if self.ended.is_set():
            return
        self.end = end
        line = b"s 9\n"
        if end is not None:
            line = (f"x {end['code']}\n" if end["code"] is not None
                    else f"s {end['signal']}\n").encode()
        for attr in ("out_w", "err_w", "tty_w"):
            fd = getattr(self, attr)
            if fd >= 0:
                os.close(fd)
                setattr(self, attr, -1)
        if self.status_w >= 0:
            try:
                os.write(self.status_w, line)
            except OSError:
                pass
            os.close(self.status_w)
            self.status_w = -1
        self.ended.set()
        self.started.set()


class MicrovmLive(MicrovmSandbox):
    """See the module's docstring."""

    offers = {"commands": "any argv or /bin/sh command line, in the guest", "shell": True,
              "pty": "a pty of the guest's, relayed", "run_code": "stateful", "files": "the guest's tree, through "
              "commands in it as its user (uid 1000)", "background": True,
              "network": "per policy"}
    #: runtime/live.py: sb.files goes through commands in the guest (runtime/guest_files.py)
    files_in_guest = True
    #: runtime/live.py's scratch_events() reads a host directory: there is none here (the
    #: agent reports a full /scratch with each command's end)
    scratch = ""
    gid = 1000

    def __init__(self, plan, check, **kw) -> None:
        super().__init__(plan, check, **kw)
        try:
            self.sandbox_cg = self.cg
            self.target = _Target(self.proc.pid)
            (envop,) = plan.find(Environment)
            self.env = dict(envop.env)
            self.env.setdefault("HOME", SCRATCH)
            self.cmds: dict[int, GuestCommand] = {}
            self.next_id = 0
            self.lock = threading.Lock()
            self.notices: list[dict] = []
            if self.egress:
                self.start_proxy()
            self._send(frame(b"L"))
            self.stop_r, self.stop_w = os.pipe()
            self.reader = threading.Thread(target=self._read, daemon=True,
                                           name="corral-mvm-live")
            self.reader.start()
        except BaseException:
            self.close()
            raise

    # -- what runtime/live.py asks of a live sandbox
    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def exit_reason(self) -> str | None:
        for e in self.end_events:
            return e.get("message")
        if self.dead and self.dead != "closed":
            return f"the microvm guest ended: {self.dead}"
        return None

    def prepare(self) -> None:
        pass

    def drop_entrant(self) -> None:
        pass

    def release(self, cg) -> list[str]:
        return []

    def exec(self, argv, **kw):
        raise SandboxSetupError("a live microvm sandbox runs commands through "
                                "sb.commands", step="exec")

    def start(self, argv: list[str], env: dict[str, str], *, cwd: str, stdin_fd: int,
              tty_fd: int | None = None, cpu_seconds: float | None = None):
        from .base import ExecLimits

        if not self.alive():
            raise SandboxSetupError(f"the microvm sandbox is gone ({self.dead or 'ended'})",
                                    step="exec")
        lim = ExecLimits.from_plan(self.plan)
        cpu = cpu_seconds if cpu_seconds is not None else lim.cpu
        with self.lock:
            self.next_id += 1
            cmd = GuestCommand(self, self.next_id, cpu)
            self.cmds[cmd.id] = cmd
        fds: list[int] = []
        try:
            out_r, cmd.out_w = os.pipe()
            err_r, cmd.err_w = os.pipe()
            st_r, cmd.status_w = os.pipe()
            fds += [out_r, err_r, st_r]
            spec = {"id": cmd.id, "argv": list(argv), "env": dict(env), "cwd": cwd,
                    "cpu": min(cpu, 1e9), "pids": lim.pids,
                    "rlimits": {k: int(v) for k, v in lim.rlimits.items()}}
            if tty_fd is not None:   # a pty of the guest's, relayed to this host terminal
                import tty

                cmd.tty_w = os.dup(tty_fd)
                tty.setraw(cmd.tty_w)   # the guest's pty has the line discipline
                spec["tty"] = _winsize(cmd.tty_w)
                cmd.size = spec["tty"]
            data = json.dumps(spec).encode()
            if len(data) > (1 << 20) - 16:
                raise UnsupportedRule("a command of more than 1 MiB (argv and env) is not "
                                      "taken on the microvm tier", field="command")
            cmd.standin = os.posix_spawn(SH, [SH, "-c", STAND_IN], {"PATH": "/usr/bin:/bin"},
                                         file_actions=[(os.POSIX_SPAWN_DUP2, st_r, 0)],
                                         setsigdef=_SIGNALS, setsigmask=())
            os.close(st_r)
            fds.remove(st_r)
            self._send(frame(b"c", data))
            if not cmd.started.wait(START_TIMEOUT) and not cmd.ended.is_set():
                self._violation("the agent did not answer a command's start")
            fin = os.dup(stdin_fd if tty_fd is None else tty_fd)
            threading.Thread(target=self._feed, args=(cmd, fin), daemon=True).start()
        except BaseException:
            for fd in fds:
                os.close(fd)
            cmd.finish(None)
            raise
        started = MicrovmStarted(cmd.standin, out_r, err_r, cmd)
        started.ns_pid = cmd.guest_pid or cmd.standin
        started.on_result = lambda result: self._on_result(cmd, result)
        return started

    def _feed(self, cmd: GuestCommand, fd: int) -> None:
        """The command's stdin, as i frames, then d (a terminal's: its input, and its size
        when it changes, as z frames)."""
        try:
            while not cmd.ended.is_set():
                r, _, _ = select.select([fd], [], [], 0.25 if cmd.size else 0.5)
                if cmd.size and _winsize(fd) != cmd.size:
                    cmd.size = _winsize(fd)
                    self._send(frame(b"z", cmd.idb + json.dumps(cmd.size).encode()))
                if not r:
                    continue
                chunk = os.read(fd, MAX_FRAME - 4)
                if not chunk:
                    break
                self._send(frame(b"i", cmd.idb + chunk))
        except OSError:
            pass
        finally:
            os.close(fd)
        if not cmd.ended.is_set():
            self._send(frame(b"d", cmd.idb))

    def _on_result(self, cmd: GuestCommand, result):
        """The guest's own account: CPU time (RLIMIT_CPU: SIGXCPU, or SIGKILL at the hard
        limit) and a full /scratch."""
        from ..events import LimitEvent

        end = cmd.end
        if end is None:
            return result
        events = list(result.events)
        verdict = result.verdict
        if (end["signal"] in (9, 24) and end["cpu"] >= cmd.cpu_limit - 0.05
                and not end["oom"] and verdict in ("killed", "timeout")):
            if not any(e.get("limit") == "cpu_time" for e in events):
                events.append(LimitEvent.cpu_time(cmd.cpu_limit).to_dict())
            verdict = "timeout"
        if end["full"] & 1:
            events.append(LimitEvent.scratch_full().to_dict())
        if end["full"] & 2:
            events.append(LimitEvent.scratch_inodes().to_dict())
        events += [dict(e) for e in self.end_events if e not in events]
        usage = result.usage
        if usage is not None and end.get("cpu") is not None:
            usage = usage.replace(cpu_s=round(float(end["cpu"]), 6))
        return result.replace(verdict=verdict, events=events, usage=usage)

    def _read(self) -> None:
        """The channel's reader: p, o, e, x frames, each for a command started and not
        ended; anything else ends the VM."""
        reader = FrameReader(b"poex")
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.stop_r, select.POLLIN)
        why = "the VM ended"
        try:
            while True:
                fds = [fd for fd, _ in poller.poll()]
                if self.stop_r in fds:
                    why = "closed"
                    break
                try:
                    chunk = self.sock.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                try:
                    for kind, data in reader.feed(chunk):
                        self._frame(kind, data)
                except ValueError as e:
                    why = str(e)
                    self._violation(why)
                    break
        finally:
            with self.lock:
                cmds, self.cmds = list(self.cmds.values()), {}
            for c in cmds:
                c.finish(None)
            if why != "closed" and not self.dead:
                self._kill(why)

    def _frame(self, kind: bytes, data: bytes) -> None:
        if len(data) < 4:
            raise ValueError(f"a {kind!r} frame from the guest without a command id")
        cid = struct.unpack(">I", data[:4])[0]
        cmd = self.cmds.get(cid)
        if cmd is None or cmd.ended.is_set():
            raise ValueError(f"a {kind!r} frame from the guest for no running command")
        body = data[4:]
        if kind == b"p":
            if cmd.started.is_set():
                raise ValueError("a second start frame from the guest")
            try:
                got = json.loads(body.decode("utf-8"))
            except RecursionError:   # deep nesting ([[[[...): not a ValueError
                raise ValueError("a bad start frame from the guest") from None
            if not (isinstance(got, dict) and set(got) == {"pid"} and type(got["pid"]) is int
                    and 1 < got["pid"] < 1 << 22):
                raise ValueError("a bad start frame from the guest")
            cmd.guest_pid = got["pid"]
            cmd.started.set()
        elif kind == b"x":
            end = parse_exit(body)
            with self.lock:
                self.cmds.pop(cid, None)
            cmd.finish(end)
        else:
            fd = cmd.out_w if kind == b"o" else cmd.err_w
            if kind == b"o" and cmd.tty_w >= 0:
                fd = cmd.tty_w
            view = memoryview(body)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                pass   # its reader is gone (the caller stopped reading): dropped

    def close(self) -> list[str]:
        if getattr(self, "stop_w", None) is not None:
            try:
                os.write(self.stop_w, b"x")
            except OSError:
                pass
        problems = super().close()
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.join(5)
            for fd in (self.stop_r, self.stop_w):
                os.close(fd)
            self.reader = None
        target = getattr(self, "target", None)
        if target is not None:
            target.close()
        return problems


__all__ = ["GuestCommand", "MicrovmLive"]
