"""The gvisor tier's path to the egress proxy: two network namespaces of corral's own, joined
by a veth pair, with the proxy's listener as the only thing at the far end.

    net = ProxyNet.create("/run/corral/<id>/netns-1")   # before runsc starts
    spec: linux.namespaces network path = net.path; runsc --network=sandbox
    net.listener                                        # handed to the proxy process
    net.close()                                         # after the exec

Layout, per exec:

    sandbox netns (bound at net.path)        proxy netns (held by the listener)
      lo  127.0.0.1/8, ::1                     lo  down
      eth0  10.255.255.254/30  <--- veth --->  proxy0  10.255.255.253/30
                                                 listener 10.255.255.253:3128

runsc (--network=sandbox) starts its Sentry in the sandbox netns, takes eth0 over (an
AF_PACKET socket on it; the address moves from the host kernel into gVisor's netstack) and
copies lo as a loopback of netstack's own. The only route the sandbox gets is the veth's
/30; nothing is at its other end but the listener: the proxy netns has no other interface,
no address, no route and no forwarding. There is no default route and no resolver, and
neither end has IPv6 (disabled on the veth before it exists, so there is no link-local
address either). The Sentry (a host uid of the run's own, in a user namespace, under runsc's
seccomp filter) holds the AF_PACKET socket, so a Sentry taken over could send any frame
down the veth; what receives it is a kernel stack with one address, no route, no
forwarding and one listening socket.

runsc 20221219 refuses a namespace it takes for the host's, which it recognises by
/proc/sys/net/core/rmem_default existing; since Linux 6.x that file exists in every
namespace, so runsc runs in a mount view of its own where /proc/sys/net is hidden
(runsc_mount_view).

Why not runsc --network=host (hostinet) in a netns holding the listener, which would leave
the proxy at 127.0.0.1:3128 as on the namespace tier: with hostinet this runsc (20221219)
starts the Sentry in the spec's user namespace as host uid 0, which is unmapped there, so
the Sentry loses every capability at its exec and cannot build its chroot ("error converting
mounts: operation not permitted"; later releases set the uid to the namespace's root).
Making it work would mean mapping the container's root to host root or dropping the user
namespace, i.e. a Sentry and gofer running as host root. The veth path keeps runsc's
default Sentry set-up (an unprivileged uid in a user namespace of its own) unchanged.

Everything here is plain rtnetlink and /proc/sys from a short-lived thread (unshare and
setns act on the calling thread only): no `ip` binary, no process of our own in either
namespace. The sandbox netns lives as long as its bind mount (or the Sentry), the proxy
netns as long as the listener: the supervisor unmounts the one and the proxy's exit closes
the other; a dead supervisor's bind mount is unmounted by the next start's sweep
(rundir.sweep_stale), since it sits below the run directory.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading

from ..errors import SandboxSetupError
from ..linux._sys import mount, umount
from ..plan import PROXY_PORT

CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
#: the proxy's address as the sandbox sees it, and the sandbox's own (a /30 of their own in
#: namespaces of their own, so every sandbox uses the same pair)
PROXY_ADDR = "10.255.255.253"
SANDBOX_ADDR = "10.255.255.254"
PREFIX = 30
PROXY_URL = f"http://{PROXY_ADDR}:{PROXY_PORT}"
SANDBOX_IF, PROXY_IF = "eth0", "proxy0"

# rtnetlink (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/veth.h)
NLMSG_ERROR = 2
RTM_NEWLINK, RTM_NEWADDR = 16, 20
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
NLA_F_NESTED = 0x8000
IFF_UP = 0x1
LOOPBACK_INDEX = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), what)


def _attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


class _Netlink:
    """A NETLINK_ROUTE socket of the calling thread's network namespace."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, body: bytes, what: str) -> None:
        self.seq += 1
        head = struct.pack("=IHHII", 16 + len(body), kind,
                           NLM_F_REQUEST | NLM_F_ACK | flags, self.seq, 0)
        self.sock.send(head + body)
        while True:
            data = self.sock.recv(65536)
            off = 0
            while off + 16 <= len(data):
                length, mtype, _, seq, _ = struct.unpack_from("=IHHII", data, off)
                if mtype == NLMSG_ERROR and seq == self.seq:
                    (err,) = struct.unpack_from("=i", data, off + 16)
                    if err:
                        raise OSError(-err, os.strerror(-err), what)
                    return
                off += max(length + (-length % 4), 16)

    def veth(self, name: str, peer: str, peer_netns_fd: int) -> None:
        """A veth pair: `name` here, `peer` in the netns of `peer_netns_fd` (-1: here)."""
        peer_info = _ifinfo() + _attr(IFLA_IFNAME, peer.encode() + b"\0")
        if peer_netns_fd >= 0:
            peer_info += _attr(IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd))
        info = _attr(IFLA_INFO_KIND, b"veth") + _attr(
            IFLA_INFO_DATA | NLA_F_NESTED, _attr(VETH_INFO_PEER | NLA_F_NESTED, peer_info))
        body = _ifinfo() + _attr(IFLA_IFNAME, name.encode() + b"\0") \
            + _attr(IFLA_LINKINFO | NLA_F_NESTED, info)
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, f"create veth {name}")

    def address(self, index: int, addr: str, prefix: int) -> None:
        raw = socket.inet_aton(addr)
        body = struct.pack("=BBBBI", socket.AF_INET, prefix, 0, 0, index) \
            + _attr(IFA_LOCAL, raw) + _attr(IFA_ADDRESS, raw)
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, f"address {addr}")

    def up(self, index: int) -> None:
        self.request(RTM_NEWLINK, 0, _ifinfo(index, IFF_UP, IFF_UP), f"link {index} up")


