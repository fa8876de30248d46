"""corral's persistent Python interpreter, run inside a sandbox (one per code context).

Standard library only, python3 >= 3.8, no corral: the host passes this whole file as
`python3 -c SOURCE MAX_FRAME CWD` (see corral.runtime.session), so nothing of it lives in
the sandbox's filesystem where sandboxed code could replace it between runs, and it works
on any image with a python3.

Wire: every message either way is one frame, a 4-byte big-endian length then that many
bytes of a UTF-8 JSON object with a "type". The host bounds, parses and checks every frame
(this process runs the user's code, so the host trusts nothing it says beyond "this is the
cell's output"); the runner keeps its own frames under MAX_FRAME so an honest runner never
trips the host's bound.

  host -> runner   {"type": "exec", "id": N, "code": "...", "timeout": MS, "env": {...}?}
                   {"type": "interrupt", "id": N}          (KeyboardInterrupt in cell N)
  runner -> host   {"type": "ready", "version": 1, "python": "3.11.2"}
                   {"type": "stdout" | "stderr", "text": "..."}
                   {"type": "display", "id": N, "data": {mime: value}, "main": bool}
                   {"type": "error", "id": N, "name": ..., "value": ..., "traceback": [...]}
                   {"type": "end", "id": N, "count": EXECUTION_COUNT}
                   {"type": "fatal", "message": "..."}     (could not start; then exits)

File descriptors: the frames go out on a private duplicate of the original stdout and come
in on a private duplicate of the original stdin. fd 0 becomes /dev/null; fds 1 and 2
become pipes this process reads (a pump thread, and the main thread at the end of every
cell), so print(), os.write(1, ...) and a subprocess's output all come back as the cell's
stdout/stderr and never as protocol bytes.

Interrupt: SIGINT (from the host, or in-band: the stdin thread turns an "interrupt" frame
into pthread_kill(main, SIGINT)) raises KeyboardInterrupt in the cell, which becomes its
error; while the runner itself writes a frame the interrupt is held until the write is done,
so a frame is never cut in half. EOF on the frame stream ends the process at once.
"""

import ast
import base64
import codecs
import io
import json
import linecache
import os
import queue
import select
import signal
import struct
import sys
import threading
import traceback

VERSION = 1
HEADER = struct.Struct(">I")
CHUNK = 65536
_exit = os._exit          # kept: user code replacing os._exit must not keep us alive
_write = os.write
_read = os.read

MIME_REPRS = (            # Jupyter's display formats, IPython's method names
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
    ("application/pdf", "_repr_pdf_"),
)
BINARY = {"image/png", "image/jpeg", "application/pdf"}   # sent base64, as Jupyter does


class State:
    max_frame = 16 << 20
    out_fd = -1            # the frame stream out (the original stdout)
    in_fd = -1             # the frame stream in (the original stdin)
    lock = threading.RLock()   # one frame at a time on out_fd; held to drain the pipes
    main = 0               # the main thread's ident
    cell = 0               # the id of the cell running now, 0 between cells
    count = 0              # execution count
    protected = False      # the main thread is writing a frame: hold SIGINT
    pending = False        # a SIGINT came while protected
    pipes = ()             # ((read_fd, "stdout", decoder), (read_fd, "stderr", decoder))
    streams = ()           # our sys.stdout, sys.stderr objects
    loop = None            # the asyncio loop for top-level await, made on first use
    shown = set()          # ids of figures shown in this cell (not shown again at its end)


def frame(msg):
    # a lone surrogate (an exception's message, a repr made by user code) becomes "?":
    # the host reads strict UTF-8 and ended the context on one (tests/fuzz found it)
    data = json.dumps(msg, ensure_ascii=False, separators=(",", ":"),
                      default=str).encode("utf-8", "replace")
    return HEADER.pack(len(data)) + data


def _write_all(data):
    view = memoryview(data)
    while view:
        n = _write(State.out_fd, view)
        view = view[n:]


