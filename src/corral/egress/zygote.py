"""The egress proxy's zygote: one process that has imported the proxy once and forks a
proxy per sandbox, so that the proxies share the interpreter's pages copy-on-write
instead of each loading its own (about 18 MB PSS a fresh proxy; a forked one costs only
the pages it writes).

    python -I -c 'import corral.egress.zygote as z; z.main()' CTRL_FD

Started by the supervisor (backends/host/zygote.py) as its child, as the supervisor's own
user (root when corral runs as root), never inside a sandbox. It reads nothing a sandbox
sends: its one input is CTRL_FD, one end of a SOCK_SEQPACKET socketpair whose other end
only the supervisor holds (the peer's uid is checked too: root or our own). On it:

    zygote -> supervisor   b"ready"                       once everything is imported
    supervisor -> zygote   {"uid": U, "gid": G}  + SCM_RIGHTS [config memfd, listener,
                           stdin, events write end, stderr write end, cgroup.procs fds...]
    zygote -> supervisor   {"pid": P} | {"error": "..."}

Each request forks a child with clone(CLONE_PARENT): the child's parent is the
supervisor, as for a proxy it starts itself, so it waits for, signals and reaps the child
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


def _child(ctrl: socket.socket, uid: int, gid: int, fds: list[int]) -> None:
    """In the forked child: become the sandbox's proxy. Never returns."""
    code = 70
    try:
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

        args = ["--config-fd", str(cfg), "--listen-fd", str(listen), "--events-fd", "1"]
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


def _peer_ok(ctrl: socket.socket) -> bool:
    creds = ctrl.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid in (0, os.getuid())


def serve(ctrl: socket.socket) -> int:
    """The request loop: until EOF on ctrl."""
    while True:
        try:
            msg, fds, truncated = _recv(ctrl)
        except InterruptedError:
            continue
        except OSError:
            return 0
        if not msg and not fds:
            return 0                                # the supervisor closed its end
        try:
            if truncated:
                raise ValueError("request or its fds truncated")
            uid, gid = parse_request(msg, len(fds))
            pid = _clone_parent()
            if pid == 0:
                _child(ctrl, uid, gid, fds)
            reply = {"pid": pid}
        except (ValueError, OSError) as e:
            reply = {"error": f"{type(e).__name__}: {e}"[:500]}
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
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
    import corral.egress.__main__  # noqa: F401 - the child's main(), loaded here

    gc.collect()
    gc.freeze()   # a child's collections then leave these objects (and their pages) alone
    ctrl.send(b"ready")
    sys.exit(serve(ctrl))
