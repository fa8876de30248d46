"""A detached sandbox's supervisor that dies mid-call (runtime/remote.py): the client sees
SandboxClosed (kill() of a gone sandbox is a no-op), never a raw ConnectionResetError.
A real unix socket whose holder accepts a call and closes without reading it: the kernel
resets the caller's connection, as when the supervisor is SIGKILLed between accept and
answer (seen in CI: tests/linux/test_seccomp_notify.py's holder test)."""

from __future__ import annotations

import socket
import threading

import pytest

from corral.errors import SandboxClosed
from corral.runtime.remote import RemoteSandbox


@pytest.fixture
def dying_supervisor(tmp_path):
    path = str(tmp_path / "sock")
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(path)
    lst.listen(4)
    stop = threading.Event()

    def serve():
        lst.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = lst.accept()
            except TimeoutError:
                continue
            conn.recv(1)           # part of the request read, the rest left unread:
            conn.close()           # closing with unread data resets the caller

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    sb = object.__new__(RemoteSandbox)   # no registry entry: the socket is all it uses here
    sb.id, sb._socket = "0123456789ab", path
    yield sb
    stop.set()
    t.join()
    lst.close()


def test_a_reset_mid_call_is_sandbox_closed(dying_supervisor):
    with pytest.raises(SandboxClosed):
        dying_supervisor.get_info()


def test_kill_of_a_supervisor_dying_mid_call_is_a_no_op(dying_supervisor):
    assert dying_supervisor.kill() == []
