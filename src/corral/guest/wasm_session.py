"""run_code's interpreter on the wasm tier: corral's runner (guest/runner.py) without the
threads, pipes and signals that CPython for WASI does not have.

The wasm tier runs this in place of runner.py's boot when the session asks for the python
runner (`python3 -c BOOT RUNNER_SOURCE MAX_FRAME CWD`): the runner's source still comes in
as argv[1] and is executed as a module of its own, so cells, display data, tracebacks and
the wire are runner.py's own; only its start-up and main loop are replaced here.
Variables, imports and the working directory persist between cells, as on the other
tiers: the WASI instance lives for the context's life, reading cells from stdin. Standard
library only, nothing of corral.

Differences, all of them WASI's: the cell's output is what it writes to sys.stdout and
sys.stderr, sent as frames line by line (fd 1 is the frame stream itself, with no
dup() or pipe() to move it: a cell that writes to fd 1 directly breaks the stream, and the
host closes the context); frames are read only between cells, so an "interrupt" cannot stop
a running cell (the host's kill after its grace does, by closing stdin).
"""

import io
import os
import sys
import types

BUFFER = 1 << 16


class FrameStream(io.TextIOBase):
    """sys.stdout / sys.stderr of the cells: every write is one stdout/stderr frame."""

    def __init__(self, runner, name):
        self.runner, self.name = runner, name
        self.buf = ""

    def writable(self):
        return True

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        self.buf += s
        if "\n" in s or len(self.buf) >= BUFFER:   # line-buffered, as runner.py's streams
            cut = self.buf.rfind("\n") + 1 or len(self.buf)
            text, self.buf = self.buf[:cut], self.buf[cut:]
            self.runner.emit({"type": self.name, "text": text})
        return len(s)

    def flush(self):
        if self.buf:
            text, self.buf = self.buf, ""
            self.runner.emit({"type": self.name, "text": text})

    @property
    def encoding(self):
        return "utf-8"


def load(source):
    mod = types.ModuleType("corral_runner")
    mod.__dict__["__name__"] = "corral_runner"
    exec(compile(source, "<corral-runner>", "exec"), mod.__dict__)
    return mod


def main(argv):
    # argv: [RUNNER_SOURCE, MAX_FRAME, CWD] after python3 -c's own "-c"
    r = load(argv[0])
    st = r.State
    st.max_frame = int(argv[1]) if len(argv) > 1 else st.max_frame
    st.out_fd, st.in_fd = 1, 0
    st.pipes = ()
    try:
        out, err = FrameStream(r, "stdout"), FrameStream(r, "stderr")
        sys.stdout, sys.stderr, sys.stdin = out, err, io.StringIO("")
        sys.__stdout__, sys.__stderr__ = out, err
        st.streams = (out, err)
        if len(argv) > 2 and argv[2]:
            os.chdir(argv[2])
        os.environ.setdefault("MPLBACKEND", "Agg")
        sys.meta_path.insert(0, r.PyplotHook())
        st.main = r.threading.get_ident()
    except Exception as e:
        r.emit({"type": "fatal", "message": "%s: %s" % (type(e).__name__, e)})
        r._exit(1)
    del sys.argv[1:]
    ns = r.user_namespace()
    st.protected = True
    r.emit({"type": "ready", "version": r.VERSION,
            "python": "%d.%d.%d" % sys.version_info[:3]})
    while True:
        head = r.read_exact(st.in_fd, r.HEADER.size)
        if head is None:
            break
        (n,) = r.HEADER.unpack(head)
        body = r.read_exact(st.in_fd, n)
        if body is None:
            break
        try:
            msg = r.json.loads(body.decode("utf-8"))
        except ValueError:
            break
        if isinstance(msg, dict) and msg.get("type") == "exec":
            r.run_cell(int(msg["id"]), str(msg["code"]), ns)
    r._exit(0)


main(sys.argv[1:])
