"""Refused syscalls observed through seccomp user notification (linux/seccomp_notify.py):
the program rewritten, evaluated, and a real live namespace sandbox whose commands get the
same errno with observation on as off, with the refusals as "syscall" events, bounded, in
the audit store, in learn mode; the listener gone leaves every refusal refused (ENOSYS)."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys

import pytest
from conftest import CORRAL, tier_unavailable
from livefix import running

import corral
from corral.linux import seccomp, seccomp_notify
from corral.linux.seccomp_notify import RET_ERRNO, RET_USER_NOTIF, evaluate, notifying

pytestmark = pytest.mark.skipif(bool(tier_unavailable("namespace")),
                                reason=str(tier_unavailable("namespace")))

PY = "/usr/bin/python3"
#: a probe run inside: each call's errno, one line each (the byte-compared output)
PROBE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return ctypes.get_errno() if r < 0 else 0
CALLS = [("unshare", 272, (0x10000000,)), ("unshare", 272, (0x20000,)),
         ("unshare", 272, (0x10000000,)), ("keyctl", 250, (0, 0, 0)),
         ("mount", 165, (0, 0, 0, 0, 0)), ("ptrace", 101, (16, 1, 0, 0)),
         ("setxattr", 188, (0, 0, 0, 0, 0)), ("socket_packet", 41, (17, 3, 0)),
         ("clone_newuser", 56, (0x10000000 | 17, 0, 0, 0, 0)), ("nosuch_500", 500, ()),
         ("acct", 163, (0,)), ("getpid", 39, ())]
for name, nr, args in CALLS:
    print(name, call(nr, *args))
n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for _ in range(n):          # a flood of one refused call
    call(250, 0, 0, 0)
for nr in range(600, 600 + (int(sys.argv[2]) if len(sys.argv) > 2 else 0)):
    assert call(nr) == 38   # many distinct numbers, each ENOSYS
print("flood done", n)
"""
WANT = {"unshare": "EPERM", "keyctl": "EPERM", "mount": "EPERM", "ptrace": "EPERM",
        "setxattr": "EOPNOTSUPP", "socket": "EAFNOSUPPORT", "clone": "EPERM",
        "syscall_500": "ENOSYS", "acct": "EPERM"}


def _probe(sb, *args, timeout=120):
    r = sb.exec([PY, "-", *map(str, args)], stdin=PROBE.encode(), timeout=timeout)
    assert r.verdict == "ok", (r.verdict, r.stderr[-2000:])
    return r


def _syscalls(r) -> dict:
    return {e["name"]: e for e in r.events if e["kind"] == "syscall"}


@pytest.fixture(scope="module")
def bpf():
    return seccomp.compile_bpf()


# -- the program -----------------------------------------------------------------------

def test_notifying_changes_only_the_errno_returns(bpf):
    prog = notifying(bpf)
    assert len(prog) == len(bpf)
    changed = 0
    for i in range(0, len(bpf), 8):
        a, b = bpf[i:i + 8], prog[i:i + 8]
        if a != b:
            code, _, _, k = struct.unpack("<HBBI", a)
            assert code == 0x06 and k & 0xFFFF0000 == RET_ERRNO, i
            assert struct.unpack("<HBBI", b) == (0x06, a[2], a[3], RET_USER_NOTIF)
            changed += 1
    assert changed > 3            # the allow list's ENOSYS and the refusals' errnos


def test_evaluated_the_notifying_program_notifies_exactly_where_the_original_refuses(bpf):
    prog = notifying(bpf)
    samples = [(nr, args) for nr in range(0, 520)
               for args in ((0,) * 6, (0x10000000 | 17, 1, 2, 3, 4, 5), (17, 3, 0, 0, 0, 0))]
    notified = 0
    for nr, args in samples:
        data = struct.pack("<iIQ6Q", nr, 0xC000003E, 0x1234, *args)
        orig, new = evaluate(bpf, data), evaluate(prog, data)
        if orig & 0xFFFF0000 == RET_ERRNO:
            assert new == RET_USER_NOTIF, (nr, args)
            assert seccomp_notify.errno_of(bpf, data) == orig & 0xFFFF
            notified += 1
        else:
            assert new == orig, (nr, args)
    assert notified > 100
    # a foreign architecture is killed by both, never notified
    data = struct.pack("<iIQ6Q", 1, 0x40000003, 0, *(0,) * 6)
    assert evaluate(bpf, data) == evaluate(prog, data) == 0x80000000


