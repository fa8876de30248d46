"""corral's bridge to an IPython kernel, run inside a sandbox whose python has ipykernel.

The host starts it as it starts runner.py (`python3 -c BOOT RUNNER MAX_FRAME CWD ENGINE
KERNEL`, see corral.runtime.session): BOOT runs this file when the image's python can
import ipykernel and jupyter_client, else runner.py. It speaks runner.py's wire to the
host (the same frames, the same message types; "ready" carries {"kernel": VERSION}) and
Jupyter's to the kernel, which it starts as its own child.

No network: the kernel's five ZMQ sockets are unix sockets (transport "ipc") in a private
directory (mode 0700) under the sandbox's /tmp, signed with a random key in a 0600
connection file: nothing listens on any TCP port, inside the sandbox or out, and only the
sandbox's own uid can reach them. The host reaches the kernel only through this process's
stdin and stdout.

Standard library here, plus what ipykernel itself needs (jupyter_client, pyzmq), from the
image. The host trusts nothing this process says beyond "this is the cell's output": the
kernel runs the user's code as the sandbox's root and can replace it.

  host -> bridge   {"type": "exec", "id": N, "code": "...", "timeout": MS, "env": {...}?}
                   {"type": "interrupt", "id": N}      (SIGINT to the kernel; so is a
                                                        SIGINT to this process in a cell)
  bridge -> host   as runner.py; iopub's stream -> stdout/stderr, display_data and
                   update_display_data -> display, execute_result -> display (main),
                   error -> error (ANSI colours stripped), the cell's end after the
                   kernel's status goes idle -> end (count: execute_input's)

If the kernel dies the bridge writes why to its stderr and exits 3: the host closes the
context with that message. If it cannot start (engine "auto"), the bridge says so on its
stderr and runs corral's runner (argv's RUNNER) in its place.
"""

import json
import os
import queue
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

VERSION = 1
HEADER = struct.Struct(">I")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BINARY = ("image/png", "image/jpeg", "application/pdf")
_write = os.write
_exit = os._exit


class State:
    max_frame = 16 << 20
    out_fd = 1
    lock = threading.Lock()
    cell = 0
    kernel = None        # the kernel's Popen
    tail = b""           # the kernel's own stderr, its last 4 KiB
    private = ""         # the kernel's directory: connection file, sockets
    starting = True      # until the kernel is ready


def emit(msg):
    data = json.dumps(msg, ensure_ascii=False, separators=(",", ":"),
                      default=str).encode("utf-8", "replace")   # lone surrogate: "?"
    if len(data) > State.max_frame:
        data = json.dumps({"type": "stderr", "text": "corral: a %s message of %d bytes is "
                           "over the %d byte frame limit and was dropped\n"
                           % (msg.get("type"), len(data), State.max_frame)}).encode()
    data = HEADER.pack(len(data)) + data
    with State.lock:
        view = memoryview(data)
        while view:
            view = view[_write(State.out_fd, view):]


def die(why, code=3):
    tail = State.tail.decode("utf-8", "replace").strip().splitlines()
    last = (": " + tail[-1][:300]) if tail else ""
    if State.starting:       # main() says so (or falls back to the runner)
        raise RuntimeError("the IPython kernel %s%s" % (why, last))
    os.write(2, ("corral: the IPython kernel %s%s\n" % (why, last)).encode())
    k = State.kernel
    if k is not None and k.poll() is None:
        k.kill()
    _exit(code)


def clean_bundle(data):
    """A display bundle as the host takes it: str values (base64 without whitespace for
    binary types), any JSON for application/json, other JSON types as JSON text."""
    out = {}
    if not isinstance(data, dict):
        return out
    for mime, v in data.items():
        if not isinstance(mime, str):
            continue
        if mime == "application/json":
            out[mime] = v
        elif mime in BINARY and isinstance(v, str):
            out[mime] = "".join(v.split())
        elif isinstance(v, str):
            out[mime] = v
        else:
            out[mime] = json.dumps(v, default=str)
    return out


def read_exact(fd, n):
    parts, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            return None
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def reader(in_fd, requests):
    """Frames from the host; an interrupt is acted on at once (SIGINT to the kernel)."""
    try:
        while True:
            head = read_exact(in_fd, HEADER.size)
            if head is None:
                break
            (n,) = HEADER.unpack(head)
            body = read_exact(in_fd, n)
            if body is None:
                break
            msg = json.loads(body.decode("utf-8"))
            if msg.get("type") == "interrupt":
                if msg.get("id") == State.cell and State.cell and State.kernel:
                    os.kill(State.kernel.pid, signal.SIGINT)
            else:
                requests.put(msg)
    except BaseException:
        pass
    k = State.kernel
    if k is not None and k.poll() is None:
        k.kill()
        k.wait()
    if State.private:
        import shutil

        shutil.rmtree(State.private, ignore_errors=True)
    _exit(0)


def on_sigint(signum, frame_):
    """A SIGINT from the host (an interrupt) is the running cell's: the kernel's."""
    k = State.kernel
    if State.cell and k is not None and k.poll() is None:
        os.kill(k.pid, signal.SIGINT)


def keep_tail(f):
    while True:
        b = f.read1(4096) if hasattr(f, "read1") else f.read(4096)
        if not b:
            return
        State.tail = (State.tail + b)[-4096:]


