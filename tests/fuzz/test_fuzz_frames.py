"""The frame parsers between corral and what runs inside or beside a sandbox, under
arbitrary and oversize input: the microvm agent's frames (guest/microvm_agent.py, and the
host's FrameReader and parse_exit in backends/microvm.py), the supervisor's frames
(runtime/supervisor.py over a real socketpair; the child's failure reports and the
launcher's held line in linux/supervise.py), the run_code runner's channel
(runtime/session.py's FrameReader and check_message against guest/runner.py's encoder),
the E2B Connect envelope (service/e2b/connect.py) and the audit spool's lines
(audit/spool.py, ingested into a real SQLite store). Each gives its answer or its
documented error, whatever the cut of the stream; nothing else escapes."""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile

from hypothesis import example, given
from hypothesis import strategies as st
from strategies import json_values, split_points

#: deep nesting: json.loads raises RecursionError (not ValueError) past ~1000 levels
DEEP = b"[" * 3000
FRAME_KINDS = st.sampled_from(b"CIDKSROEXZ\x00").map(lambda c: bytes([c]))


def framed(kind: bytes, data: bytes) -> bytes:
    return kind + struct.pack(">I", len(data)) + data


RAW_FRAMES = st.lists(st.one_of(
    st.builds(framed, FRAME_KINDS, st.binary(max_size=64)),
    st.builds(lambda k, n: k + struct.pack(">I", n), FRAME_KINDS,
              st.sampled_from([65536, 65537, 2**32 - 1])),
    st.binary(max_size=12)), max_size=6).map(b"".join)


# --- the microvm's frames, host side ----------------------------------------------------

def host_frames(pieces: list[bytes], allowed: bytes = b"OEX"):
    from corral.backends.microvm import MAX_FRAME, FrameReader

    r = FrameReader(allowed)
    out = []
    try:
        for p in pieces:
            out += r.feed(p)
            assert len(r.buf) < 5 + MAX_FRAME          # nothing past one frame is held
    except ValueError as e:
        assert "\n" not in str(e)
        return out, "error"
    return out, bytes(r.buf)


@given(RAW_FRAMES, st.data())
def test_microvm_host_frames_split_anywhere(data, draw):
    whole = host_frames([data])
    got = host_frames(draw.draw(split_points(data)))
    if whole[1] == "error":
        assert got[1] == "error" and whole[0][:len(got[0])] == got[0][:len(whole[0])]
    else:
        assert got == whole


EXIT = st.fixed_dictionaries({"code": st.one_of(st.none(), st.integers(-1, 300)),
                              "signal": st.one_of(st.none(), st.integers(0, 70)),
                              "cpu": st.one_of(st.floats(), st.integers()),
                              "oom": st.integers(-1, 2**32), "full": json_values(1)})


@given(st.one_of(st.binary(max_size=80), EXIT.map(lambda d: json.dumps(d).encode()),
                 json_values().map(lambda v: json.dumps(v).encode())))
@example(DEEP)
@example(b'{"code": 0, "signal": null, "cpu": 1e999, "oom": 0, "full": 0}')
def test_microvm_exit_frame_is_checked_or_value_error(data):
    from corral.backends.microvm import parse_exit

    try:
        x = parse_exit(data)
    except ValueError:
        return
    assert (x["code"] is None) != (x["signal"] is None)
    assert 0 <= x["cpu"] < 1e9 and x["full"] in (0, 1, 2, 3)


# --- the microvm's frames, guest side (the agent reads the host's) ----------------------

def agent_frames(pieces: list[bytes]):
    from corral.guest.microvm_agent import HOST_MAX, Channel

    r, w = os.pipe()
    ch = Channel(r)
    out = []
    try:
        for p in pieces:
            os.write(w, p)
            while True:            # what a read gives may be less than what was written
                got = ch.feed()
                out += got
                assert len(ch.buf) < 5 + HOST_MAX + (1 << 16)
                if not os.get_blocking(r) or not _readable(r):
                    break
        return out, ch.buf
    except SystemExit as e:          # the agent's documented answer: it powers off
        assert "bad frame" in str(e)
        return out, "exit"
    finally:
        os.close(r)
        os.close(w)


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


@given(RAW_FRAMES, st.data())
def test_microvm_agent_frames_split_anywhere(data, draw):
    whole = agent_frames([data] if data else [])
    got = agent_frames(draw.draw(split_points(data)))
    if whole[1] == "exit":
        assert got[1] == "exit"
    else:
        assert got == whole


