"""Address rules for a cgroup: tiny eBPF programs, assembled by hand, loaded with bpf(2).

The process tier shares the host's network namespace, so "this command may reach the egress
proxy at 127.0.0.1:P and nothing else" is a rule about addresses, which Landlock (ports only)
cannot express. Cgroup socket hooks can: a program attached to a cgroup v2 directory runs in
the kernel on every socket(2), connect(2), bind(2) and UDP sendmsg(2) of every process in
that cgroup (and below it), and returns 1 (allow) or 0 (refuse with EPERM).

    progs = cgroup_bpf.Programs(port)       # loads the programs (root: CAP_BPF + CAP_NET_ADMIN)
    progs.attach("/sys/fs/cgroup/unified/corral/abc-1")
    progs.close()                           # the attachments keep the programs alive
    ...                                     # removing the cgroup directory frees them

What gets attached (all with BPF_F_ALLOW_MULTI, so programs an ancestor cgroup has still
run too; every one must allow):

    sock_create   (BPF_PROG_TYPE_CGROUP_SOCK): an inet socket only if TCP (SOCK_STREAM,
                  IPPROTO_TCP): no UDP, ICMP, SCTP or MPTCP sockets
    inet4_connect (CGROUP_SOCK_ADDR): only to 127.0.0.1:port, TCP
    inet6_connect (CGROUP_SOCK_ADDR): only to ::ffff:127.0.0.1:port, TCP (the same listener,
                  reached through a dual-stack IPv6 socket, as Java does by default)
    inet4_bind, inet6_bind, udp4_sendmsg, udp6_sendmsg: refused, always

The connect hooks also run for TCP Fast Open (sendto(MSG_FASTOPEN) connects too). Each
program is a handful of instructions, written out below one per line with its meaning.

Limits: the hooks see the address a process asks for, inside this cgroup only; processes
outside it (the proxy) are not affected. On a hybrid host where a v1 net_cls or net_prio
controller was ever activated, the kernel stops matching sockets to cgroup v2 for good
("cgroup2 socket matching disabled"): the programs then never run. `enforced()` tells, from
inside the cgroup, whether they do; the process tier checks it in every command before
exec and refuses to run otherwise.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

SYS_BPF = 321                      # x86_64
# bpf(2) commands (enum bpf_cmd)
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_GET_NEXT_ID = 11
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
# program types (enum bpf_prog_type)
PROG_CGROUP_SOCK = 9
PROG_CGROUP_SOCK_ADDR = 18
# attach types (enum bpf_attach_type)
INET_SOCK_CREATE = 2
INET4_BIND = 8
INET6_BIND = 9
INET4_CONNECT = 10
INET6_CONNECT = 11
UDP4_SENDMSG = 14
UDP6_SENDMSG = 15
BPF_F_ALLOW_MULTI = 1 << 1
#: every program's name starts with this (prog_name holds at most 15 characters)
NAME_PREFIX = "corral_"

# instruction encoding (struct bpf_insn: u8 code, u8 dst:4 src:4, s16 off, s32 imm)
_MOV64_IMM = 0x07 | 0xb0           # BPF_ALU64 | BPF_MOV | BPF_K:   dst = imm
_LDX_W = 0x61                      # BPF_LDX | BPF_MEM | BPF_W:     dst = *(u32 *)(src + off)
_JNE32_IMM = 0x06 | 0x50           # BPF_JMP32 | BPF_JNE | BPF_K:   if (u32)dst != imm goto +off
_EXIT = 0x95                       # BPF_JMP | BPF_EXIT:            return r0
R0, R1, R2 = 0, 1, 2               # r0: return value, r1: the context pointer, r2: scratch

# offsets in the contexts the programs read
SOCK_TYPE, SOCK_PROTOCOL = 8, 12            # struct bpf_sock
ADDR_IP4, ADDR_IP6, ADDR_PORT = 4, 8, 24    # struct bpf_sock_addr: user_ip4, user_ip6[4], user_port
ADDR_TYPE = 32                              # struct bpf_sock_addr: type
SOCK_STREAM, IPPROTO_TCP = 1, 6


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, dst | src << 4, off, imm)


def _u32(b: bytes) -> int:
    """Four bytes in network order as the u32 the program loads (little-endian host), as
    the s32 an instruction's imm holds (the JMP32 compare looks at 32 bits only)."""
    return struct.unpack("<i", b)[0]


