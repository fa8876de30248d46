"""The process tier's syscall filter: the namespace tier's profile (seccomp.py: its allow
list, anything else ENOSYS, and its refusals) with these socket rules in place of its own,
plus the rules that stand in for a network namespace, loaded in the child with
prctl(PR_SET_SECCOMP).

The process tier shares the host's network namespace, so the filter itself keeps the network
closed (Landlock's TCP rules, ABI 4+, are a second layer for TCP only):

- socket(2) and socketpair(2): only AF_UNIX, and only SOCK_STREAM and SOCK_SEQPACKET. No
  AF_INET/AF_INET6 (no TCP, UDP, ICMP, DNS), no AF_NETLINK (not even the namespace tier's
  NETLINK_ROUTE: the namespace is the host's), AF_PACKET, AF_VSOCK, AF_ALG, ...
  Unix datagram sockets are refused because sendmsg(2) can name a destination path
  (/dev/log, a journald socket) that seccomp cannot see.
- connect, bind, listen, accept, accept4: refused. With only unix sockets left, connect is
  how a sandbox would reach a host daemon's socket (a D-Bus bus, a rootless Docker socket,
  an ssh or gpg agent), which Landlock does not cover; bind would let it squat an abstract
  socket name a host program connects to (the abstract namespace belongs to the network
  namespace, here the host's). socketpair(2) still works, which is what pipelines, asyncio
  and multiprocessing's fork context use. Like Codex's Linux sandbox.
- System V IPC (shm*, msg*, sem*) and POSIX message queues (mq_*): the IPC namespace is the
  host's, so a segment or queue would outlive the run (a channel to the next run, memory
  left behind), and the host's own objects with loose modes would be in reach. (POSIX
  shared memory and semaphores are files in /dev/shm, which Landlock does not open.)

With `network.mode = "allow"` (network="allow") the command must reach the egress proxy on
the host's 127.0.0.1:P, so the socket rules change:

- socket(2): only AF_INET and AF_INET6, only SOCK_STREAM, protocol 0 or IPPROTO_TCP. No
  UDP (so no DNS of its own), no ICMP, raw, packet, netlink, SCTP or MPTCP sockets, and no
  AF_UNIX sockets either: connect(2) is now allowed, and seccomp cannot tell a unix socket
  from an inet one at connect time, so the only unix sockets are socketpair(2)'s (already
  connected: a connect on them fails with EISCONN).
- connect(2): allowed; where it may go is decided by the run's cgroup programs
  (cgroup_bpf.py: 127.0.0.1:P only) and Landlock (TCP port P only).
- bind, listen, accept, accept4: still refused; sendto/sendmsg/sendmmsg with MSG_FASTOPEN
  (a connect hidden in a send, which Landlock does not see) are refused too.

Every refusal here is EPERM. The program is built in the parent (seccomp.build: the allow
list's range tests, then libseccomp's refusals) and cached like the namespace tier's; the
child only calls prctl.
"""

from __future__ import annotations

import ctypes
import os

from . import seccomp

PROFILE_VERSION = "p4"
EPERM = seccomp.EPERM
AF_UNIX = 1
#: socket types (arg 1, low 4 bits; the rest is SOCK_CLOEXEC/SOCK_NONBLOCK) refused for
#: AF_UNIX: SOCK_DGRAM, SOCK_RAW (a unix SOCK_RAW is a datagram socket), SOCK_RDM
DENIED_UNIX_TYPES = (2, 3, 4)
SOCKET_CALLS = ("socket", "socketpair")
# network.mode = "allow": inet TCP sockets only, and no TCP Fast Open
AF_INET, AF_INET6, SOCK_STREAM, IPPROTO_TCP = 2, 10, 1, 6
MSG_FASTOPEN = 0x20000000
FLAGS_ARG = {"sendto": 3, "sendmsg": 2, "sendmmsg": 3}    # the flags argument of each
NO_PEER = ("connect", "bind", "listen", "accept", "accept4")
#: the host's IPC namespace: System V IPC and POSIX message queues
HOST_IPC = ("shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget",
            "semop", "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend",
            "mq_timedreceive", "mq_notify", "mq_getsetattr")
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def _only(name: str, arg: int, allowed: tuple[int, ...], mask: int | None = None
          ) -> list[seccomp.Rule]:
    """Refuse `name` unless argument `arg` (its low bits under `mask`) is one of `allowed`:
    one rule per refused value below max(allowed), and one for anything above it."""
    top = max(allowed)
    if mask is not None:
        return [seccomp.Rule(name, EPERM, (seccomp.Cond(arg, "masked_eq", v, mask),))
                for v in range(mask + 1) if v not in allowed]
    return ([seccomp.Rule(name, EPERM, (seccomp.Cond(arg, "eq", v),))
             for v in range(top) if v not in allowed]
            + [seccomp.Rule(name, EPERM, (seccomp.Cond(arg, "gt", top),))])