def emit(msg):
    """Send one frame. From the main thread, a SIGINT during the write is held and raised
    as KeyboardInterrupt once the frame is complete."""
    data = frame(msg)
    if len(data) - HEADER.size > State.max_frame:
        data = frame({"type": "stderr", "text": "corral: a %s message of %d bytes is over "
                      "the %d byte frame limit and was dropped\n"
                      % (msg.get("type"), len(data), State.max_frame)})
    if threading.get_ident() != State.main:
        with State.lock:
            _write_all(data)
        return
    held = State.protected
    State.protected = True
    try:
        with State.lock:
            _write_all(data)
    finally:
        State.protected = held
    if not held and State.pending:
        State.pending = False
        raise KeyboardInterrupt


def on_sigint(signum, frame_):
    if State.protected or not State.cell:
        State.pending = bool(State.cell)
        return
    raise KeyboardInterrupt


# --- output capture: fds 1 and 2 are pipes we read ------------------------------------

def drain(limit=None):
    """Read whatever the stdout/stderr pipes hold now and send it as frames. Called with
    SIGINT blocked (the pump thread) or held (the main thread)."""
    for fd, name, dec in State.pipes:
        got = 0
        while limit is None or got < limit:
            try:
                b = _read(fd, CHUNK)
            except BlockingIOError:
                break
            except OSError:
                break
            if not b:
                break
            got += len(b)
            text = dec.decode(b)
            if text:
                emit({"type": name, "text": text})


def pump():
    """The pump thread: output the cell's processes write to fds 1 and 2 goes out as it
    comes, read and sent under the frame lock so the main thread's end frame can never
    overtake output read before it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    poller = select.poll()
    names = {}
    for fd, name, dec in State.pipes:
        poller.register(fd, select.POLLIN)
        names[fd] = (name, dec)
    while True:
        for fd, ev in poller.poll():
            if ev & select.POLLIN:
                with State.lock:
                    try:
                        b = _read(fd, CHUNK)
                    except OSError:
                        b = None
                    if b:
                        text = names[fd][1].decode(b)
                        if text:
                            emit({"type": names[fd][0], "text": text})
            elif ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                poller.unregister(fd)   # the cell closed its fd 1 or 2


def flush_output():
    """End of a cell (or before a display): everything the cell wrote so far goes out
    before the next frame."""
    for s in State.streams:
        try:
            s.flush()
        except Exception:
            pass
    held = State.protected
    State.protected = True
    try:
        with State.lock:
            drain()
    finally:
        State.protected = held


# --- display -----------------------------------------------------------------------------

def _is_figure(obj):
    t = type(obj)
    return t.__module__.startswith("matplotlib") and t.__name__ == "Figure"


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _warn(what):
    sys.stderr.write("corral: %s failed: %s\n" % (what, traceback.format_exc(limit=-1)
                                                     .strip().splitlines()[-1]))


def bundle(obj):
    """Jupyter's mime bundle for obj: text/plain (repr) plus every rich format it has."""
    data = {}
    try:
        data["text/plain"] = repr(obj)
    except Exception:
        data["text/plain"] = "<%s object (repr failed)>" % type(obj).__name__
        _warn("repr()")
    if isinstance(obj, type):          # a class: its _repr_*_ are unbound functions
        return data
    if _is_figure(obj):
        try:
            data["image/png"] = _figure_png(obj)
            State.shown.add(id(obj))
        except Exception:
            _warn("savefig")
        return data
    mb = getattr(obj, "_repr_mimebundle_", None)
    if callable(mb):
        try:
            got = mb()
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                for k, v in got.items():
                    if isinstance(k, str) and v is not None:
                        data[k] = v
        except Exception:
            _warn("_repr_mimebundle_()")
    for mime, name in MIME_REPRS:
        if mime in data:
            continue
        m = getattr(obj, name, None)
        if not callable(m):
            continue
        try:
            v = m()
        except Exception:
            _warn(name + "()")
            continue
        if isinstance(v, tuple):     # (data, metadata)
            v = v[0]
        if v is None:
            continue
        data[mime] = v
    for mime in BINARY:
        v = data.get(mime)
        if isinstance(v, (bytes, bytearray, memoryview)):
            data[mime] = base64.b64encode(bytes(v)).decode("ascii")
    for mime, v in list(data.items()):
        if mime == "application/json":
            try:
                json.dumps(v)
            except Exception:
                del data[mime]
                _warn("application/json")
        elif not isinstance(v, str):
            del data[mime]
    return data


def show(obj, main=False):
    if not State.cell:                 # a thread of the cell's, after the cell ended
        return
    flush_output()
    emit({"type": "display", "id": State.cell, "data": bundle(obj), "main": main})