# --- the supervisor's frames (runtime/supervisor.py), over a real socketpair ------------

def supervisor_frames(data: bytes, pieces: list[bytes]):
    from corral.runtime.supervisor import ProtocolError, recv_frame

    a, b = socket.socketpair()
    out = []
    try:
        for p in pieces:
            a.sendall(p)
        a.shutdown(socket.SHUT_WR)
        while True:
            obj = recv_frame(b)
            if obj is None:
                return out, None
            assert isinstance(obj, dict)
            out.append(obj)
    except ProtocolError as e:
        assert "\n" not in str(e)
        return out, "error"
    finally:
        a.close()
        b.close()


SUP_FRAMES = st.lists(st.one_of(
    json_values().map(lambda v: json.dumps(v).encode()).map(
        lambda d: struct.pack(">I", len(d)) + d),
    st.just(struct.pack(">I", len(DEEP)) + DEEP),
    st.just(struct.pack(">I", (1 << 20) + 1)),
    st.binary(max_size=10)), max_size=4).map(b"".join)


@given(SUP_FRAMES, st.data())
@example(struct.pack(">I", len(DEEP)) + DEEP, None)
def test_supervisor_frames_are_objects_or_protocol_error(data, draw):
    whole = supervisor_frames(data, [data])
    pieces = draw.draw(split_points(data)) if draw is not None else [data]
    assert supervisor_frames(data, pieces) == whole


@given(st.binary(max_size=300))
@example(b"exec")
@example(b"exec:12")
@example(b"py:99999999999999999999:x")
@example(b"OSError:ffffffffffffffff:x")
def test_child_fail_reports_parse_to_a_message(report):
    from corral.linux.supervise import ExecFailed, _exec_report, _fail_report

    message, code = _fail_report(report)
    assert isinstance(message, str) and (code is None or code > 0)
    if report.startswith(b"exec:"):
        assert isinstance(_exec_report(report), ExecFailed)


@given(st.lists(st.binary(max_size=3000), max_size=5), st.sampled_from([b"bwrap: ", b"x"]))
def test_held_line_passes_every_byte_and_holds_at_most_its_limit(chunks, prefix):
    from corral.linux.supervise import HeldLine, shebang_interpreter

    got = []
    h = HeldLine(got.append, prefix)
    for c in chunks:
        h.feed(c)
        assert len(h.held) <= HeldLine.LIMIT
    h.release()
    assert b"".join(got) == b"".join(chunks)
    for c in chunks:
        name = shebang_interpreter(c)
        assert name is None or (name and " " not in name and "\n" not in name)


# --- the run_code runner's channel (runtime/session.py <- guest/runner.py) --------------

def session_frames(pieces: list[bytes], max_frame: int = 4096):
    from corral.runtime.session import FrameReader, ProtocolError, check_message

    r = FrameReader(max_frame)
    out = []
    try:
        for p in pieces:
            for msg, n in r.feed(p):
                try:
                    kind = check_message(msg)
                except ProtocolError:
                    kind = "bad"
                out.append((kind, n))
            assert len(r.buf) <= 4 + max_frame + max(map(len, pieces), default=0)
    except ProtocolError as e:
        assert "\n" not in str(e)
        return out, "error"
    return out, None


RUNNER_MESSAGES = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["stdout", "stderr"]), "text": st.text()}),
    st.fixed_dictionaries({"type": st.just("display"), "id": st.integers(),
                           "data": st.dictionaries(st.sampled_from(
                               ["text/plain", "image/png", "application/json"]),
                               json_values(3), max_size=2), "main": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("end"), "id": st.integers(), "count": json_values(1)}),
    st.dictionaries(st.text(max_size=6), json_values(4), max_size=4))


@given(st.lists(st.one_of(RUNNER_MESSAGES.map(lambda m: ("msg", m)),
                          st.binary(max_size=16).map(lambda b: ("raw", b)),
                          st.just(("raw", struct.pack(">I", len(DEEP)) + DEEP))),
                max_size=5), st.data())
