"""Typed events give exactly the dicts (keys, order, values) that Result JSON has always
held, so the JSON a user parses does not change."""

import json

from corral.events import (
    KINDS,
    AuditEvent,
    ExecEvent,
    LimitEvent,
    NetEvent,
    NoticeEvent,
    SecretEvent,
    TeardownEvent,
    UnenforcedEvent,
)


def dump(e) -> str:
    return json.dumps(e.to_dict())


def test_limit_events_are_todays_dicts():
    assert dump(LimitEvent.timeout(2.5)) == json.dumps(
        {"kind": "limit", "limit": "timeout",
         "message": "wall clock limit of 2.5s reached; every process of the run was killed"})
    assert dump(LimitEvent.cpu_time(1)) == json.dumps(
        {"kind": "limit", "limit": "cpu_time",
         "message": "CPU time limit of 1s reached; every process of the run was killed"})
    assert dump(LimitEvent.memory(2, 1 << 20)) == json.dumps(
        {"kind": "limit", "limit": "memory",
         "message": "the memory cgroup killed 2 process(es) at the 1048576 byte limit"})
    assert dump(LimitEvent.output("stderr", 10)) == json.dumps(
        {"kind": "limit", "limit": "output", "stream": "stderr",
         "message": "stderr past 10 bytes was dropped"})
    assert dump(LimitEvent.scratch_full()) == json.dumps(
        {"kind": "limit", "limit": "scratch", "message": "/scratch (with /tmp and /dev/shm) is full"})
    assert dump(LimitEvent.scratch_inodes()) == json.dumps(
        {"kind": "limit", "limit": "scratch_inodes", "message": "/scratch ran out of inodes"})


def test_the_other_kinds_are_todays_dicts():
    assert dump(UnenforcedEvent("limits.memory", "process", "why")) == json.dumps(
        {"kind": "unenforced", "rule": "limits.memory", "tier": "process", "reason": "why"})
    assert dump(TeardownEvent("gone")) == json.dumps({"kind": "teardown", "message": "gone"})
    assert dump(NetEvent("a.test", 443, "deny", "not allowed")) == json.dumps(
        {"kind": "net", "host": "a.test", "port": 443, "decision": "deny",
         "reason": "not allowed", "bytes_in": 0, "bytes_out": 0})
    assert dump(SecretEvent("TOKEN", "a.test", 443, "injected", "granted")) == json.dumps(
        {"kind": "secret", "name": "TOKEN", "host": "a.test", "port": 443,
         "decision": "injected", "reason": "granted"})
    assert dump(ExecEvent("nosuch", "ENOENT", "corral: command not found inside the sandbox: "
                      "nosuch")) == json.dumps(
        {"kind": "exec", "command": "nosuch", "errno": "ENOENT",
         "message": "corral: command not found inside the sandbox: nosuch"})
    assert dump(NoticeEvent("zygote replaced")) == json.dumps(
        {"kind": "notice", "message": "zygote replaced"})
    assert dump(AuditEvent.lost("database is locked")) == json.dumps(
        {"kind": "audit", "message": "the audit record of this run was lost: database is "
                                     "locked (the run itself was not affected; see "
                                     "docs/audit.md)"})
    assert set(KINDS) == {"limit", "exec", "unenforced", "teardown", "net", "secret", "notice",
                          "audit", "refused", "syscall"}


def test_a_refused_run_has_one_refused_event():
    """The run never started (audit.record.record_refused): field only when there is one."""
    from corral.events import RefusedEvent

    assert dump(RefusedEvent("policy", "limits.memory", "bad size")) == json.dumps(
        {"kind": "refused", "error": "policy", "field": "limits.memory",
         "message": "bad size"})
    assert dump(RefusedEvent("unavailable", None, "no tier")) == json.dumps(
        {"kind": "refused", "error": "unavailable", "message": "no tier"})


def test_the_proxys_event_lines_are_parsed_strictly_and_bounded():
    from corral.backends.host.launch import EventLines

    lines = EventLines()
    good = json.dumps(NetEvent("a.test", 443, "deny", "x").to_dict()).encode()
    lines(good[:10])                      # split across reads
    lines(good[10:] + b"\n" + b"not json\n" + b'{"kind": "nosuch"}\n' + b"[1, 2]\n")
    assert lines.events[0]["host"] == "a.test"
    assert [e["kind"] for e in lines.events[1:]] == ["teardown"] * 3
    lines(b"x" * (EventLines.MAX_LINE + 1))   # a line that never ends is not kept
    assert lines.buf == b"" and lines.events[-1]["kind"] == "teardown"
    for _ in range(EventLines.MAX_EVENTS):
        lines(good + b"\n")
    assert len(lines.events) == EventLines.MAX_EVENTS and lines.dropped == 5
    assert "5 further events" in lines.dropped_event()[0]["message"]


def test_a_syscall_event_and_the_others_entry():
    """Refused syscalls (linux/seccomp_notify.py): message only on the capped entry."""
    from corral.events import SyscallEvent

    assert dump(SyscallEvent("unshare", 272, "EPERM", 3)) == json.dumps(
        {"kind": "syscall", "name": "unshare", "number": 272, "errno": "EPERM", "count": 3})
    other = SyscallEvent.others(12, 64).to_dict()
    assert other["name"] == "other" and other["number"] == -1 and other["count"] == 12
    assert "64" in other["message"]


def test_the_events_a_person_sees_carry_no_escape_or_bidi_control(capsys):
    """`corral run` prints the limit, teardown, unenforced and audit events on stderr: a
    name a sandbox chose, quoted in one (a file name, a host), reaches the terminal as
    visible escapes, never as an escape sequence (OSC 52, a cursor move), a carriage
    return or a bidi control that reorders the line."""
    from corral.cli import _print_events

    evil = "/scratch/\x1b]52;c;cHduZWQ=\x07a\rfake\u202eexe.txt\u2066\n2nd line"
    _print_events([TeardownEvent(f"remove {evil}: Device or resource busy").to_dict(),
                   LimitEvent(evil, message=evil).to_dict(),
                   UnenforcedEvent(evil, "namespace", evil).to_dict(),
                   AuditEvent.lost(f"host {evil}").to_dict()])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 4 and all(line.startswith("corral: ") for line in lines), err
    for bad in ("\x1b", "\x07", "\r", "\u202e", "\u2066"):
        assert bad not in err
    assert "\\x1b]52;c;cHduZWQ=\\x07a\\rfake\\u202eexe.txt\\u2066\\n2nd line" in lines[0]
