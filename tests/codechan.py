"""A code-context Channel that runs the interpreter as a plain host process (no sandbox).

For tests of the guest runners themselves on interpreters the sandbox does not have
(python 3.8, a python with matplotlib) and of the SIGINT path a live sandbox's channel
will take. Never a product transport: the code runs unsandboxed.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time

from corral.runtime.session import Channel


class LocalChannel(Channel):
    def __init__(self, argv, on_stdout, on_stderr, on_exit) -> None:
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        os.set_blocking(self.p.stdin.fileno(), False)
        self.signals = 0

        def pump(f, cb):
            while True:
                b = os.read(f.fileno(), 65536)
                if not b:
                    return
                cb(b)

        ts = [threading.Thread(target=pump, args=(self.p.stdout, on_stdout), daemon=True),
              threading.Thread(target=pump, args=(self.p.stderr, on_stderr), daemon=True)]
        for t in ts:
            t.start()

        def wait():
            rc = self.p.wait()
            for t in ts:
                t.join()
            for f in (self.p.stdin, self.p.stdout, self.p.stderr):
                try:
                    f.close()
                except OSError:
                    pass
            on_exit(f"exited with status {rc}")

        threading.Thread(target=wait, daemon=True).start()

    def send(self, data: bytes, deadline: float) -> None:
        if self.p.stdin.closed:
            raise BrokenPipeError("closed")
        fd = self.p.stdin.fileno()
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except ValueError:
                raise BrokenPipeError("closed") from None
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError("not reading") from None
                select.select([], [fd], [], 0.5)

    def interrupt(self) -> bool:
        self.signals += 1
        self.p.send_signal(signal.SIGINT)
        return True

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()


def local_start(python: str):
    """A CodeSession start function running python contexts with `python`."""
    made = []

    def start(argv, o, e, x):
        if argv[0] == "python3":
            argv = [python, *argv[1:]]
        ch = LocalChannel(argv, o, e, x)
        made.append(ch)
        return ch

    start.made = made
    return start