class _Asm:
    """Straight-line programs of the form: r0 = 0; each check jumps to the final `exit`
    when it fails; if every check passes, r0 = 1."""

    def __init__(self) -> None:
        self.code: list[tuple] = []

    def op(self, *insn) -> None:
        self.code.append(insn)

    def require(self, ctx_off: int, value: int) -> None:
        self.op(_LDX_W, R2, R1, ctx_off, 0)        # r2 = the context field at ctx_off
        self.op(_JNE32_IMM, R2, 0, "out", value)    # if it is not `value`: out (r0 is 0)

    def build(self, allow_at_end: bool = True) -> bytes:
        body = [(_MOV64_IMM, R0, 0, 0, 0)] + self.code      # r0 = 0: refuse unless proven ok
        if allow_at_end:
            body.append((_MOV64_IMM, R0, 0, 0, 1))          # every check passed: r0 = 1
        body.append((_EXIT, 0, 0, 0, 0))                    # out: return r0
        last = len(body) - 1
        return b"".join(_insn(c, d, s, last - (i + 1) if off == "out" else off, imm)
                        for i, (c, d, s, off, imm) in enumerate(body))


def prog_sock_create() -> bytes:
    """socket(2) in the cgroup: inet sockets only as TCP (runs for AF_INET/AF_INET6 only)."""
    a = _Asm()
    a.require(SOCK_TYPE, SOCK_STREAM)          # ctx->type == SOCK_STREAM
    a.require(SOCK_PROTOCOL, IPPROTO_TCP)      # ctx->protocol == IPPROTO_TCP (not MPTCP, SCTP)
    return a.build()


def prog_connect4(port: int) -> bytes:
    """connect(2) of an AF_INET socket: TCP to 127.0.0.1:port only."""
    a = _Asm()
    a.require(ADDR_TYPE, SOCK_STREAM)                               # a TCP socket
    a.require(ADDR_IP4, _u32(socket.inet_aton("127.0.0.1")))        # user_ip4 == 127.0.0.1
    a.require(ADDR_PORT, socket.htons(port))                        # user_port == port
    return a.build()


def prog_connect6(port: int) -> bytes:
    """connect(2) of an AF_INET6 socket: TCP to ::ffff:127.0.0.1 (IPv4-mapped) :port only."""
    ip6 = socket.inet_pton(socket.AF_INET6, "::ffff:127.0.0.1")
    a = _Asm()
    a.require(ADDR_TYPE, SOCK_STREAM)                               # a TCP socket
    for i in range(4):                                              # user_ip6[i], 4 words
        a.require(ADDR_IP6 + 4 * i, _u32(ip6[4 * i:4 * i + 4]))
    a.require(ADDR_PORT, socket.htons(port))                        # user_port == port
    return a.build()


def prog_refuse() -> bytes:
    """r0 = 0; exit: refuse every call (bind, UDP sendmsg)."""
    return _Asm().build(allow_at_end=False)


def programs(port: int) -> list[tuple[str, int, int, bytes]]:
    """(name, program type, attach type, instructions) of everything attached for `port`."""
    return [
        ("sock_create", PROG_CGROUP_SOCK, INET_SOCK_CREATE, prog_sock_create()),
        ("connect4", PROG_CGROUP_SOCK_ADDR, INET4_CONNECT, prog_connect4(port)),
        ("connect6", PROG_CGROUP_SOCK_ADDR, INET6_CONNECT, prog_connect6(port)),
        ("bind4", PROG_CGROUP_SOCK_ADDR, INET4_BIND, prog_refuse()),
        ("bind6", PROG_CGROUP_SOCK_ADDR, INET6_BIND, prog_refuse()),
        ("sendmsg4", PROG_CGROUP_SOCK_ADDR, UDP4_SENDMSG, prog_refuse()),
        ("sendmsg6", PROG_CGROUP_SOCK_ADDR, UDP6_SENDMSG, prog_refuse()),
    ]


