"""corral.linux.seccomp's programs themselves, instruction by instruction: a classic-BPF
interpreter (the kernel's semantics for what libseccomp and corral emit) answers every
syscall number and sampled argument as the tables say, and the tables agree with each
other. Split from test_seccomp.py; no kernel needed but libseccomp's binding."""

from __future__ import annotations

import os
import struct
from errno import EAFNOSUPPORT, ENOSYS, EPERM, EPROTONOSUPPORT

from corral.linux import seccomp

AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def run_bpf(prog: bytes, nr: int, args=(0,) * 6, arch=AUDIT_ARCH_X86_64) -> int:
    """What the classic BPF program returns for one struct seccomp_data: the kernel's
    semantics for the instructions libseccomp and corral emit (an unknown one fails)."""
    args = tuple(args) + (0,) * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a % (1 << 64) for a in args])
    a = x = pc = 0
    mem = [0] * 16
    while True:
        code, jt, jf, k = struct.unpack_from("<HBBI", prog, pc * 8)
        pc += 1
        if code == 0x20:                       # ld [k]
            a = int.from_bytes(data[k:k + 4], "little")
        elif code == 0x00:                     # ld #k
            a = k
        elif code == 0x01:                     # ldx #k
            x = k
        elif code in (0x02, 0x03):             # st / stx M[k]
            mem[k] = a if code == 0x02 else x
        elif code in (0x60, 0x61):             # ld / ldx M[k]
            a, x = (mem[k], x) if code == 0x60 else (a, mem[k])
        elif code == 0x54:                     # and #k
            a &= k
        elif code == 0x44:                     # or #k
            a |= k
        elif code == 0x07:                     # tax
            x = a
        elif code == 0x87:                     # txa
            a = x
        elif code == 0x05:                     # ja k
            pc += k
        elif code & 0x07 == 0x05:              # jeq/jgt/jge/jset, #k or x
            v = x if code & 0x08 else k
            op = code & 0xF0
            taken = {0x10: a == v, 0x20: a > v, 0x30: a >= v, 0x40: bool(a & v)}[op]
            pc += jt if taken else jf
        elif code == 0x06:                     # ret #k
            return k
        elif code == 0x16:                     # ret a
            return a
        else:
            raise AssertionError(f"unknown BPF opcode {code:#x} at {pc - 1}")


def _matches(c, args) -> bool:
    v = args[c.arg] % (1 << 64)
    return {"masked_eq": lambda: v & c.mask == c.value, "gt": lambda: v > c.value,
            "eq": lambda: v == c.value, "ne": lambda: v != c.value}[c.op]()


def expected(refusals, passing, nr, args=(0,) * 6) -> int:
    """The tables' answer, evaluated here: not passed -> ENOSYS, else the errno of the
    matching refusal (two matching refusals must agree), else ALLOW."""
    by_nr = {seccomp.resolve(n): n for n in passing}
    if nr not in by_nr:
        return RET_ERRNO | ENOSYS
    got = {r.errno for r in refusals
           if seccomp.resolve(r.syscall) == nr and all(_matches(c, args) for c in r.when)}
    assert len(got) <= 1, f"{by_nr[nr]}{args}: refusals disagree: {got}"
    return RET_ERRNO | got.pop() if got else RET_ALLOW


HI = 0xDEAD_BEEF_0000_0000
# argument vectors for the calls with argument rules: the boundary of every rule
SAMPLES = {
    "ioctl": [(1, v) for v in (0x5412, 0x541C, 0x5413, 0x5401, 0x541B, 0x541D, HI | 0x5412,
                               0xFFFFFFFF_00005413, 0xFFFFFFFF_80045430, 0)],
    "personality": [(v,) for v in (0, 0xFFFFFFFF, 8, 0x40000, 0xFFFFFFFE, 1 << 32,
                                   (1 << 64) - 1, 0x7FFFFFFF)],
    "clone": [(v,) for v in (17, 0x3D0F00 | 17, 0x10000000 | 17, 0x20000 | 17, 0x80, 0)],
    "socket": [(f, t, p) for f in list(range(48)) + [1 << 32 | 1, 1 << 32 | 40, -1]
               for t, p in ((1, 0), (2, 0), (3, 15), (3, 0), (1, 1 << 32))],
    "socketpair": [(f, 1, 0) for f in (0, 1, 2, 10, 16, 40, 1 << 32 | 1)],
    "renameat2": [(-100, 0, -100, 0, f) for f in (0, 1, 2, 4, 5, 6, HI | 4, HI)],
    "chmod": [(0, m) for m in (0o644, 0o4755, 0o2755, HI | 0o644, HI | 0o4000)],
    "fchmodat": [(-100, 0, m) for m in (0o644, 0o6755)],
    "openat": [(-100, 0, f, m) for f in (0, 0o100, 0o20200000, 0o1101)
               for m in (0o644, 0o4644, 0o2600)],
    "open": [(0, f, m) for f in (0, 0o100) for m in (0o644, 0o4644)],
    "creat": [(0, m) for m in (0o644, 0o4644)],
    "mknodat": [(-100, 0, m, 0) for m in (0o010644, 0o100644, 0o020600, 0o060600,
                                          0o104755, 0o140644, 0)],
}