def display(*objs, raw=False, **_ignored):
    """IPython's display(): each object as a display result (raw=True: objs are bundles)."""
    for obj in objs:
        if raw and isinstance(obj, dict) and State.cell:
            flush_output()
            emit({"type": "display", "id": State.cell, "main": False,
                  "data": {k: v for k, v in obj.items() if isinstance(k, str)}})
        else:
            show(obj)


def flush_figures():
    """Every open matplotlib figure as image/png, then closed: plots come back without a
    second show(). Only if the cell's code imported pyplot."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = list(plt.get_fignums())
    except Exception:
        return
    for num in nums:
        try:
            fig = plt.figure(num)
            if id(fig) not in State.shown:
                flush_output()
                emit({"type": "display", "id": State.cell, "main": False,
                      "data": {"text/plain": repr(fig), "image/png": _figure_png(fig)}})
        except KeyboardInterrupt:
            raise
        except Exception:
            _warn("figure %s" % num)
    try:
        plt.close("all")
    except Exception:
        pass


def _show_figures(*args, **kwargs):
    """pyplot.show() in a sandbox: send the open figures now."""
    flush_figures()


class PyplotHook:
    """Replaces pyplot.show once pyplot is imported (the Agg backend would only warn)."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        real = spec.loader

        class Loader:
            def create_module(self, spec_):
                return real.create_module(spec_)

            def exec_module(self, module):
                real.exec_module(module)
                module.show = _show_figures

        spec.loader = Loader()
        return spec


# --- cells -----------------------------------------------------------------------------

def _flags():
    return getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)


def _run(co, ns):
    r = eval(co, ns)
    if co.co_flags & 0x80:            # CO_COROUTINE: the cell used top-level await
        import asyncio

        if State.loop is None:
            State.loop = asyncio.new_event_loop()
        r = State.loop.run_until_complete(r)
    return r


RUNNER_FILE = "<corral-runner>"     # the host compiles this file under that name


def _trim(te):
    """Drop the runner's own frames from a TracebackException and its chain: those before
    the cell's first frame, and any after (the SIGINT handler's)."""
    seen = set()
    while te is not None and id(te) not in seen:
        seen.add(id(te))
        frames = list(te.stack)
        while frames and not frames[0].filename.startswith("<cell-"):
            del frames[0]              # the runner's (and ast's, for a parse error)
        te.stack = traceback.StackSummary.from_list(
            [f for f in frames if f.filename != RUNNER_FILE])
        for other in (te.__cause__, te.__context__):
            if other is not None:
                _trim(other)
        te = None


def _cell_traceback(e):
    te = traceback.TracebackException(type(e), e, e.__traceback__)
    _trim(te)
    lines = list(te.format())
    if not te.stack and lines and lines[0].startswith("Traceback"):
        lines = lines[1:]              # a SyntaxError in the cell: no frame of its own
    return lines


def _exec_cell(code, filename, ns):
    tree = ast.parse(code, filename, "exec")
    last = None
    if (tree.body and isinstance(tree.body[-1], ast.Expr)
            and not code.rstrip().endswith(";")):
        last = ast.Expression(tree.body.pop().value)
    _run(compile(tree, filename, "exec", _flags()), ns)
    if last is not None:
        value = _run(compile(last, filename, "eval", _flags()), ns)
        if value is not None:
            ns["_"] = value
            show(value, main=True)


def _report(cid, e):
    """The cell's exception as its error frame (SystemExit and KeyboardInterrupt too)."""
    State.protected = True
    try:
        lines = _cell_traceback(e)
    except Exception:
        lines = ["%s: (traceback failed)\n" % type(e).__name__]
    try:
        value = str(e)
    except Exception:
        value = "(str() failed)"
    flush_output()
    emit({"type": "error", "id": cid, "name": type(e).__name__, "value": value,
          "traceback": lines})
    State.protected = False


