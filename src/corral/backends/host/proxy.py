"""The egress proxy of one exec, seen from the supervisor: the grants' CA files, starting
the proxy process on a listener, and its events when it stops.

    ca, ca_file, upstream = egress_files(run_dir, granted, upstream_ca)   # grants' files
    proxy = start_proxy(config_json, listener, attach, uid, gid)   # per exec, with allow
    events += proxy.stop()
"""

from __future__ import annotations

import os
import time

from ...events import NoticeEvent, TeardownEvent
from ...linux.supervise import kill_pid
from .cgroups import RELAY_TASKS, with_relay_tasks  # noqa: F401 - re-exported


def egress_files(run_dir, granted: list, upstream_ca: str | None):
    """The files an egress proxy with secret grants needs, in the run dir, readable by the
    sandbox's and the proxy's uids: (ca, ca_file, upstream_ca). `ca` is the run's own CA
    (certificate, key: the key stays here and in the proxy) when secrets are granted, and
    ca_file the bundle the command trusts; upstream_ca is a copy of the caller's file."""
    ca = ca_file = None
    if granted:
        from ...egress.mitm import make_ca
        from ...grants import ca_bundle

        ca = make_ca()
        ca_file = _write_readable(os.path.join(run_dir.path, "ca.pem"), ca_bundle(ca[0]))
    if upstream_ca:
        with open(upstream_ca, "rb") as src:
            data = src.read()
        upstream_ca = _write_readable(os.path.join(run_dir.path, "upstream-ca.pem"), data)
    return ca, ca_file, upstream_ca


def _write_readable(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o644)
    return path


class Proxy:
    """A running egress proxy process of one exec."""

    def __init__(self, pid: int, events_r: int, err_r: int, *, forked: bool = False,
                 notice: str | None = None) -> None:
        from .launch import EventLines

        self.pid, self.events_r, self.err_r = pid, events_r, err_r
        #: started from the zygote (host/zygote.py) rather than afresh
        self.forked = forked
        self.lines = EventLines()
        #: why the zygote was replaced just before this proxy started, or None
        self.notice = notice
        if notice:
            self.lines.events.append(NoticeEvent(notice).to_dict())

    def stop(self) -> list[dict]:
        """SIGTERM, collect the remaining events (it writes those of open connections on
        the way out), reap. Returns its events plus a teardown event if it failed."""
        import select

        # dead already (killed, crashed) before we stop it: connections through it were
        # cut mid-flight, which the Result must say (a signal 9 of ours is no failure)
        try:
            done, early = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            done, early = 0, 0
        if not done:
            try:
                os.kill(self.pid, 15)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3.0
        open_fds = {self.events_r, self.err_r}
        poller = select.poll()   # not select(): a busy supervisor has fds past 1024
        for fd in open_fds:
            poller.register(fd, select.POLLIN)
        err = b""
        while open_fds and time.monotonic() < deadline:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            for fd, _ in poller.poll(wait_ms):
                data = os.read(fd, 65536)
                if not data:
                    open_fds.discard(fd)
                    poller.unregister(fd)
                elif fd == self.events_r:
                    self.lines(data)
                else:
                    err = (err + data)[-4000:]
        if done:
            status = early
        else:
            kill_pid(self.pid)
            _, status = os.waitpid(self.pid, 0)
        os.close(self.events_r)
        os.close(self.err_r)
        # (a live sandbox's proxy: its events are records, those not taken yet are here)
        events = list(self.lines.events) + [ev for op, _, ev in self.lines.records or ()
                                            if op == "event"] + self.lines.dropped_event()
        if done and os.WIFSIGNALED(status):
            events.append(TeardownEvent(
                f"the egress proxy died during the run (signal {os.WTERMSIG(status)}): "
                f"connections through it were cut").to_dict())
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) not in (0, 143) or (
                os.WIFSIGNALED(status) and os.WTERMSIG(status) not in (9, 15)):
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            events.append(TeardownEvent(f"the egress proxy failed: {last[0]}").to_dict())
        return events


def start_proxy(config_json: str, listener, attach: list[int], uid: int, gid: int, *,
                live: bool = False) -> Proxy:
    """The egress proxy of one exec or live sandbox, serving `listener` (closed here once
    handed on): it joins the cgroup whose cgroup.procs fds are `attach`, ends with the
    supervisor and runs as uid:gid once loaded (egress/boot.py). Forked from the zygote
    when it is ready (host/zygote.py: a live sandbox, or this process's second proxy,
    starts it), else started afresh."""
    from ...linux import limits
    from ...linux._sys import set_pdeathsig
    from . import zygote
    from .launch import start_proxy as launch

    try:
        got, notice = zygote.fork_proxy(config_json, listener, attach, uid, gid, live=live)
    except BaseException:
        listener.close()
        raise
    if got is not None:
        listener.close()
        return Proxy(*got, forked=True, notice=notice)

    def setup() -> None:
        if attach:
            limits.RunCgroup.attach_self(attach)
        set_pdeathsig(9)   # SIGKILL; boot.py's uid switch clears it, and it asks again

    try:
        pid, events_r, err_r = launch(config_json, listener, uid, gid, setup)
    finally:
        listener.close()
    return Proxy(pid, events_r, err_r, notice=notice)