def _programs():
    yield "namespace", seccomp.rules(), seccomp.compile_bpf()
    from corral.linux import process_seccomp

    for net in ("none", "allow"):
        for abi in (1, 4):
            refusals = process_seccomp.rules(abi, net)
            yield f"process-{net}-abi{abi}", refusals, process_seccomp.compile_bpf(abi, net)


def test_program_answers_every_number_as_the_tables_do():
    """Every syscall number 0..1023 (zero arguments) and every sample above: the compiled
    program (corral's allow-list part + libseccomp's refusals) gives what the tables say;
    numbers on no list, such as 600 or mbind's 237, answer ENOSYS."""
    for name, refusals, prog in _programs():
        passing = seccomp.passed(refusals)
        wrong = [(nr, hex(run_bpf(prog, nr))) for nr in range(1024)
                 if run_bpf(prog, nr) != expected(refusals, passing, nr)]
        assert not wrong, (name, wrong[:10])
        for call, vectors in SAMPLES.items():
            nr = seccomp.resolve(call)
            for args in vectors:
                args = tuple(args) + (0,) * (6 - len(args))
                assert run_bpf(prog, nr, args) == expected(refusals, passing, nr, args), (
                    name, call, [hex(a % (1 << 64)) for a in args])
        for nr in (600, 237, 1023):
            assert run_bpf(prog, nr) == RET_ERRNO | ENOSYS, (name, nr)
        for nr in (0, 39, 231, 600):  # x32 numbers and the i386 entry kill
            assert run_bpf(prog, nr | 0x40000000) == RET_KILL_PROCESS, name
            assert run_bpf(prog, nr, arch=AUDIT_ARCH_I386) == RET_KILL_PROCESS, name


def test_refusals_win_over_the_allow_list():
    """ioctl, socket, renameat2 are on the allow list; their refused arguments are still
    refused by the program, near misses are not."""
    prog = seccomp.compile_bpf()
    ioctl, sock, ren = (seccomp.resolve(n) for n in ("ioctl", "socket", "renameat2"))
    assert run_bpf(prog, ioctl, (1, 0x5412)) == RET_ERRNO | EPERM
    assert run_bpf(prog, ioctl, (1, HI | 0x541C)) == RET_ERRNO | EPERM
    assert run_bpf(prog, ioctl, (1, 0x5413)) == RET_ALLOW
    assert run_bpf(prog, sock, (40, 1, 0)) == RET_ERRNO | EAFNOSUPPORT
    assert run_bpf(prog, sock, (16, 3, 15)) == RET_ERRNO | EPROTONOSUPPORT
    assert run_bpf(prog, sock, (16, 3, 0)) == RET_ALLOW
    assert run_bpf(prog, ren, (0, 0, 0, 0, 4)) == RET_ERRNO | EPERM
    assert run_bpf(prog, ren, (0, 0, 0, 0, 1)) == RET_ALLOW


def test_libseccomp_cannot_express_allow_except():
    """Why the allow list is not libseccomp rules: in a filter whose default refuses, an
    unconditional ALLOW of ioctl erases the conditional ERRNO rule of the same syscall
    (added before or after it), so TIOCSTI would pass. If this ever fails, libseccomp
    changed how it resolves rules; seccomp.py's design note should say so."""
    import seccomp as lib

    ioctl = seccomp.resolve("ioctl")
    for order in ("allow first", "refusal first"):
        flt = lib.SyscallFilter(lib.ERRNO(ENOSYS))
        rules = [(lib.ALLOW,), (lib.ERRNO(EPERM), lib.Arg(1, lib.MASKED_EQ, 0xFFFFFFFF, 0x5412))]
        for action, *args in rules if order == "allow first" else rules[::-1]:
            flt.add_rule(action, ioctl, *args)
        with os.fdopen(os.memfd_create("t"), "w+b") as f:
            flt.export_bpf(f)
            f.seek(0)
            prog = f.read()
        assert run_bpf(prog, ioctl, (1, 0x5412)) == RET_ALLOW, order


def test_tables_are_consistent():
    names = seccomp.allowed()
    assert len(names) == len(set(names)), "a syscall listed twice"
    refused = {r.syscall for r in seccomp.rules() if not r.when}
    conditional = {r.syscall for r in seccomp.rules() if r.when}
    not_allowed = {n for _, group in seccomp.NOT_ALLOWED for n in group}
    assert not refused & set(names), "refused outright and allowed"
    assert not not_allowed & (set(names) | refused | conditional)
    assert conditional <= set(names), "argument rules for a syscall off the list"
    assert all(isinstance(n, str) for n in names)
    for name in seccomp.passed(seccomp.rules()):  # every name is a real syscall
        assert seccomp.resolve(name) >= 0
