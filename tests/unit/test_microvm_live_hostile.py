"""The live microvm sandbox's host side against a hostile guest, at the unit level: the
guest's end of the control channel is one end of a socketpair this test holds."""

import socket
import struct
import threading

import pytest

from corral.backends import microvm
from corral.backends.microvm import MicrovmSandbox, frame
from corral.backends.microvm_live import GuestCommand, MicrovmLive


def _bare(sock) -> MicrovmLive:
    live = object.__new__(MicrovmLive)
    live.sock, live.send_lock, live.lock = sock, threading.Lock(), threading.Lock()
    live.cmds, live.end_events, live.dead, live.proc = {}, [], None, None
    return live


def test_deeply_nested_start_frame_is_a_violation_not_a_traceback():
    host, guest = socket.socketpair()
    try:
        live = _bare(host)
        cmd = GuestCommand(live, 1, 10.0)
        live.cmds[1] = cmd
        with pytest.raises(ValueError):
            live._frame(b"p", struct.pack(">I", 1) + b"[" * 60000 + b"]" * 4)
    finally:
        host.close()
        guest.close()


def test_guest_that_stops_reading_cannot_block_a_kill(monkeypatch):
    """The guest never reads its control port: a kill (a command's timeout) must not block
    the host's thread forever; the VM is ended with an event."""
    monkeypatch.setattr(microvm, "SEND_TIMEOUT", 0.5)
    host, guest = socket.socketpair()
    try:
        host.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        live = _bare(host)
        cmd = GuestCommand(live, 1, 10.0)
        live.cmds[1] = cmd
        done = threading.Event()

        def flood_then_kill():
            for _ in range(64):          # the guest's buffer fills: it reads nothing
                live._send(frame(b"i", cmd.idb + b"x" * 60000))
                if live.dead:
                    break
            cmd.kill_all()
            done.set()

        threading.Thread(target=flood_then_kill, daemon=True).start()
        assert done.wait(10), "the host's thread blocked on a guest that stopped reading"
        assert live.dead
        assert any("stopped reading" in e["message"] for e in live.end_events)
    finally:
        host.close()
        guest.close()


def test_deeply_nested_files_answer_is_a_files_error():
    """sb.files on microvm parses the guest helper's JSON: nesting is the guest's to choose."""
    from corral.runtime.files import FilesError
    from corral.runtime.guest_files import GuestFiles

    with pytest.raises(FilesError):
        GuestFiles._answer(b"[" * 100000 + b"]" * 100000, "/x")


def test_one_shot_send_is_bounded_when_the_guest_stops_reading(monkeypatch):
    """The one-shot path's sends (a command's start, stdin, the kill at its timeout) share
    the bound: a guest that reads nothing ends the VM, the sender returns."""
    monkeypatch.setattr(microvm, "SEND_TIMEOUT", 0.5)
    host, guest = socket.socketpair()
    try:
        host.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sb = object.__new__(MicrovmSandbox)
        sb.sock, sb.send_lock, sb.end_events, sb.dead, sb.proc = (
            host, threading.Lock(), [], None, None)
        done = threading.Event()

        def flood():
            for _ in range(64):
                sb._send(frame(b"I", b"x" * 60000))
            sb._send(frame(b"K"))
            done.set()

        threading.Thread(target=flood, daemon=True).start()
        assert done.wait(10), "the host's thread blocked on a guest that stopped reading"
        assert sb.dead and "stopped reading" in sb.end_events[0]["message"]
    finally:
        host.close()
        guest.close()


def test_the_list_helper_s_answer_is_parsed_a_line_at_a_time(tmp_path):
    """The helper the guest runs for sb.files.list (here on this host's python3, over a
    directory of the test's): one entry a line, read back whole."""
    import subprocess

    from corral.runtime.guest_files import HELPER, GuestFiles

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a, \u00e9\n.txt").write_text("x")
    (tmp_path / "l").symlink_to("/nowhere")
    p = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", HELPER, "list", str(tmp_path),
                        "2", "100"], capture_output=True, check=True)
    got = GuestFiles._entries(p.stdout, 100, str(tmp_path))
    assert sorted((e.name, e.type) for e in got) == [
        ("a, \u00e9\n.txt", "file"), ("d", "dir"), ("l", "symlink")]
    assert [e.symlink_target for e in got if e.type == "symlink"] == ["/nowhere"]
    with pytest.raises(Exception, match="more than 2 entries"):
        GuestFiles._entries(p.stdout, 2, str(tmp_path))


def test_a_listing_is_bounded_and_counted_before_it_is_parsed():
    """The guest is hostile: its listing's lines are counted (against caps.entries) and
    each line's size checked before any JSON is parsed, and the whole answer is bounded
    by caps.entries, far below the 64 MiB it once could send."""
    from corral.runtime import guest_files
    from corral.runtime.files import Caps, FilesError
    from corral.runtime.guest_files import GuestFiles

    with pytest.raises(FilesError, match="more than 3 entries"):     # not "not JSON"
        GuestFiles._entries(b"[[[[\n" * 4, 3, "/x")
    with pytest.raises(FilesError, match="an entry over"):
        GuestFiles._entries(b"[" * (guest_files.LINE_MAX + 1) + b"\n", 3, "/x")
    with pytest.raises(FilesError, match="cut short"):
        GuestFiles._entries(b'["a", "/a", "file", 1, 420, 0, null]', 3, "/x")

    class Guest:
        """sb.commands as a guest that answers a listing without end."""

        def __init__(self):
            self.commands, self.sent = self, 0

        def run(self, argv, stdin=None, on_stdout=None, timeout=None):
            line = b'["a", "/a", "file", 1, 420, 0, null]\n'
            for _ in range(4096):                    # 64 MiB in all, 16 KiB at a time
                on_stdout(line * 420)
                self.sent += len(line) * 420
            return type("R", (), {"exit_code": 0, "verdict": "ok", "stderr": ""})()

    g = Guest()
    files = GuestFiles(g, caps=Caps(entries=100))
    limit = guest_files.LINE_MAX + 100 * guest_files.LIST_ENTRY_BYTES
    with pytest.raises(FilesError, match=f"over {limit} bytes"):
        files.list("/")