# ---- bpf(2) -------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    r = _syscall(ctypes.c_long(SYS_BPF), ctypes.c_long(cmd), attr, ctypes.c_uint(len(attr)))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def load(name: str, prog_type: int, attach_type: int, insns: bytes,
         log: bool = False) -> int:
    """Load one program; returns its fd. On a verifier refusal the OSError carries the
    verifier's log when `log`."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    logbuf = ctypes.create_string_buffer(65536 if log else 1)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("<IIQQIIQ", attr, 0, prog_type, len(insns) // 8, ctypes.addressof(code),
                     ctypes.addressof(lic), 1 if log else 0, len(logbuf) if log else 0,
                     ctypes.addressof(logbuf) if log else 0)
    struct.pack_into("16s", attr, 48, (NAME_PREFIX + name).encode()[:15])  # prog_name
    struct.pack_into("<I", attr, 68, attach_type)                          # expected_attach_type
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        if log and logbuf.value:
            raise OSError(e.errno, f"{e.strerror}: {logbuf.value.decode(errors='replace')}"
                          ) from None
        raise


def attach(cgroup_fd: int, prog_fd: int, attach_type: int) -> None:
    attr = ctypes.create_string_buffer(32)
    struct.pack_into("<IIII", attr, 0, cgroup_fd, prog_fd, attach_type, BPF_F_ALLOW_MULTI)
    _bpf(BPF_PROG_ATTACH, attr)


def attached(cgroup_dir: str, attach_type: int) -> list[int]:
    """The ids of the programs attached directly to a cgroup for `attach_type`."""
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ids = (ctypes.c_uint32 * 64)()
        attr = ctypes.create_string_buffer(40)
        struct.pack_into("<IIIIQI", attr, 0, fd, attach_type, 0, 0, ctypes.addressof(ids), 64)
        _bpf(BPF_PROG_QUERY, attr)
        count = struct.unpack_from("<I", attr, 24)[0]
        return list(ids[:count])
    finally:
        os.close(fd)


def loaded(prefix: str = NAME_PREFIX) -> list[tuple[int, str]]:
    """(id, name) of every program loaded in the kernel whose name starts with `prefix`."""
    out = []
    next_id = 0
    while True:
        attr = ctypes.create_string_buffer(16)
        struct.pack_into("<I", attr, 0, next_id)
        try:
            _bpf(BPF_PROG_GET_NEXT_ID, attr)
        except OSError:
            return out                                   # ENOENT: no more programs
        next_id = struct.unpack_from("<I", attr, 4)[0]
        attr = ctypes.create_string_buffer(16)
        struct.pack_into("<I", attr, 0, next_id)
        try:
            fd = _bpf(BPF_PROG_GET_FD_BY_ID, attr)
        except OSError:
            continue                                     # freed meanwhile
        try:
            info = ctypes.create_string_buffer(256)
            attr = ctypes.create_string_buffer(16)
            struct.pack_into("<IIQ", attr, 0, fd, len(info), ctypes.addressof(info))
            _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
            name = info.raw[64:80].split(b"\0")[0].decode(errors="replace")
        finally:
            os.close(fd)
        if name.startswith(prefix):
            out.append((next_id, name))


class Programs:
    """The loaded programs for one proxy port, ready to attach to a cgroup."""

    def __init__(self, port: int) -> None:
        self.fds: list[tuple[int, int]] = []      # (prog fd, attach type)
        try:
            for name, ptype, atype, insns in programs(port):
                self.fds.append((load(name, ptype, atype, insns), atype))
        except BaseException:
            self.close()
            raise

    def attach(self, cgroup_dir: str) -> None:
        fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for prog, atype in self.fds:
                attach(fd, prog, atype)
        finally:
            os.close(fd)

    def close(self) -> None:
        for fd, _ in self.fds:
            os.close(fd)
        self.fds = []


_usable: str | None = None


def unusable_reason() -> str | None:
    """Why this process cannot load cgroup socket programs, or None. Loads (and drops) the
    programs once per process."""
    global _usable
    if _usable is None:
        if os.uname().machine != "x86_64":
            _usable = f"corral loads its cgroup programs on x86_64 only, not {os.uname().machine}"
        else:
            try:
                Programs(3128).close()
                _usable = ""
            except OSError as e:
                _usable = (f"bpf(2) cannot load a cgroup socket program: {e.strerror} "
                           f"(needs root with CAP_BPF and CAP_NET_ADMIN, and a kernel with "
                           f"CONFIG_CGROUP_BPF)")
    return _usable or None


def enforced() -> bool:
    """From a process inside the cgroup: do its programs run? (A UDP socket must be refused
    by sock_create.) Safe between fork and exec: two syscalls."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except PermissionError:
        return True
    s.close()
    return False


def cgroup2_mount() -> str | None:
    """Where the cgroup2 filesystem is mounted (/sys/fs/cgroup on v2 hosts,
    /sys/fs/cgroup/unified on hybrid ones), or None."""
    from .limits import _parse_mountinfo

    try:
        with open("/proc/self/mountinfo") as f:
            mounts = _parse_mountinfo(f.read())
    except OSError:
        return None
    return next((m.point for m in mounts if m.fstype == "cgroup2"), None)