def extra_rules(landlock_abi: int, network: str = "none") -> tuple[seccomp.Rule, ...]:
    """The rules added to seccomp.rules() for the process tier (pure). `network` is the
    policy's network.mode."""
    out = []
    if network == "allow":
        out += _only("socket", 0, (AF_INET, AF_INET6))                    # family
        out += _only("socket", 1, (SOCK_STREAM,), mask=0xF)               # type
        out += _only("socket", 2, (0, IPPROTO_TCP))                       # protocol
        out.append(seccomp.Rule("socketpair", EPERM, (seccomp.Cond(0, "ne", AF_UNIX),)))
        out += [seccomp.Rule("socketpair", EPERM, (seccomp.Cond(1, "masked_eq", t, 0xF),))
                for t in DENIED_UNIX_TYPES]
        out += [seccomp.Rule(name, EPERM) for name in NO_PEER if name != "connect"]
        out += [seccomp.Rule(name, EPERM, (seccomp.Cond(arg, "masked_eq", MSG_FASTOPEN,
                                                        MSG_FASTOPEN),))
                for name, arg in FLAGS_ARG.items()]
    else:
        for name in SOCKET_CALLS:
            out.append(seccomp.Rule(name, EPERM, (seccomp.Cond(0, "ne", AF_UNIX),)))
            out += [seccomp.Rule(name, EPERM, (seccomp.Cond(1, "masked_eq", t, 0xF),))
                    for t in DENIED_UNIX_TYPES]
        out += [seccomp.Rule(name, EPERM) for name in NO_PEER]
    out += [seccomp.Rule(name, EPERM) for name in HOST_IPC]
    if landlock_abi < 3:
        out.append(seccomp.Rule("truncate", EPERM))
    return tuple(out)


def rules(landlock_abi: int, network: str = "none") -> tuple[seccomp.Rule, ...]:
    """The namespace tier's refusals, with this module's socket rules in place of its
    (stricter: no inet sockets without network, no unix ones with it), plus the rest of
    extra_rules()."""
    base = tuple(r for r in seccomp.rules() if r.syscall not in SOCKET_CALLS)
    return base + extra_rules(landlock_abi, network)


def compile_bpf(landlock_abi: int, network: str = "none") -> bytes:
    """The whole filter as classic BPF: the namespace tier's allow list, then these
    refusals (seccomp.build). Raises BackendUnavailable without libseccomp,
    SandboxSetupError if a rule is refused."""
    refusals = rules(landlock_abi, network)
    return seccomp.build(refusals, seccomp.passed(refusals))


def bpf_bytes(cache_dir: str | None, landlock_abi: int, network: str = "none") -> bytes:
    """compile_bpf(), cached in cache_dir (keyed like seccomp.bpf_bytes, plus this
    module's rules)."""
    memo = (cache_dir, landlock_abi, network)
    if memo in _built:
        return _built[memo]
    _built[memo] = data = _bpf_bytes(cache_dir, landlock_abi, network)
    return data


#: programs this process built or read (see seccomp._built)
_built: dict[tuple[str | None, int, str], bytes] = {}


def _bpf_bytes(cache_dir: str | None, landlock_abi: int, network: str) -> bytes:
    if cache_dir is None:
        return compile_bpf(landlock_abi, network)
    import zlib

    extra = repr([[r.syscall, r.errno, [[c.arg, c.op, c.value, c.mask] for c in r.when]]
                  for r in rules(landlock_abi, network)]).encode()
    key = f"{seccomp.cache_key()}-{zlib.crc32(extra):08x}{len(extra):x}"
    path = os.path.join(cache_dir, f"seccomp-{PROFILE_VERSION}-{key}.bpf")
    data = seccomp._read_cache(path)
    if data is not None:
        return data
    data = compile_bpf(landlock_abi, network)
    seccomp._write_cache(cache_dir, path, data)
    return data


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Loader:
    """A compiled program held in memory ready for the child: load() is one prctl call,
    safe between fork and exec. Build it in the parent; it must outlive the fork."""

    def __init__(self, bpf: bytes, listen: bool = False) -> None:
        if not bpf or len(bpf) % 8:
            raise ValueError("not a classic BPF program")
        #: load with a listener (load_listening; the program is seccomp_notify.notifying's)
        self.listen = listen
        self._buf = ctypes.create_string_buffer(bpf, len(bpf))
        self._prog = _SockFprog(len(bpf) // 8, ctypes.addressof(self._buf))
        libc = ctypes.CDLL(None, use_errno=True)
        self._prctl = libc.prctl
        self._prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                                ctypes.c_ulong)
        self._prctl.restype = ctypes.c_int
        self._libc = libc
        libc.syscall.restype = ctypes.c_long

    def no_new_privs(self) -> None:
        if self._prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"PR_SET_NO_NEW_PRIVS: {os.strerror(e)}")

    def load_listening(self) -> int:
        """Install the filter on the calling thread with a seccomp listener: its fd.
        Needs no_new_privs first."""
        from .seccomp_notify import install_listening

        return install_listening(self._libc, ctypes.addressof(self._prog))

    def load(self) -> None:
        """Install the filter on the calling thread. Needs no_new_privs first."""
        if self._prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                       ctypes.addressof(self._prog), 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"PR_SET_SECCOMP: {os.strerror(e)}")
