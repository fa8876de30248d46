"""atheris target: the supervisor's frames (runtime/supervisor.py recv_frame, over a real
socketpair) and the child's failure reports (linux/supervise.py). Objects or
ProtocolError; a report always parses to a message."""

import socket

from _common import run

from corral.linux.supervise import ExecFailed, _exec_report, _fail_report
from corral.runtime.supervisor import ProtocolError, recv_frame


def one_input(data: bytes) -> None:
    a, b = socket.socketpair()
    try:
        a.sendall(data[:200000])
        a.shutdown(socket.SHUT_WR)
        while True:
            try:
                obj = recv_frame(b)
            except ProtocolError:
                break
            if obj is None:
                break
            assert isinstance(obj, dict)
    finally:
        a.close()
        b.close()
    message, code = _fail_report(data)
    assert isinstance(message, str)
    assert isinstance(_exec_report(b"exec:" + data), ExecFailed)


if __name__ == "__main__":
    run(one_input)
