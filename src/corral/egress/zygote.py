"""The egress proxy's zygote: one process that has imported the proxy once and forks a
proxy per sandbox, so that the proxies share the interpreter's pages copy-on-write
instead of each loading its own (about 18 MB PSS a fresh proxy; a forked one costs only
the pages it writes).

    python -I -c 'import corral.egress.zygote as z; z.main()' CTRL_FD

Started by the supervisor (backends/host/zygote.py) as its child, as the supervisor's own
user (root when corral runs as root), never inside a sandbox. It reads nothing a sandbox
sends: its one input is CTRL_FD, one end of a SOCK_SEQPACKET socketpair whose other end
only the supervisor holds (the peer's uid is checked too: root or our own). On it:

    zygote -> supervisor   {"ready": true, "spare": S}    once everything is imported
    supervisor -> zygote   {"uid": U, "gid": G}  + SCM_RIGHTS [config memfd, listener,
                           stdin, events write end, stderr write end, cgroup.procs fds...]
    zygote -> supervisor   {"pid": P, "spare": S, "reap": [...]} | {"error": "...", ...}

Each proxy is a child forked with clone(CLONE_PARENT) ahead of its request (a spare,
_Spare): its parent is the supervisor, as for a proxy it starts itself, so it waits for, signals and reaps the child
exactly as before, and the zygote's own death (killed, crashed) touches no child. The
child joins the sandbox's cgroup, lifts its descriptor limit, drops to uid:gid (boot.py's
steps, in the same order) and runs the proxy's main() with the config from its memfd:
exactly what a fresh proxy gets. It ends when its events pipe's reader goes (the
supervisor is gone) or on SIGTERM. The zygote ends when the supervisor closes its end
(EOF), which happens at the latest when the supervisor exits.
"""

from __future__ import annotations

import array
import ctypes
import gc
import json
import os
import signal
import socket
import ssl
import struct
import sys

CLONE_PARENT = 0x00008000
#: clone(2)'s number, by machine (the raw syscall: glibc's fork() has no flags)
SYS_CLONE = {"x86_64": 56, "aarch64": 220}
#: fds a request carries before the cgroup.procs ones
FIXED_FDS = 5
#: at most this many cgroup.procs fds (v1 has one per controller hierarchy)
MAX_ATTACH = 16
MAX_REQUEST = 4096


def _clone_parent() -> int:
    """fork(2) whose child is our parent's child. As os.fork: CPython's before/after-fork
    steps around it (locks, at-fork hooks: `random` reseeds). The GIL is held across the
    syscall (PyDLL), as os.fork holds it; this process has one thread."""
    nr = SYS_CLONE.get(os.uname().machine)
    if nr is None:
        raise OSError(38, f"clone(CLONE_PARENT) is not wired for {os.uname().machine}")
    libc = ctypes.PyDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    pid = libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(CLONE_PARENT | signal.SIGCHLD),
                       ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0))
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, os.strerror(err), "clone")
    return pid


def parse_request(msg: bytes, nfds: int) -> tuple[int, int]:
    """(uid, gid) of a request, strictly: a JSON object with exactly those two keys, each
    a non-negative int, and FIXED_FDS to FIXED_FDS + MAX_ATTACH fds."""
    if len(msg) > MAX_REQUEST:
        raise ValueError("request too long")
    req = json.loads(msg)
    if not isinstance(req, dict) or set(req) != {"uid", "gid"}:
        raise ValueError("request: want exactly uid and gid")
    ids = []
    for k in ("uid", "gid"):
        v = req[k]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 32:
            raise ValueError(f"request: bad {k}")
        ids.append(v)
    if not FIXED_FDS <= nfds <= FIXED_FDS + MAX_ATTACH:
        raise ValueError(f"request: {nfds} fds")
    return ids[0], ids[1]