def start_kernel(cwd):
    from jupyter_client.blocking import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    private = tempfile.mkdtemp(prefix="corral-k-")    # 0700, in $TMPDIR or /tmp
    if len(private) > 90:                             # a unix socket's path: < 108 bytes
        os.rmdir(private)
        private = tempfile.mkdtemp(prefix="corral-k-", dir="/tmp")
    os.chmod(private, 0o700)
    State.private = private
    env = dict(os.environ)
    for name in ("JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR",
                 "IPYTHONDIR"):
        env[name] = private
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env.pop("MPLBACKEND", None)                  # the kernel's own: inline figures
    conn = os.path.join(private, "kernel.json")
    write_connection_file(conn, transport="ipc", ip=os.path.join(private, "k"))
    os.chmod(conn, 0o600)
    k = subprocess.Popen(
        [sys.executable, "-m", "ipykernel_launcher", "-f", conn, "--quiet",
         "--IPKernelApp.parent_handle=%d" % os.getpid()],   # it ends when we do
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=cwd or None, env=env, start_new_session=False)
    State.kernel = k
    threading.Thread(target=keep_tail, args=(k.stderr,), daemon=True).start()
    kc = BlockingKernelClient(connection_file=conn)
    kc.load_connection_file()
    kc.start_channels()
    deadline = time.monotonic() + 60
    while True:
        if k.poll() is not None:
            die("exited with status %s at its start" % k.returncode)
        try:
            kc.wait_for_ready(timeout=1)
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                die("did not start within 60 s")
    return kc


#: a cell's own environment variables (run_code(envs=)), set in the kernel's process before
#: it and put back after it, as silent requests (no output, no history, no count), in a
#: namespace of their own (nothing lands in the user's)
_SET = ("import os, sys\n"
        "sys._corral_env = {k: os.environ.get(k) for k in ENV}\n"
        "os.environ.update(ENV)\n")
RESTORE_ENV = "exec(%r, {})" % ("import os, sys\n"
                                "for k, v in getattr(sys, '_corral_env', {}).items():\n"
                                "    os.environ.pop(k, None) if v is None else "
                                "os.environ.__setitem__(k, v)\n"
                                "sys._corral_env = {}\n")


def set_env_code(env):
    return "exec(%r, {'ENV': %r})" % (_SET, dict(env))


def run_cell(kc, cid, code):
    State.cell = cid
    count = 0
    msg_id = kc.execute(code, store_history=True, allow_stdin=False)
    try:
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=0.25)
            except queue.Empty:
                if State.kernel.poll() is not None:
                    die("exited with status %s while a cell ran" % State.kernel.returncode)
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg.get("msg_type")
            c = msg.get("content", {})
            if kind == "stream":
                name = "stderr" if c.get("name") == "stderr" else "stdout"
                emit({"type": name, "text": str(c.get("text", ""))})
            elif kind in ("display_data", "update_display_data", "execute_result"):
                emit({"type": "display", "id": cid, "data": clean_bundle(c.get("data")),
                      "main": kind == "execute_result"})
            elif kind == "error":
                tb = [ANSI.sub("", str(line)) + "\n" for line in c.get("traceback", [])]
                emit({"type": "error", "id": cid, "name": str(c.get("ename", "Error")),
                      "value": ANSI.sub("", str(c.get("evalue", ""))), "traceback": tb})
            elif kind == "execute_input":
                n = c.get("execution_count")
                count = n if isinstance(n, int) and not isinstance(n, bool) else count
            elif kind == "status" and c.get("execution_state") == "idle":
                break
    finally:
        State.cell = 0
    try:   # the execute_replies on the shell channel: read, so that they never pile up
        while kc.shell_channel.msg_ready():
            kc.get_shell_msg(block=False)
    except Exception:
        pass
    emit({"type": "end", "id": cid, "count": count})


def fall_back(in_fd, argv, why):
    """engine "auto" and no kernel: corral's runner (argv[0], its source) runs instead,
    in this process, on the original stdin and stdout."""
    k = State.kernel
    if k is not None and k.poll() is None:
        k.kill()
        k.wait()
    State.kernel = None
    os.write(2, ("corral: no IPython kernel (%s); corral's runner instead\n" % why).encode())
    os.dup2(in_fd, 0)
    os.dup2(State.out_fd, 1)
    sys.argv[:] = ["-c", *argv]
    exec(compile(argv[0], "<corral-runner>", "exec"), {"__name__": "__main__"})
    _exit(0)


def main(argv):
    State.max_frame = int(argv[1]) if len(argv) > 1 else State.max_frame
    cwd = argv[2] if len(argv) > 2 else ""
    engine = argv[3] if len(argv) > 3 else "auto"
    State.out_fd = os.dup(1)                     # the frame stream; fd 1 becomes /dev/null
    in_fd = os.dup(0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    saved = list(argv)
    del sys.argv[1:]
    try:
        import ipykernel

        kc = start_kernel(cwd)
    except BaseException as e:   # SystemExit too: die() while it started
        why = "%s: %s" % (type(e).__name__, e)
        if engine == "auto":
            fall_back(in_fd, saved, why)
        emit({"type": "fatal", "message": "starting the IPython kernel: " + why})
        _exit(1)
    State.starting = False
    signal.signal(signal.SIGINT, on_sigint)
    requests = queue.SimpleQueue()
    threading.Thread(target=reader, args=(in_fd, requests), daemon=True).start()
    emit({"type": "ready", "version": VERSION,
          "python": "%d.%d.%d" % sys.version_info[:3],
          "kernel": "ipykernel " + str(getattr(ipykernel, "__version__", "?"))})
    while True:
        msg = requests.get()
        if msg.get("type") == "exec":
            env = msg.get("env")
            if env:    # the kernel takes shell requests in order: no wait for these
                kc.execute(set_env_code(env), silent=True, store_history=False)
            run_cell(kc, int(msg["id"]), str(msg["code"]))
            if env:
                kc.execute(RESTORE_ENV, silent=True, store_history=False)


if __name__ == "__main__":
    main(sys.argv[1:] if sys.argv[:1] == ["-c"] else sys.argv)