def run_cell(cid, code, ns):
    State.count += 1
    State.shown = set()
    filename = "<cell-%d>" % State.count
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    State.pending = False
    State.cell = cid                  # from here a SIGINT raises KeyboardInterrupt
    try:
        try:
            _exec_cell(code, filename, ns)
        except BaseException as e:
            _report(cid, e)
        try:
            flush_figures()           # after an error too, as a notebook does
        except BaseException as e:
            _report(cid, e)
    except BaseException as e:        # an interrupt in the gaps between the above
        _report(cid, e)
    finally:
        State.protected = True        # from here a SIGINT is dropped
        State.cell = 0
        State.pending = False
        for s in State.streams:
            try:
                s.flush()
            except Exception:
                pass
        with State.lock:
            drain()
            emit({"type": "end", "id": cid, "count": State.count})
        State.protected = False


# --- start-up ----------------------------------------------------------------------------

def read_exact(fd, n):
    parts, got = [], 0
    while got < n:
        b = _read(fd, min(n - got, 1 << 20))
        if not b:
            return None
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def reader(requests):
    """The stdin thread: frames in; an interrupt is acted on at once, the rest queued."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        while True:
            head = read_exact(State.in_fd, HEADER.size)
            if head is None:
                break
            (n,) = HEADER.unpack(head)
            body = read_exact(State.in_fd, n)
            if body is None:
                break
            msg = json.loads(body.decode("utf-8"))
            if msg.get("type") == "interrupt":
                if msg.get("id") == State.cell and State.cell:
                    signal.pthread_kill(State.main, signal.SIGINT)
            else:
                requests.put(msg)
    except BaseException:
        pass
    _exit(0)                          # the host closed the stream (or sent nonsense): done


def setup(max_frame, cwd):
    State.max_frame = max_frame
    State.main = threading.get_ident()
    State.out_fd = os.dup(1)          # non-inheritable: subprocesses never get the stream
    State.in_fd = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    pipes = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)                # inheritable: a subprocess's output is the cell's
        os.close(w)
        os.set_blocking(r, False)
        pipes.append((r, name, codecs.getincrementaldecoder("utf-8")("replace")))
    State.pipes = tuple(pipes)
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                           errors="backslashreplace", line_buffering=True)
    err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                           errors="backslashreplace", line_buffering=True)
    sys.stdout, sys.stderr, sys.stdin = out, err, open(os.devnull)
    sys.__stdout__, sys.__stderr__ = out, err
    State.streams = (out, err)
    if cwd:
        os.chdir(cwd)
    os.environ.setdefault("MPLBACKEND", "Agg")   # headless: plots are sent as PNG
    sys.meta_path.insert(0, PyplotHook())
    signal.signal(signal.SIGINT, on_sigint)


def user_namespace():
    """A fresh __main__ for the cells (pickling a class defined in a cell works)."""
    import builtins
    import types

    mod = types.ModuleType("__main__")
    mod.__dict__["__builtins__"] = builtins
    mod.__dict__["display"] = display
    builtins.display = display
    sys.modules["__main__"] = mod
    if sys.path and sys.path[0] != "":
        sys.path.insert(0, "")            # the cwd is importable, as in a notebook
    return mod.__dict__


def set_env(env):
    """A cell's own environment variables (run_code(envs=)): set now, and what they were
    before (None: unset), for restore_env after the cell."""
    saved = {}
    for k, v in (env or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = v
    return saved


def restore_env(saved):
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def main(argv):
    try:
        setup(int(argv[1]) if len(argv) > 1 else State.max_frame,
              argv[2] if len(argv) > 2 else "")
    except Exception as e:
        if State.out_fd < 0:
            State.out_fd = 1
        emit({"type": "fatal", "message": "%s: %s" % (type(e).__name__, e)})
        _exit(1)
    del sys.argv[1:]                  # the cells see sys.argv == ["-c"], not our source
    ns = user_namespace()
    requests = queue.SimpleQueue()
    threading.Thread(target=reader, args=(requests,), daemon=True).start()
    threading.Thread(target=pump, daemon=True).start()
    State.protected = True
    emit({"type": "ready", "version": VERSION, "python": "%d.%d.%d" % sys.version_info[:3]})
    while True:
        try:
            msg = requests.get()
        except KeyboardInterrupt:
            continue
        if msg.get("type") == "exec":
            saved = set_env(msg.get("env"))
            try:
                run_cell(int(msg["id"]), str(msg["code"]), ns)
            finally:
                restore_env(saved)


if __name__ == "__main__":
    main(sys.argv[1:] if sys.argv[:1] == ["-c"] else sys.argv)
