"""The host side of the wasm tier's guest: wasmtime running CPython-for-WASI, as a process
of its own inside a namespace-tier sandbox (its own uid, seccomp, no network).

Run by backends/wasm.py as

    python3 -I -S wasm_host.py LIB CWASM MEMORY CPU WALL STATUS SESSION
                               N [HOST GUEST RW]*N  -- ARGV...

with wasmtime's shared library, the compiled module and this file bound read-only.
Standard library only (ctypes over wasmtime's C API: the Python bindings' import alone
costs ~25 ms of every run). LIB: wasmtime's libwasmtime.so; CWASM: the compiled module,
compiled and written by corral on the host side; MEMORY: bytes of linear memory the guest
may have (Memories, below: this process makes the guest's memories itself through
wasmtime's host memory creator, refuses a growth past MEMORY, so memory.grow returns -1
and CPython raises MemoryError, and knows that it refused: the "memory" end comes from
that, never from what the guest prints); CPU, WALL: seconds of this process's CPU time
and of wall clock for the guest (epoch interruption); STATUS: where to write how the guest
ended, one line "END CODE" (a path no preopen reaches); then the preopens (a directory
here, its path for the guest, 1 if writable), the guest's argv. The guest's whole
environment comes in this process's, as CORRAL_WASM_ENV_0="NAME=VALUE", _1, ... (never on
a command line, where other users could read it; and no variable of the policy's, such as
LD_PRELOAD, acts on this process under its own name).
SESSION: 1 for a run_code context (guest/wasm_session.py): the host closing its stdin ends
the process even while a cell runs (a WASI guest cannot be signalled), else 0.

The guest gets argv, env, the preopens, stdin/stdout/stderr (this process's), a clock and
random: WASI preview 1, nothing else. No socket is granted and no host function is linked
beyond WASI: the guest has no bridge to anything of the host.

Exit status: the guest's own; 1 after a trap (the status line says which).
"""

import _thread
import ctypes
import os
import sys
import time

TICK_S = 0.01
#: how long the ticker waits, after the epoch bump, for the guest to trap by itself
GRACE_S = 0.2
STATUS_SIZE = 64
ENV_PREFIX = "CORRAL_WASM_ENV_"

P = ctypes.c_void_p
OUTPUT = ctypes.CFUNCTYPE(ctypes.c_ssize_t, P, ctypes.POINTER(ctypes.c_ubyte), ctypes.c_size_t)
FINALIZE = ctypes.CFUNCTYPE(None, P)


class Vec(ctypes.Structure):          # wasm_byte_vec_t, wasm_name_t, wasm_message_t
    _fields_ = [("size", ctypes.c_size_t), ("data", P)]


class Instance(ctypes.Structure):     # wasmtime_instance_t
    _fields_ = [("store_id", ctypes.c_uint64), ("index", ctypes.c_size_t)]


class Func(ctypes.Structure):         # wasmtime_func_t
    _fields_ = [("store_id", ctypes.c_uint64), ("private", P)]


class Extern(ctypes.Structure):       # wasmtime_extern_t: a kind byte, then the union
    _fields_ = [("kind", ctypes.c_uint8), ("func", Func), ("rest", ctypes.c_uint8 * 32)]


GET_MEMORY = ctypes.CFUNCTYPE(P, P, ctypes.POINTER(ctypes.c_size_t),
                              ctypes.POINTER(ctypes.c_size_t))
GROW_MEMORY = ctypes.CFUNCTYPE(P, P, ctypes.c_size_t)


class LinearMemory(ctypes.Structure):   # wasmtime_linear_memory_t
    _fields_ = [("env", P), ("get_memory", GET_MEMORY), ("grow_memory", GROW_MEMORY),
                ("finalizer", FINALIZE)]


NEW_MEMORY = ctypes.CFUNCTYPE(P, P, P, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t,
                              ctypes.c_size_t, ctypes.POINTER(LinearMemory))


class MemoryCreator(ctypes.Structure):  # wasmtime_memory_creator_t
    _fields_ = [("env", P), ("new_memory", NEW_MEMORY), ("finalizer", FINALIZE)]