def _recv(ctrl: socket.socket) -> tuple[bytes, list[int], bool]:
    """One message and its fds; truncated: True when it or its fds did not fit (the fds
    that came are returned, to be closed)."""
    fdsize = array.array("i").itemsize
    msg, anc, flags, _ = ctrl.recvmsg(MAX_REQUEST + 1,
                                      socket.CMSG_SPACE((FIXED_FDS + MAX_ATTACH) * fdsize))
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fdsize])
    truncated = bool(flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC)) or len(msg) > MAX_REQUEST
    return msg, list(fds), truncated


def _child(ctrl: socket.socket | None, uid: int, gid: int, fds: list[int]) -> None:
    """In the forked child: become the sandbox's proxy. Never returns."""
    code = 70
    try:
        if ctrl is not None:
            ctrl.close()
        cfg, listen, stdin, events, err, *attach = fds
        for fd, to in ((stdin, 0), (events, 1), (err, 2)):
            os.dup2(fd, to)
        for fd in (stdin, events, err):
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in attach:                       # limits.RunCgroup.attach_self
            os.write(fd, b"0")
            os.close(fd)
        from . import boot

        args = ["--config-fd", str(cfg), "--listen-fd", str(listen), "--events-fd", "1",
                "--track-conns"]
        if os.getuid() == 0:
            boot.lift_nofile(args)
        if os.getuid() == 0 and uid != 0:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        from .__main__ import main as proxy_main

        code = proxy_main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - the child must never return to the loop
        try:
            os.write(2, f"corral-egress: zygote child: {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


#: allowed requests warm() runs through the proxy (plain HTTP and CONNECT each): CPython
#: 3.11 quickens and specializes a function's bytecode after a few calls, in place, so
#: the template runs them WARM_ROUNDS times; a spare runs them SPARE_ROUNDS times, which
#: is enough to copy the pages a request writes (about 180 page faults, 0.7 ms of a first
#: request's CPU time measured, off its path)
WARM_ROUNDS = 12
SPARE_ROUNDS = 2
#: the warm-up's made-up upstream: a name no resolver knows, given an address of
#: TEST-NET-1 (RFC 5737) through a hosts table of its own; nothing ever connects to it
WARM_HOST, WARM_IP = "warm.invalid", "192.0.2.1"


def warm(request: bool = True, pending=lambda: False, rounds: int = WARM_ROUNDS) -> int:
    """Run a proxy's start and (`request`) its request paths here (in the zygote, and again
    in each spare while it waits, under SCHED_IDLE), so that what they build
    lazily (the argument parser, caches, compiled patterns, the event loop's machinery, and
    CPython's quickened bytecode for every function an allowed request runs) sits in the
    pages every child shares instead of being built again in each: a refused request, then
    WARM_ROUNDS allowed plain-HTTP requests and CONNECT tunnels. Nothing of this touches a
    network: the client side is a socketpair, and the upstream too (the proxy's `_connect`
    is replaced, on this instance only, by one that hands back a socketpair whose other
    end a coroutine here answers). Returns how many allowed requests came back as they
    should (a 200 with its body, a tunnel's bytes echoed): 2 * rounds unless cut short."""
    import asyncio
    from ipaddress import ip_address

    from . import hostsfile
    from .__main__ import _EventWriter, parser
    from .config import NetConfig
    from .conn import CONNECT_OK
    from .relay import _Client
    from .server import EgressProxy

    parser().parse_args(["--config-fd", "3", "--listen-fd", "4", "--events-fd", "1"])
    if pending():
        return 0
    cfg = NetConfig.from_json(NetConfig(nameservers=(("127.0.0.1", 53),)).to_json())
    proxy = EgressProxy(cfg, lambda event: None, hosts=hostsfile.load(hostsfile.PATH)[0])

    async def one(proxy, head: bytes, body: bytes = b"") -> bytes:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        for s in (a, b):
            s.setblocking(False)
        task = asyncio.create_task(proxy._run_client(a, _Client()))
        try:
            await loop.sock_sendall(b, head)
            out = await asyncio.wait_for(loop.sock_recv(b, 65536), 5)
            if body:
                await loop.sock_sendall(b, body)
                b.shutdown(socket.SHUT_WR)
                while True:             # the upstream's echo, to its EOF
                    more = await asyncio.wait_for(loop.sock_recv(b, 65536), 5)
                    if not more:
                        break
                    out += more
        finally:
            b.close()
            await asyncio.wait_for(task, 5)
        return out

    async def upstream(s: socket.socket) -> None:
        """The made-up upstream: a plain-HTTP request gets a 100-byte answer; a tunnel's
        bytes are echoed back until its EOF."""
        loop = asyncio.get_running_loop()
        try:
            data = await loop.sock_recv(s, 65536)
            if data.startswith(b"GET "):
                while b"\r\n\r\n" not in data:
                    more = await loop.sock_recv(s, 65536)
                    if not more:
                        return
                    data += more
                await loop.sock_sendall(s, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                           b"Content-Length: 100\r\n\r\n" + b"x" * 100)
                return
            while data:
                await loop.sock_sendall(s, data)
                data = await loop.sock_recv(s, 65536)
        finally:
            s.close()

    async def allowed() -> int:
        answered = 0
        acfg = NetConfig.from_json(json.dumps({
            "allow": [f"{WARM_HOST}:80"], "allow_private": [f"{WARM_IP}/32"],
            "nameservers": ["127.0.0.1:53"]}))
        events = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        tasks: list[asyncio.Task] = []
        try:
            aproxy = EgressProxy(acfg, _EventWriter(events),
                                 hosts={WARM_HOST: [ip_address(WARM_IP)]})

            async def connect(addrs, port) -> socket.socket:
                ours, theirs = socket.socketpair()
                for s in (ours, theirs):
                    s.setblocking(False)
                tasks.append(asyncio.create_task(upstream(theirs)))
                return ours

            aproxy._connect = connect
            get = (f"GET http://{WARM_HOST}/x HTTP/1.1\r\nHost: {WARM_HOST}\r\n"
                   f"Connection: close\r\n\r\n").encode()
            tunnel = (f"CONNECT {WARM_HOST}:80 HTTP/1.1\r\nHost: {WARM_HOST}:80\r\n"
                      f"\r\n").encode()
            for _ in range(rounds):
                if pending():
                    break
                got = await one(aproxy, get)
                answered += got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"x" * 100)
                got = await one(aproxy, tunnel, b"ping " * 20)
                answered += got == CONNECT_OK + b"ping " * 20
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
            os.close(events)
        return answered

    async def requests() -> int:
        await one(proxy, b"GET http://warm.invalid/ HTTP/1.1\r\nHost: warm.invalid\r\n\r\n")
        return await allowed()

    if pending():
        return 0
    if not request:
        asyncio.new_event_loop().close()
        return 0
    try:
        return asyncio.run(requests())
    except (OSError, TimeoutError):
        return 0                               # a warm-up only