def _no_ipv6_on_new_links() -> None:
    """New interfaces of this thread's netns come up without IPv6 (not even link-local);
    the loopback, which exists already, keeps ::1. Absent when the host has no IPv6."""
    try:
        with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as f:
            f.write("1")
    except FileNotFoundError:
        pass


class ProxyNet:
    """The two namespaces of one exec and the proxy's listener (see the module doc)."""

    def __init__(self, path: str, listener: socket.socket) -> None:
        self.path = path
        self.listener: socket.socket | None = listener

    @classmethod
    def create(cls, path: str, owner: int | None = None) -> ProxyNet:
        """Build both namespaces, bind the sandbox's at `path` (a new file), and listen on
        PROXY_ADDR:PROXY_PORT in the proxy's. With `owner` (a user namespace fd: the one
        runsc runs in), the sandbox's netns belongs to that user namespace, or runsc could
        not join it. Needs root. Raises SandboxSetupError."""
        out: dict = {}
        sandbox_ns = -1
        try:
            if owner is not None:
                sandbox_ns = _netns_owned_by(owner)
            t = threading.Thread(target=_build, args=(path, out, sandbox_ns),
                                 name="corral-gvisor-net")
            t.start()
            t.join()  # the thread, and with it every namespace switch, ends here
        except OSError as e:
            out["error"] = (e, "netns in the sandbox's user namespace")
        finally:
            if sandbox_ns >= 0:
                os.close(sandbox_ns)
        if "error" in out:
            e, what = out["error"]
            raise SandboxSetupError(f"building the sandbox's network namespaces ({what}): "
                                    f"{e.strerror or e}", step="egress-netns", errno=e.errno,
                                    field="network.mode")
        return cls(path, out["sock"])

    def take_listener(self) -> socket.socket:
        s, self.listener = self.listener, None
        assert s is not None
        return s

    def close(self) -> list[str]:
        """Unmount and remove the sandbox netns's binding; close the listener if it was not
        handed on. Returns problems."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        return release(self.path)


def release(path: str) -> list[str]:
    err = umount(path)
    problems = []
    if err not in (0, 22, 2):  # EINVAL: not mounted, ENOENT: gone
        problems.append(f"umount {path}: {os.strerror(err)}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        problems.append(f"remove {path}: {e.strerror}")
    return problems


def _netns_owned_by(userns_fd: int) -> int:
    """A new network namespace owned by the user namespace `userns_fd` (an fd of it): a
    forked child joins that user namespace (a thread cannot: setns(CLONE_NEWUSER) needs a
    single-threaded process), unshares a network namespace and waits while we open it."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only syscalls, then _exit
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            if _libc.setns(userns_fd, 0x10000000) == 0 and _libc.unshare(CLONE_NEWNET) == 0:
                os.write(ready_w, b"1")
                os.read(hold_r, 1)    # until the parent has the namespace open
                code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(1, "the helper could not make the network namespace")
        return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(hold_w)   # the child's read returns: it exits
        os.waitpid(pid, 0)