@example([("raw", struct.pack(">I", len(DEEP)) + DEEP)], None)
@example([("msg", {"type": "stdout", "text": "\ud800"})], None)   # print(chr(0xd800))
def test_runner_channel_split_anywhere(items, draw):
    from corral.guest.runner import frame

    data = b"".join(frame(x) if k == "msg" else x for k, x in items)
    whole = session_frames([data])
    pieces = draw.draw(split_points(data)) if draw is not None else [data]
    got = session_frames(pieces)
    # a feed that ends in an error raises: the frames before it in that feed are not
    # returned, so a finer cut may deliver more of them first; the error is the same
    assert got[1] == whole[1] and got[0][:len(whole[0])] == whole[0]
    if whole[1] is None:
        assert got == whole
    # what the runner encodes, the host reads back as it was
    msgs = [x for k, x in items if k == "msg"]
    if msgs and all(k == "msg" for k, _ in items):
        from corral.runtime.session import FrameReader
        assert whole[1] is None               # the host reads all the runner writes
        back = [m for m, _ in FrameReader(1 << 24).feed(data)]
        text = json.dumps(msgs, ensure_ascii=False).encode("utf-8", "replace")
        assert back == json.loads(text)       # lone surrogates as "?", the rest as sent


# --- the E2B Connect envelope (service/e2b/connect.py) ----------------------------------

@given(st.one_of(st.binary(max_size=60),
                 json_values().map(lambda v: json.dumps(v).encode()).map(
                     lambda d: struct.pack(">BI", 0, len(d)) + d),
                 st.builds(lambda f, n, d: struct.pack(">BI", f, n) + d,
                           st.integers(0, 255), st.integers(0, 2**32 - 1),
                           st.binary(max_size=20))))
@example(struct.pack(">BI", 0, len(DEEP)) + DEEP)
def test_connect_envelope_is_an_object_or_rpc_error(raw):
    from corral.service.e2b.connect import RpcError, unenvelope

    try:
        d = unenvelope(raw)
    except RpcError as e:
        assert e.code in ("invalid_argument", "unimplemented", "resource_exhausted")
        return
    assert isinstance(d, dict)


# --- the audit spool (audit/spool.py), ingested into a real SQLite store ----------------

def _record(i: int, **over) -> dict:
    d = {"id": f"run-{i}", "kind": "run", "sandbox": None, "started": 1.0, "ended": 2.0,
         "tier": "namespace", "image": "host", "image_digest": "", "policy_digest": "",
         "policy": "", "argv": ["true"], "verdict": "ok", "exit_code": 0, "signal": None,
         "usage": {}, "actor": "user:root", "face": "cli", "events": []}
    d.update(over)
    return d


HOSTILE_FIELDS = st.fixed_dictionaries({}, optional={
    "argv": st.lists(st.sampled_from(["\udcff", "\x00", "é", "a" * 100]), max_size=3),
    "policy": st.sampled_from(["\udcff", "x = 1", "\x00"]),
    "exit_code": st.sampled_from([0, -1, 2**63 - 1, 2**63, 10**30]),
    "started": st.sampled_from([0.0, 1e308, -1.0]),
    "sandbox": st.sampled_from([None, "\udcff", ""]),
    "events": st.lists(st.fixed_dictionaries({"kind": st.sampled_from(["limit", "\udcff"])},
                                             optional={"x": json_values(2)}), max_size=2),
    "usage": st.dictionaries(st.text(max_size=4), json_values(2), max_size=2),
})


@given(st.lists(st.one_of(
    st.tuples(st.just("good"), HOSTILE_FIELDS),
    st.tuples(st.just("raw"), st.binary(max_size=80)),
    st.tuples(st.just("raw"), st.just(DEEP))), min_size=1, max_size=6))
@example([("good", {"exit_code": 10**30}), ("good", {})])
@example([("good", {"policy": "\udcff"}), ("good", {})])
def test_spool_ingest_takes_good_lines_and_skips_the_rest(lines):
    from corral.audit import spool, store

    top = tempfile.mkdtemp(prefix="corral-fuzz-spool-")
    try:
        os.makedirs(os.path.join(top, "spool"), mode=0o700)
        body = b""
        for i, (kind, x) in enumerate(lines):
            if kind == "good":
                body += spool.dumps(_record(i, **x)).encode("ascii") + b"\n"
            else:
                body += x.replace(b"\n", b" ") + b"\n"
        with open(os.path.join(top, "spool", spool.SPOOL_NAME), "wb") as f:
            f.write(body)
        conn = store.connect(os.path.join(top, "audit.db"), spool=False)
        try:
            got = spool.ingest(conn, top)
            assert got["runs"] + got["skipped"] == len(lines)
            assert not os.path.exists(os.path.join(top, "spool", spool.SPOOL_NAME))
            (n,) = conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            assert n == got["runs"]
        finally:
            conn.close()
    finally:
        import shutil

        shutil.rmtree(top)