def test_a_program_the_evaluator_cannot_answer_for_is_refused():
    ret_a = struct.pack("<HBBI", 0x16, 0, 0, 0)
    with pytest.raises(ValueError, match="opcode"):
        notifying(ret_a)
    reads_ip = struct.pack("<HBBI", 0x20, 0, 0, 8) + struct.pack("<HBBI", 0x06, 0, 0, 0)
    with pytest.raises(ValueError, match="offset 8"):
        notifying(reads_ip)


def test_the_tally_is_bounded():
    t = seccomp_notify.Tally()
    for nr in range(1000):
        t.add(nr, 38)
    t.add(3, 38)
    assert len(t.counts) == seccomp_notify.MAX_DISTINCT and t.total == 1001
    assert t.other == 1000 - seccomp_notify.MAX_DISTINCT
    assert t.entries()[0] == (3, 38, 2)


# -- a real sandbox ----------------------------------------------------------------------

def test_the_same_errnos_observed_or_not_and_the_events_name_each_call():
    outs, results = {}, {}
    for observe in (False, True):
        sb = corral.Sandbox.create({"audit": {"syscalls": observe}}, timeout=120)
        try:
            results[observe] = r = _probe(sb)
            outs[observe] = r.stdout
        finally:
            sb.kill()
    assert outs[True] == outs[False]                       # byte for byte
    lines = dict(line.split() for line in outs[True].splitlines()[:12])
    assert lines["unshare"] == str(errno.EPERM) and lines["getpid"] == "0"
    assert lines["setxattr"] == str(errno.EOPNOTSUPP) and lines["nosuch_500"] == "38"
    assert not _syscalls(results[False])
    got = _syscalls(results[True])
    assert {n: errno.errorcode[getattr(errno, e)] for n, e in WANT.items()} == \
        {n: got[n]["errno"] for n in WANT}, got
    assert got["unshare"]["count"] == 3 and got["unshare"]["number"] == 272
    assert got["keyctl"]["count"] == 1 and "getpid" not in got


def test_the_listener_is_never_in_the_sandbox():
    """Its holder could answer its own calls (or let them through): only the command's
    stdio is open in an observed command."""
    sb = corral.Sandbox.create({"audit": {"syscalls": True}}, timeout=60)
    try:
        r = sb.exec([PY, "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"])
        h = sb.commands.run(["/bin/sh", "-c", "sleep 30"], background=True)
        fds = sb.exec(["/bin/sh", "-c", "ls /proc/*/fd/ 2>/dev/null | sort -u | "
                                        "grep -c . ; ls -l /proc/*/fd/ 2>/dev/null | "
                                        "grep -c seccomp"])
        h.kill()
    finally:
        sb.kill()
    assert r.stdout.strip() == "['0', '1', '2', '3']", r.stdout   # 3: listdir's own
    assert fds.stdout.split()[-1] == "0", fds.stdout    # no seccomp listener anywhere


def test_a_flood_is_counted_not_kept_and_distinct_numbers_are_capped():
    """20,000 calls of one refused syscall are one event with their count (thousands of
    times what a Result could carry as events), and past MAX_DISTINCT numbers the rest
    are counted under "other"."""
    n = 20_000
    sb = corral.Sandbox.create({"audit": {"syscalls": True}}, timeout=300)
    try:
        r = _probe(sb, n, 200, timeout=280)
    finally:
        sb.kill()
    assert r.stdout.rstrip().endswith(f"flood done {n}")
    ev = [e for e in r.events if e["kind"] == "syscall"]
    assert len(ev) == seccomp_notify.MAX_DISTINCT + 1            # bounded
    by = {e["name"]: e for e in ev}
    assert by["keyctl"]["count"] == n + 1 and ev[0]["name"] == "keyctl"
    other = by["other"]
    distinct = 9 + 200     # the probe's refused numbers (unshare thrice), then 600..799
    assert other["number"] == -1 and other["count"] == distinct - seccomp_notify.MAX_DISTINCT
    assert len(json.dumps(r.events)) < 20_000


def test_with_the_listener_gone_the_call_is_still_refused_enosys():
    """The observer (the listener's holder) goes while a command runs: the kernel answers
    ENOSYS for every call the profile refuses, the rest still works."""
    sb = corral.Sandbox.create({"audit": {"syscalls": True}}, timeout=120)
    try:
        h = sb.commands.run([PY, "-c", "import sys; sys.stdin.readline(); "
                             "exec(sys.stdin.read())"], background=True)
        sb._live.observer.close()
        h.send_stdin("go\n" + PROBE)
        h.close_stdin()
        r = h.wait(60)
        after = sb.exec(["/bin/sh", "-c", "cat /proc/self/status | grep -c ^Seccomp:.2"])
    finally:
        sb.kill()
    assert r.verdict == "ok", r.stderr[-2000:]
    lines = dict(line.split() for line in r.stdout.splitlines()[:12])
    refused = {k: v for k, v in lines.items() if k != "getpid"}
    assert set(refused.values()) == {str(errno.ENOSYS)}, lines      # fail closed
    assert lines["getpid"] == "0"
    assert after.stdout.strip() == "1"       # a later command: still filtered