def _peer_ok(ctrl: socket.socket) -> bool:
    creds = ctrl.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid in (0, os.getuid())


class _Spare:
    """The next proxy, forked ahead (clone(CLONE_PARENT): the supervisor's child from
    birth) and waiting on a socketpair for its request: whatever a proxy does before it
    knows its sandbox (and the page copies that costs) is off the first request's path.
    It runs warm() itself while it waits (under SCHED_IDLE when root), as the zygote's
    user, before it has any fd of a sandbox's. Ends at EOF (the zygote is gone) without
    having served anyone."""

    def __init__(self, ctrl: socket.socket) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = _clone_parent()
        if pid == 0:
            ours.close()
            _spare_child(ctrl, theirs)
        theirs.close()
        self.pid, self.sock = pid, ours

    def hand(self, msg: bytes, fds: list[int]) -> bool:
        """Give it a request; False if it is gone (then the zygote forks one at once). It
        warms up under SCHED_IDLE (only on CPU time nothing else wants, so a new spare
        never slows the proxy just handed a request): back to SCHED_OTHER first."""
        try:
            os.sched_setscheduler(self.pid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass
        try:
            self.sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                       array.array("i", fds))])
        except OSError:
            return False
        finally:
            self.sock.close()
        return True


def _spare_child(ctrl: socket.socket, sock: socket.socket) -> None:
    """In a spare: warm up, wait for the request, become the proxy. Never returns."""
    code = 0
    try:
        ctrl.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if os.geteuid() == 0:      # only root may go back to SCHED_OTHER (CAP_SYS_NICE)
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except OSError:
                pass
        import select

        poller = select.poll()
        poller.register(sock, select.POLLIN)
        # the pages a proxy's start and its requests write, copied now (off the first
        # request's path); not when a request already waits
        warm(pending=lambda: bool(poller.poll(0)), rounds=SPARE_ROUNDS)
        while True:
            try:
                msg, fds, truncated = _recv(sock)
                break
            except InterruptedError:
                continue
        if truncated or not msg:
            os._exit(0)
        sock.close()
        if os.sched_getscheduler(0) == os.SCHED_IDLE:   # the zygote could not restore it
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        uid, gid = parse_request(msg, len(fds))
    except BaseException:  # noqa: BLE001 - a spare never returns to the zygote's loop
        os._exit(code)
    _child(None, uid, gid, fds)


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _new_spare(ctrl: socket.socket) -> _Spare | None:
    try:
        return _Spare(ctrl)
    except OSError:
        return None                 # out of processes, say: the next request forks then


