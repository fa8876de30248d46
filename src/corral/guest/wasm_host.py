"""The host side of the wasm tier's guest: wasmtime running CPython-for-WASI, as a process
of its own inside a namespace-tier sandbox (its own uid, seccomp, no network).

Run by backends/wasm.py as `python3 -I -S wasm_host.py CONFIG -- ARGV...`, with the
wasmtime package, the compiled module and this file bound read-only. Standard library and
wasmtime only (nothing of corral). CONFIG is JSON:

    site      the directory holding the `wasmtime` package (put first on sys.path)
    cwasm     the compiled module, compiled and written by corral on the host side
    memory    bytes of linear memory the store limiter allows (memory.grow fails past it)
    cpu, wall seconds of CPU time (this process's) and wall clock for the guest
    preopens  [[dir here, path for the guest, writable], ...]: the guest's only files
    env       [[name, value], ...]: the guest's whole environment
    status    where to write one JSON line of how the guest ended (a path the guest
              cannot reach: no preopen covers it)

The guest gets argv, env, the preopens, stdin/stdout/stderr (this process's), a clock
and random: WASI preview 1, nothing else. No sockets are granted and no host function is
linked beyond WASI: the guest has no bridge to anything of the host.

Exit status: the guest's own; 1 after a trap (the status line says which).
"""

import json
import os
import sys
import threading
import time

TICK_S = 0.01
#: the last bytes of the guest's stderr kept to tell a MemoryError from other failures
TAIL = 512
STATUS_SIZE = 1024


def main(argv):
    sep = argv.index("--")
    cfg = json.loads(argv[1])
    # the status file's blocks are taken now: a guest that fills the scratch tmpfs
    # (which holds /tmp too) cannot keep its end from being written
    status_fd = os.open(cfg["status"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                        0o600)
    os.write(status_fd, b" " * STATUS_SIZE)
    guest_argv = argv[sep + 1:]
    sys.path.insert(0, cfg["site"])
    import wasmtime

    conf = wasmtime.Config()
    conf.epoch_interruption = True
    engine = wasmtime.Engine(conf)
    module = wasmtime.Module.deserialize_file(engine, cfg["cwasm"])

    wasi = wasmtime.WasiConfig()
    wasi.argv = guest_argv
    wasi.env = [tuple(kv) for kv in cfg["env"]]
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    tail = bytearray()

    def on_stderr(data):
        view = memoryview(data)
        while view:
            view = view[os.write(2, view):]
        tail.extend(data[-TAIL:])
        del tail[:-TAIL]
        return len(data)

    wasi.stderr_custom = on_stderr
    for host, guest, writable in cfg["preopens"]:
        wasi.preopen_dir(host, guest, bool(writable))

    store = wasmtime.Store(engine)
    store.set_limits(memory_size=int(cfg["memory"]))
    store.set_wasi(wasi)
    store.set_epoch_deadline(1)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()

    stop = []
    done = threading.Event()
    wall, cpu = float(cfg["wall"]), float(cfg["cpu"])
    t0 = time.monotonic()

    def ticker():
        while not done.wait(TICK_S):
            if time.monotonic() - t0 >= wall:
                stop.append("timeout")
            elif time.process_time() >= cpu:
                stop.append("cpu_time")
            else:
                continue
            engine.increment_epoch()   # the guest traps at its next epoch check
            return

    threading.Thread(target=ticker, daemon=True).start()
    status = {"end": "exit", "code": 0}
    try:
        instance = linker.instantiate(store, module)
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as e:
        status["code"] = e.code
    except (wasmtime.Trap, wasmtime.WasmtimeError) as e:
        status = {"end": stop[0] if stop else "trap", "code": 1}
        if not stop:   # a trap of the guest's own (unreachable, stack overflow, ...)
            why = [ln.strip() for ln in str(e).splitlines() if "trap" in ln]
            os.write(2, ("corral: the wasm guest trapped: " + (why[-1] if why else "?")[:200]
                         + "\n").encode())
    done.set()
    if status["end"] == "exit" and status["code"] == 1 and _memory_error(bytes(tail)):
        status["end"] = "memory"
    os.pwrite(status_fd, (json.dumps(status) + "\n").encode()[:STATUS_SIZE], 0)
    os.close(status_fd)
    # no interpreter teardown: wasmtime's stdin worker thread may still be blocked in a
    # read, and unwinding under it aborts the process
    os._exit(status["code"] & 0xFF if status["end"] in ("exit", "memory") else 1)


def _memory_error(tail):
    """Whether the guest's stderr ends with CPython's top-level MemoryError report (what a
    refused memory.grow becomes in the guest: malloc fails)."""
    last = tail.rstrip(b"\n").rpartition(b"\n")[2]
    return last == b"MemoryError" or last.startswith(b"MemoryError: ")


if __name__ == "__main__":
    main(sys.argv)
