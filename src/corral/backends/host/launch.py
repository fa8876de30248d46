"""The supervisor's side of the egress proxy: a listening socket inside the sandbox's
network namespace, and the proxy process that serves it.

The sandbox keeps an empty network namespace (loopback only). The supervisor enters that
namespace from a short-lived thread (setns is per thread), opens a TCP listener on
127.0.0.1:3128 there, and hands the listener to a proxy process on the host side. The
sandbox sees a proxy on its own loopback and nothing else: there is no route, no resolver
and no host socket inside. (DESIGN.md sketched a unix socket plus a forwarder inside the
sandbox; this needs neither, so there is no in-sandbox process to kill or confuse.)
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time

from ...errors import SandboxSetupError
from ...events import TeardownEvent
from ...plan import PROXY_PORT

CLONE_NEWNET = 0x40000000


def listen_in_netns(pid: int, port: int = PROXY_PORT) -> socket.socket:
    """A listening socket on 127.0.0.1:port in the network namespace of `pid`."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    out: dict = {}

    def work() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, os.strerror(e), "setns")
            finally:
                os.close(fd)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # bwrap reports its child before that child has brought loopback up: until
            # then 127.0.0.1 is not an address of the namespace (EADDRNOTAVAIL)
            deadline = time.monotonic() + 5
            while True:
                try:
                    s.bind(("127.0.0.1", port))
                    break
                except OSError as e:
                    if e.errno != errno.EADDRNOTAVAIL or time.monotonic() > deadline:
                        s.close()
                        raise
                    time.sleep(0.0005)
            s.listen(4096)
            out["sock"] = s
        except OSError as e:
            out["error"] = e

    t = threading.Thread(target=work, name="corral-netns")
    t.start()
    t.join()  # the thread, and with it the namespace switch, ends here
    if "error" in out:
        e = out["error"]
        raise SandboxSetupError(f"cannot listen on 127.0.0.1:{port} inside the sandbox: "
                                f"{e.strerror}", step="egress-listen", errno=e.errno,
                                field="network.mode")
    return out["sock"]


def proxy_argv(config_fd: int, listen_fd: int, uid: int, gid: int) -> list[str]:
    """The proxy process: this interpreter in isolated mode, started as the supervisor's
    user and dropping to uid:gid once loaded (boot.py); events on its stdout. It asks for
    its parent-death signal itself, after the uid switch (which clears one set before)."""
    return [sys.executable, "-I", "-c", "import corral.egress.boot as b; b.main()",
            str(uid), str(gid), "--", "--config-fd", str(config_fd),
            "--listen-fd", str(listen_fd), "--die-with-parent", "--track-conns"]


def config_fd(config_json: str) -> int:
    fd = os.memfd_create("corral-egress-config", 0)
    os.write(fd, config_json.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class EventLines:
    """Collects the proxy's JSON-lines events as they arrive, bounded: the proxy is
    corral's own, but it handles hostile traffic, so what it writes is parsed as if it
    were not. A line longer than MAX_LINE, or one that is not a JSON object of a known
    kind, becomes a teardown event; past MAX_EVENTS (one per proxy decision: a sandbox
    that makes a million requests) events are only counted (`dropped`)."""

    MAX_LINE = 64 << 10
    MAX_EVENTS = 10_000

    def __init__(self) -> None:
        self.buf = b""
        self.events: list[dict] = []
        self.dropped = 0
        #: None, or (a live sandbox's: runtime/live.py sets it) every line in order, as
        #: ("open", N, None), ("event", N or None, event), ("closed", N, None): the
        #: proxy's bookkeeping of its client connections (egress/server.py,
        #: track_conns), which it takes and empties as it reads; its events then go
        #: there only, not to `events`
        self.records: list[tuple[str, int | None, dict | None]] | None = None

    def __call__(self, data: bytes) -> None:
        import json

        from ...events import KINDS

        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        if len(self.buf) > self.MAX_LINE:   # a line that never ends: what came of it goes
            self.buf = b""
            lines.append(b"-")               # counted as one bad line
        for line in lines:
            if not line.strip():
                continue
            try:
                ev = json.loads(line) if len(line) <= self.MAX_LINE else None
            except ValueError:
                ev = None
            if isinstance(ev, dict) and len(ev) == 1 and _conn_no(
                    ev.get("open", ev.get("closed"))) is not None:
                if self.records is not None:     # which client connections are open
                    op, n = next(iter(ev.items()))
                    self.records.append((op, n, None))
                continue
            if self.records is None and len(self.events) >= self.MAX_EVENTS:
                self.dropped += 1
                continue
            if isinstance(ev, dict) and ev.get("kind") in KINDS:
                n = _conn_no(ev.pop("conn", None))
            else:
                ev, n = TeardownEvent("the egress proxy wrote a bad event line").to_dict(), None
            if self.records is None:
                self.events.append(ev)
            else:   # its taker keeps it (and bounds what it keeps: runtime/netlog.py)
                self.records.append(("event", n, ev))

    def dropped_event(self) -> list[dict]:
        """[a teardown event saying how many events were dropped], or []."""
        if not self.dropped:
            return []
        return [TeardownEvent(f"{self.dropped} further events of the egress proxy were "
                              f"dropped (at most {self.MAX_EVENTS} are kept per exec)"
                              ).to_dict()]


def _conn_no(n) -> int | None:
    """n if it is a connection's number (an int, not a bool, 1 .. 2**62), else None."""
    return n if type(n) is int and 0 < n < 1 << 62 else None


#: the supervisor's variables a proxy (and the zygote) sees: the relay's bench knobs
#: (egress/relay.py: CORRAL_EGRESS_RELAY_THREADS, CORRAL_EGRESS_RELAY_SPLICE); nothing else
PROXY_ENV_PASSED = ("CORRAL_EGRESS_RELAY_THREADS", "CORRAL_EGRESS_RELAY_SPLICE")


def proxy_env() -> dict[str, str]:
    """The environment of a proxy process: PATH, and PROXY_ENV_PASSED where set."""
    env = {"PATH": "/usr/bin:/bin"}
    env.update({k: os.environ[k] for k in PROXY_ENV_PASSED if k in os.environ})
    return env


def start_proxy(config_json: str, listener: socket.socket, uid: int, gid: int,
                child_setup) -> tuple[int, int, int]:
    """Start the proxy process serving `listener` (any address: the namespace tier's
    127.0.0.1:3128, the gvisor tier's veth address). `child_setup` runs between fork and
    exec (join the run's cgroup, parent-death signal); boot.py drops to uid:gid.
    Returns (pid, events read fd, stderr read fd). Closes nothing of the caller's."""
    from ...linux.supervise import spawn

    cfd = config_fd(config_json)
    try:
        argv = proxy_argv(cfd, listener.fileno(), uid, gid)
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            return spawn(argv[0], argv, proxy_env(), stdin_fd=devnull,
                         pass_fds=(cfd, listener.fileno()), child_setup=child_setup)
        finally:
            os.close(devnull)
    finally:
        os.close(cfd)