def _build(path: str, out: dict, sandbox_ns: int = -1) -> None:
    """Runs in a throwaway thread: its namespace changes end with it. Cleans up after
    itself on failure. `sandbox_ns`: the sandbox's netns, made already (else made here)."""
    step = "unshare"
    proxy_ns = -1
    nl = None
    created = False
    listener = None
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare")       # the proxy's netns
        _no_ipv6_on_new_links()
        proxy_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if sandbox_ns >= 0:                                    # the sandbox's netns
            _check(_libc.setns(sandbox_ns, CLONE_NEWNET), "setns")
        else:
            _check(_libc.unshare(CLONE_NEWNET), "unshare")
        _no_ipv6_on_new_links()
        step = "sandbox links"
        nl = _Netlink()
        nl.up(LOOPBACK_INDEX)
        nl.veth(SANDBOX_IF, PROXY_IF, proxy_ns)
        index = socket.if_nametoindex(SANDBOX_IF)
        nl.address(index, SANDBOX_ADDR, PREFIX)
        nl.up(index)
        nl.close()
        nl = None
        step = "bind mount"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        created = True
        mount("/proc/thread-self/ns/net", path, "", MS_BIND, "")
        step = "proxy links"
        _check(_libc.setns(proxy_ns, CLONE_NEWNET), "setns")
        nl = _Netlink()
        index = socket.if_nametoindex(PROXY_IF)
        nl.address(index, PROXY_ADDR, PREFIX)
        nl.up(index)
        step = "listen"
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((PROXY_ADDR, PROXY_PORT))
        listener.listen(4096)
        out["sock"] = listener
    except OSError as e:
        if listener is not None:
            listener.close()
        if created:
            release(path)
        out["error"] = (e, step)
    finally:
        if nl is not None:
            nl.close()
        if proxy_ns >= 0:
            os.close(proxy_ns)


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REC, MS_SLAVE = 0x4000, 1 << 19
CLONE_NEWNS = 0x00020000


def runsc_mount_view(proc_dir: str) -> None:
    """For the runsc process only (between fork and exec): hide /proc/sys/net, so that
    runsc 20221219 accepts a network namespace that is not the host's.

    That runsc decides "this is the host's namespace, refuse" by whether
    /proc/sys/net/core/rmem_default exists, which since Linux 6.x it does in every
    namespace. So runsc gets a mount namespace of its own (slave: nothing mounted here
    reaches the host) where /proc/sys/net is an empty read-only tmpfs. Its gofer and
    Sentry, started from that view in user namespaces, each mount a fresh proc, which the
    kernel allows only while some proc mount of theirs is fully visible (no overmounts):
    hence the second, untouched proc at `proc_dir`. Neither is ever in the sandbox's view
    (the gofer and Sentry pivot away; the sandbox's /proc is gVisor's own)."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    mount("none", "/", "", MS_REC | MS_SLAVE, "")
    mount("proc", proc_dir, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "")
    mount("tmpfs", "/proc/sys/net", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
          "size=4k,mode=0555")


_veth_ok: list[bool | str] = []


def veth_available() -> bool | str:
    """Whether this kernel makes veth pairs: tried once per process, in a throwaway
    network namespace that ends with the thread (a built-in driver leaves no trace in
    /sys/module to look at instead)."""
    if not _veth_ok:
        out: dict = {}

        def probe() -> None:
            try:
                _check(_libc.unshare(CLONE_NEWNET), "unshare")
                nl = _Netlink()
                try:
                    nl.veth("probe0", "probe1", -1)
                finally:
                    nl.close()
                out["ok"] = True
            except OSError as e:
                out["error"] = e

        t = threading.Thread(target=probe, name="corral-veth-probe")
        t.start()
        t.join()
        e = out.get("error")
        _veth_ok.append(True if e is None else
                        f"cannot make a veth pair here ({e.strerror or e}), which the gvisor "
                        "tier's path to the egress proxy needs; use isolation = \"namespace\"")
    return _veth_ok[0]