def _pids_with(marker: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(name))
            except OSError:
                pass
    return out


def test_the_listener_holder_killed_takes_the_sandbox_with_it():
    """The listener's holder is the supervisor: killed (SIGKILL), it leaves no observed
    command running unobserved: the sandbox's every process goes with it."""
    import signal
    import time

    from corral.runtime.registry import read_entry

    sb = corral.Sandbox.create({"audit": {"syscalls": True}}, timeout=120, detached=True)
    try:
        marker = f"holder-test-{os.getpid()}-{time.monotonic_ns()}"
        sb.commands.run([PY, "-c", f"import time\nwhile True: time.sleep(0.05) # {marker}"],
                        background=True)
        r = sb.commands.run([PY, "-c", "import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                             "print(l.syscall(272, 0x10000000), ctypes.get_errno())"])
        assert r.stdout.split() == ["-1", str(errno.EPERM)]
        assert any(e["kind"] == "syscall" and e["name"] == "unshare" for e in r.events)
        (victim,) = _pids_with(marker)        # its host pid
        os.kill(read_entry(sb.id)["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (_pids_with(marker) or running([victim])) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _pids_with(marker), "the command outlived its supervisor"
        # gone, or a zombie its new parent has not reaped yet (the CI's pid 1 may be slow
        # to reap, or never): a zombie has exited and runs nothing
        assert not running([victim]), "the command outlived its supervisor"
    finally:
        try:
            sb.kill()
        except corral.CorralError:
            pass


def test_learn_mode_lists_the_refused_syscalls():
    sb = corral.Sandbox.create(None, learn=True, timeout=120)
    try:
        _probe(sb)
        seen = sb.learned()["syscalls_refused"]
        text = sb.learned_policy()
    finally:
        sb.kill()
    by = {s["name"]: s for s in seen}
    assert by["unshare"] == {"name": "unshare", "errno": "EPERM", "count": 3}
    assert "#   unshare: 3x EPERM" in text and "#   keyctl: 1x EPERM" in text


def test_corral_learn_and_denials_show_them(tmp_path):
    env = dict(os.environ, CORRAL_STATE_DIR=str(tmp_path / "state"), CORRAL_AUDIT="1")
    env.pop("CORRAL_AUDIT_FACE", None)
    r = subprocess.run([CORRAL, "learn", "--stdin", "--out", str(tmp_path / "p.toml"), "--",
                        PY, "-"], input=PROBE.encode(), capture_output=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert b"syscalls the seccomp profile refused (no policy allows them): unshare 3x " \
           b"EPERM" in r.stderr
    assert "#   mount: 1x EPERM" in (tmp_path / "p.toml").read_text()
    d = subprocess.run([CORRAL, "denials", "--kind", "syscall", "--json"],
                       capture_output=True, env=env, timeout=60)
    assert d.returncode == 0, d.stderr
    groups = {g["what"]: g for g in map(json.loads, d.stdout.decode().splitlines())}
    assert groups["unshare (EPERM)"]["count"] == 3 and groups["unshare (EPERM)"]["rule"] is None
    assert {g["kind"] for g in groups.values()} == {"syscall"}


@pytest.mark.skipif(bool(tier_unavailable("process")), reason="no process tier here")
def test_the_process_tier_same_errnos_observed_or_not_and_learn_lists_them():
    """The process tier loads its own filter in the command's process: observed there in
    one-shot runs (and so in learn mode, which runs one-shot on that tier)."""
    outs, results = {}, {}
    for observe in (False, True):
        results[observe] = r = corral.run([PY, "-"], {"isolation": "process",
                                                      "audit": {"syscalls": observe}},
                                          stdin=PROBE.encode())
        assert r.verdict == "ok", r.stderr[-2000:]
        outs[observe] = r.stdout
    assert outs[True] == outs[False]
    assert not _syscalls(results[False])
    got = _syscalls(results[True])
    assert got["unshare"]["count"] == 3 and got["unshare"]["errno"] == "EPERM"
    assert got["syscall_500"]["errno"] == "ENOSYS" and "getpid" not in got
    with corral.Sandbox({"isolation": "process"}, learn=True) as sb:
        sb.exec([PY, "-"], stdin=PROBE.encode())
        seen = {s["name"]: s for s in sb.learned()["syscalls_refused"]}
    assert seen["keyctl"] == {"name": "keyctl", "errno": "EPERM", "count": 1}


@pytest.mark.skipif(bool(tier_unavailable("process")), reason="no process tier here")
def test_the_process_tier_without_its_observer_still_refuses_enosys():
    with corral.Sandbox({"isolation": "process", "audit": {"syscalls": True}}) as sb:
        sb.open()
        sb._live.observer.close()
        r = sb.exec([PY, "-"], stdin=PROBE.encode())
    assert r.verdict == "ok", r.stderr[-2000:]
    lines = dict(line.split() for line in r.stdout.splitlines()[:12])
    assert {v for k, v in lines.items() if k != "getpid"} == {str(errno.ENOSYS)}, lines
    assert lines["getpid"] == "0" and not _syscalls(r)


def test_a_one_shot_run_refuses_the_key_and_it_must_be_a_bool():
    """bubblewrap loads a one-shot run's program: nothing to observe it with, so the
    explicit key is refused, never silently ignored; a bad value names the field."""
    with pytest.raises(corral.UnsupportedRule, match="live sandbox") as e:
        corral.run(["/bin/true"], {"audit": {"syscalls": True}})
    assert e.value.field == "audit.syscalls"
    assert corral.run(["/bin/true"], {"audit": {"syscalls": False}}).verdict == "ok"
    with pytest.raises(corral.PolicyError, match="true or false") as e:
        corral.run(["/bin/true"], {"audit": {"syscalls": "yes"}})
    assert e.value.field == "audit.syscalls"


@pytest.mark.skipif(bool(tier_unavailable("gvisor")), reason="no gvisor tier here")
def test_gvisor_refuses_the_key():
    with pytest.raises(corral.UnsupportedRule, match="gvisor tier cannot report") as e:
        corral.Sandbox.create({"isolation": "gvisor", "audit": {"syscalls": True}},
                              timeout=60)
    assert e.value.field == "audit.syscalls"


if __name__ == "__main__":   # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# -- an errno past MAX_ERRNO -----------------------------------------------------------

#: a child that loads the program given in hex (with a listener whose fd goes to the
#: socket fd given, or without), then calls keyctl(0, 0, 0) and prints (ret, errno)
ERRNO_CHILD = r"""
import ctypes, os, socket, sys
from corral.linux.process_seccomp import Loader
prog, listen = bytes.fromhex(sys.argv[1]), sys.argv[2] == "1"
ld = Loader(prog, listen)
ld.no_new_privs()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = os.dup(1)
if listen:
    fd = ld.load_listening()
    s = socket.socket(fileno=int(sys.argv[3]))
    socket.send_fds(s, [b"l"], [fd])
    os.close(fd)
    s.close()
else:
    ld.load()
ctypes.set_errno(0)
r = libc.syscall(250, ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
os.write(out, b"%d %d\n" % (r, ctypes.get_errno()))
"""


def _keyctl_errno_prog(err: int) -> bytes:
    """ld nr; jeq keyctl -> ret ERRNO(err); ret ALLOW."""
    ins = [(0x20, 0, 0, 0), (0x15, 0, 1, 250), (0x06, 0, 0, RET_ERRNO | err),
           (0x06, 0, 0, 0x7FFF0000)]
    return b"".join(struct.pack("<HBBI", *i) for i in ins)


def _keyctl_run(prog: bytes, observer=None) -> tuple[int, int]:
    if observer is None:
        p = subprocess.run([sys.executable, "-c", ERRNO_CHILD, prog.hex(), "0"],
                           capture_output=True, timeout=60)
    else:
        import socket

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        observer.watch_socket(ours)
        try:
            p = subprocess.run([sys.executable, "-c", ERRNO_CHILD, notifying(prog).hex(),
                                "1", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                               capture_output=True, timeout=60)
        finally:
            theirs.close()
    assert p.returncode == 0, p.stderr[-2000:]
    r, e = p.stdout.split()
    return int(r), int(e)


@pytest.mark.parametrize("err", [errno.EPERM, 4095, 5000, 0xFFFF])
def test_an_errno_past_max_errno_is_answered_as_the_kernel_caps_it(err):
    """The kernel caps a RET_ERRNO's data at MAX_ERRNO (4095); the observer's answer
    must be the same, not -5000 (which libc takes for a successful return)."""
    prog = _keyctl_errno_prog(err)
    plain = _keyctl_run(prog)
    obs = seccomp_notify.Observer(prog)
    try:
        observed = _keyctl_run(prog, obs)
    finally:
        obs.close()
    assert plain == (-1, min(err, 4095))
    assert observed == plain