def serve(ctrl: socket.socket) -> int:
    """The request loop: until EOF on ctrl. Every message carries the waiting spare's pid
    ("spare", or null), so that the supervisor can reap it should the zygote go; "reap"
    lists spares that died unused (the supervisor's children, to be reaped)."""
    spare = _new_spare(ctrl)
    ctrl.send(json.dumps({"ready": True, "spare": spare and spare.pid}).encode())
    while True:
        try:
            msg, fds, truncated = _recv(ctrl)
        except InterruptedError:
            continue
        except OSError:
            return 0
        if not msg and not fds:
            return 0                                # the supervisor closed its end
        reply: dict = {"reap": []}
        try:
            if truncated:
                raise ValueError("request or its fds truncated")
            uid, gid = parse_request(msg, len(fds))
            if spare is not None and spare.hand(msg, fds):
                reply["pid"] = spare.pid
            else:                                   # none, or it died unused: fork now
                if spare is not None:
                    reply["reap"].append(spare.pid)
                pid = _clone_parent()
                if pid == 0:
                    _child(ctrl, uid, gid, fds)
                reply["pid"] = pid
            spare = None
        except (ValueError, OSError) as e:
            reply["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            _close(fds)          # before the next fork: no spare holds another's fds
        if spare is None:
            spare = _new_spare(ctrl)
        reply["spare"] = spare and spare.pid
        try:
            ctrl.send(json.dumps(reply).encode())
        except OSError:
            return 0


def main() -> None:
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    if not _peer_ok(ctrl):
        sys.exit(2)
    # a terminal's ^C goes to the supervisor's process group; the supervisor decides
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from . import boot

    boot.preload(grants=True)      # cryptography too: shared by every child, paid once
    from .mitm import upstream_context

    try:
        upstream_context(None)     # the system trust store, parsed once for every child
    except (OSError, ssl.SSLError):
        pass                       # each proxy with a grant then reads it itself
    from . import forms

    forms.warm()                   # the spellings' regexes a grant's scrubber is made of
    warm()
    gc.collect()
    gc.freeze()   # a child's collections then leave these objects (and their pages) alone
    sys.exit(serve(ctrl))