class Memories:
    """The guest's linear memories, made here (wasmtime's host memory creator) so that this
    process itself holds the memory limit and sees every refusal: each memory a region
    reserved PROT_NONE (wasmtime's reservation plus its guard, never moved), its first
    bytes made read-write as the guest grows it; a growth past `limit` is refused here
    (memory.grow returns -1 in the guest: a MemoryError), and `refused` records it."""

    def __init__(self, lib, limit):
        self.lib, self.limit = lib, limit
        self.refused = []    # (bytes asked for, the limit)
        self.libc = libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype, libc.mmap.argtypes = P, [P, ctypes.c_size_t, ctypes.c_int,
                                                    ctypes.c_int, ctypes.c_int,
                                                    ctypes.c_long]
        libc.mprotect.restype = ctypes.c_int
        libc.mprotect.argtypes = [P, ctypes.c_size_t, ctypes.c_int]
        self.keep = []       # the ctypes objects wasmtime holds pointers to
        self.creator = MemoryCreator(None, NEW_MEMORY(self._new), FINALIZE(0))

    def _error(self, text):
        return self.lib.wasmtime_error_new(text.encode())

    def _new(self, _env, _ty, minimum, maximum, reserved, guard, ret):
        page = 1 << 16
        if minimum > self.limit:
            self.refused.append((minimum, self.limit))
            return self._error(f"{minimum} bytes exceeds memory limits")
        size = reserved if reserved else max(minimum, min(maximum, self.limit))
        size = -(-size // page) * page
        base = self.libc.mmap(None, size + guard, 0, 0x22 | 0x4000, -1, 0)  # PROT_NONE,
        # MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE
        if base in (None, ctypes.c_void_p(-1).value):
            return self._error("cannot reserve the guest's memory")
        state = {"base": base, "size": 0, "cap": size, "max": min(maximum, size)}
        if minimum and self.libc.mprotect(base, minimum, 3) != 0:   # PROT_READ|PROT_WRITE
            return self._error("cannot map the guest's memory")
        state["size"] = minimum

        @GET_MEMORY
        def get(_e, byte_size, max_size):
            byte_size[0] = state["size"]
            max_size[0] = state["max"]
            return state["base"]

        @GROW_MEMORY
        def grow(_e, new_size):
            if new_size > self.limit or new_size > state["cap"]:
                self.refused.append((new_size, self.limit))
                return self._error(f"{new_size} bytes exceeds memory limits")
            if new_size > state["size"]:
                if self.libc.mprotect(state["base"], new_size, 3) != 0:
                    return self._error("cannot map the guest's memory")
                state["size"] = new_size
            return None

        self.keep += [get, grow, state]
        ret[0] = LinearMemory(None, get, grow, FINALIZE(0))
        return None


def bind(lib):
    """The few functions of wasmtime's C API used here, typed."""
    sig = {
        "wasm_config_new": (P, []),
        "wasmtime_config_host_memory_creator_set": (None, [P, ctypes.POINTER(MemoryCreator)]),
        "wasmtime_error_new": (P, [ctypes.c_char_p]),
        "wasmtime_config_memory_init_cow_set": (None, [P, ctypes.c_bool]),
        "wasmtime_config_epoch_interruption_set": (None, [P, ctypes.c_bool]),
        "wasm_engine_new_with_config": (P, [P]),
        "wasmtime_engine_increment_epoch": (None, [P]),
        "wasmtime_module_deserialize_file": (P, [P, ctypes.c_char_p, ctypes.POINTER(P)]),
        "wasmtime_store_new": (P, [P, P, P]),
        "wasmtime_store_context": (P, [P]),
        "wasmtime_store_limiter": (None, [P] + [ctypes.c_int64] * 5),
        "wasmtime_context_set_epoch_deadline": (None, [P, ctypes.c_uint64]),
        "wasi_config_new": (P, []),
        "wasi_config_set_argv": (ctypes.c_bool, [P, ctypes.c_size_t,
                                                 ctypes.POINTER(ctypes.c_char_p)]),
        "wasi_config_set_env": (ctypes.c_bool, [P, ctypes.c_size_t,
                                                ctypes.POINTER(ctypes.c_char_p),
                                                ctypes.POINTER(ctypes.c_char_p)]),
        "wasi_config_inherit_stdin": (None, [P]),
        "wasi_config_inherit_stdout": (None, [P]),
        "wasi_config_set_stderr_custom": (None, [P, OUTPUT, P, FINALIZE]),
        "wasi_config_preopen_dir": (ctypes.c_bool, [P, ctypes.c_char_p, ctypes.c_char_p,
                                                    ctypes.c_bool]),
        "wasmtime_context_set_wasi": (P, [P, P]),
        "wasmtime_linker_new": (P, [P]),
        "wasmtime_linker_define_wasi": (P, [P]),
        "wasmtime_linker_instantiate": (P, [P, P, P, ctypes.POINTER(Instance),
                                            ctypes.POINTER(P)]),
        "wasmtime_instance_export_get": (ctypes.c_bool, [P, ctypes.POINTER(Instance),
                                                         ctypes.c_char_p, ctypes.c_size_t,
                                                         ctypes.POINTER(Extern)]),
        "wasmtime_func_call": (P, [P, ctypes.POINTER(Func), P, ctypes.c_size_t, P,
                                   ctypes.c_size_t, ctypes.POINTER(P)]),
        "wasmtime_error_exit_status": (ctypes.c_bool, [P, ctypes.POINTER(ctypes.c_int)]),
        "wasmtime_error_message": (None, [P, ctypes.POINTER(Vec)]),
        "wasm_trap_message": (None, [P, ctypes.POINTER(Vec)]),
        "wasm_byte_vec_delete": (None, [ctypes.POINTER(Vec)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def message(lib, fn, obj):
    v = Vec()
    fn(obj, ctypes.byref(v))
    try:
        return ctypes.string_at(v.data, v.size).decode("utf-8", "replace")
    finally:
        lib.wasm_byte_vec_delete(ctypes.byref(v))


def check(lib, err, what):
    if err:
        raise SystemExit(f"corral: wasm host: {what}: {message(lib, lib.wasmtime_error_message, err)}")


def strings(items):
    arr = (ctypes.c_char_p * len(items))()
    for i, s in enumerate(items):
        arr[i] = s.encode("utf-8", "surrogateescape")
    return arr


def parse(argv):
    a = argv[1:]
    lib, cwasm, memory, cpu, wall, status, session = a[:7]
    i = 7
    pre = []
    for _ in range(int(a[i])):
        pre.append((a[i + 1], a[i + 2], a[i + 3] == "1"))
        i += 3
    env = []
    while True:
        item = os.environ.get(ENV_PREFIX + str(len(env)))
        if item is None:
            break
        name, _, value = item.partition("=")
        env.append((name, value))
    if a[i + 1] != "--":
        raise SystemExit("corral: wasm host: bad command line")
    return (lib, cwasm, int(memory), float(cpu), float(wall), status, session == "1", pre,
            env, a[i + 2:])


def main(argv):
    lib_path, cwasm, memory, cpu, wall, status_path, session, pre, env, guest_argv = \
        parse(argv)
    # the status file's blocks are taken now: a guest that fills the scratch tmpfs
    # (which holds /tmp too) cannot keep its end from being written
    status_fd = os.open(status_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                        0o600)
    os.write(status_fd, b" " * STATUS_SIZE)
    lib = bind(ctypes.CDLL(lib_path))

    conf = lib.wasm_config_new()
    lib.wasmtime_config_epoch_interruption_set(conf, True)
    memories = Memories(lib, memory)   # the memory limit is held, and seen, here
    lib.wasmtime_config_host_memory_creator_set(conf, ctypes.byref(memories.creator))
    lib.wasmtime_config_memory_init_cow_set(conf, False)   # images map only into wasmtime's
    engine = lib.wasm_engine_new_with_config(conf)   # takes the config
    module = P()
    check(lib, lib.wasmtime_module_deserialize_file(engine, cwasm.encode(),
                                                     ctypes.byref(module)), "loading " + cwasm)

    wasi = lib.wasi_config_new()
    args = strings(guest_argv)
    lib.wasi_config_set_argv(wasi, len(guest_argv), args)
    names, values = strings([k for k, _ in env]), strings([v for _, v in env])
    lib.wasi_config_set_env(wasi, len(env), names, values)
    lib.wasi_config_inherit_stdin(wasi)
    lib.wasi_config_inherit_stdout(wasi)

    @OUTPUT
    def on_stderr(_data, ptr, size):
        data = ctypes.string_at(ptr, size)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(2, view):]
        except OSError:
            return -5   # EIO to the guest
        return size

    lib.wasi_config_set_stderr_custom(wasi, on_stderr, None, FINALIZE(0))
    for host, guest, writable in pre:
        if not lib.wasi_config_preopen_dir(wasi, host.encode(), guest.encode(), writable):
            raise SystemExit(f"corral: wasm host: cannot preopen {host}")

    store = lib.wasmtime_store_new(engine, None, None)
    ctx = lib.wasmtime_store_context(store)
    # linear memory: Memories (a refusal by wasmtime's store limiter would be invisible
    # here, the C API has no callback for it);
    # tables, instances and memories: wasmtime's defaults
    lib.wasmtime_store_limiter(store, -1, -1, -1, -1, -1)
    check(lib, lib.wasmtime_context_set_wasi(ctx, wasi), "WASI")   # takes the config
    lib.wasmtime_context_set_epoch_deadline(ctx, 1)
    linker = lib.wasmtime_linker_new(engine)
    check(lib, lib.wasmtime_linker_define_wasi(linker), "linking WASI")

    stop = []
    finished = []
    lock = _thread.allocate_lock()
    t0 = time.monotonic()

    hangup = None
    if session:
        import select

        hangup = select.poll()
        hangup.register(0, select.POLLHUP)

    def ticker():
        while True:
            time.sleep(TICK_S)
            if hangup is not None and hangup.poll(0):   # the host ended the context
                with lock:
                    if not finished:
                        finished.append("exit")
                        os.pwrite(status_fd, b"exit 0\n", 0)
                        os._exit(0)
                return
            if time.monotonic() - t0 >= wall:
                stop.append("timeout")
            elif time.process_time() >= cpu:
                stop.append("cpu_time")
            else:
                continue
            lib.wasmtime_engine_increment_epoch(engine)   # the guest traps at its next check
            # a guest blocked in a WASI call (sleep, a read of stdin) meets no epoch check:
            # end the process from here
            time.sleep(GRACE_S)
            with lock:
                if not finished:
                    finished.append(stop[0])
                    os.pwrite(status_fd, f"{stop[0]} 1\n".encode(), 0)
                    os._exit(1)
            return

    _thread.start_new_thread(ticker, ())
    end, code = "exit", 0
    instance, trap = Instance(), P()
    err = lib.wasmtime_linker_instantiate(linker, ctx, module, ctypes.byref(instance),
                                          ctypes.byref(trap))
    if err:
        text = message(lib, lib.wasmtime_error_message, err)
        if "exceeds memory limits" not in text:
            raise SystemExit(f"corral: wasm host: instantiating: {text}")
        # the interpreter's own initial memory is over the limit: it cannot start at all
        os.write(2, f"corral: the wasm guest needs more memory than {memory} bytes to "
                    f"start ({text})\n".encode())
        os.pwrite(status_fd, b"memory 1\n", 0)
        os._exit(1)
    if not trap:
        ext = Extern()
        if not lib.wasmtime_instance_export_get(ctx, ctypes.byref(instance), b"_start", 6,
                                                ctypes.byref(ext)):
            raise SystemExit("corral: wasm host: the module has no _start")
        err = lib.wasmtime_func_call(ctx, ctypes.byref(ext.func), None, 0, None, 0,
                                     ctypes.byref(trap))
        if err:
            status = ctypes.c_int()
            if lib.wasmtime_error_exit_status(err, ctypes.byref(status)):
                code = status.value
            else:
                end, code = "trap", 1
                trap_text = message(lib, lib.wasmtime_error_message, err)
    if trap:
        end, code = "trap", 1
        trap_text = message(lib, lib.wasm_trap_message, trap)
    if end == "trap":
        if stop:
            end = stop[0]
        else:   # a trap of the guest's own (unreachable, stack overflow, ...)
            # wasmtime's text: a backtrace, then "Caused by:" and the reason
            lines = [ln.strip() for ln in trap_text.split("Caused by:")[-1].splitlines()
                     if ln.strip()]
            why = lines[-1:] or ["?"]
            os.write(2, ("corral: the wasm guest trapped: " + why[-1][:200] + "\n").encode())
    elif code != 0 and memories.refused:   # it failed after a growth was refused here
        end = "memory"
    with lock:
        if finished:   # the ticker is ending the process
            time.sleep(60)
        finished.append(end)
        os.pwrite(status_fd, f"{end} {code & 0xFF}\n".encode(), 0)
    # no interpreter teardown: wasmtime's stdin worker thread may still be blocked in a
    # read, and unwinding under it aborts the process
    os._exit(code & 0xFF if end in ("exit", "memory") else 1)


if __name__ == "__main__":
    main(sys.argv)
