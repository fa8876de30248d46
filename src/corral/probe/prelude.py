"""The few lines put in front of every case's CODE: the probe's constants (paths and
addresses, never the token) and helpers. Runs under /usr/bin/python3 inside the sandbox
and, for host controls, on the host."""

from __future__ import annotations

PRELUDE = r'''
import errno, json, os, signal, socket, sys, time
try:
    import ctypes
except ImportError:   # CPython for WASI (the wasm tier): no ctypes, no raw syscalls
    ctypes = None
C = json.loads(__PROBE_CONSTANTS__)
globals().update(C)
SCRATCH = os.environ.get("PROBE_SCRATCH") or os.environ.get("HOME") or "/scratch"
DATA = os.environ.get("PROBE_DATA", "")
ON_HOST = bool(os.environ.get("PROBE_SCRATCH"))
libc = ctypes.CDLL(None, use_errno=True) if ctypes else None
if libc:
    libc.syscall.restype = ctypes.c_long
NR = {"x86_64": dict(ptrace=101, userfaultfd=323, perf_event_open=298, bpf=321,
                     io_uring_setup=425, finit_module=313, keyctl=250, unshare=272,
                     setns=308, open_by_handle_at=304, process_vm_readv=310, syslog=103,
                     mount=165, umount2=166, fsopen=430, pidfd_open=434, kcmp=312),
      "wasm32": {}, "aarch64": dict(ptrace=117, userfaultfd=282, perf_event_open=241, bpf=280,
                      io_uring_setup=425, finit_module=273, keyctl=219, unshare=97,
                      setns=268, open_by_handle_at=265, process_vm_readv=270, syslog=116,
                      mount=40, umount2=39, fsopen=430, pidfd_open=434, kcmp=272)}[os.uname().machine]

def out(tag, detail=""):
    print("PROBE", tag, detail, flush=True)

def ename(e):
    n = e if isinstance(e, int) else getattr(e, "errno", None)
    return errno.errorcode.get(n, str(e)) if n is not None else type(e).__name__

def sys_call(name, *args):
    """(return value, errno name or None) of a raw syscall."""
    if libc is None:   # WASI: there is no system call to make, only wasmtime's functions
        return -1, "ENOSYS"
    ctypes.set_errno(0)
    r = libc.syscall(NR[name], *args)
    return r, (ename(ctypes.get_errno()) if r < 0 else None)

DENIED = ("EPERM", "EACCES", "ENOSYS", "EROFS")

def judge_syscall(name, *args, denied=DENIED, cleanup=None):
    """ALLOWED when the kernel got past its permission checks (any result other than the
    denial errnos), DENIED otherwise."""
    r, err = sys_call(name, *args)
    if err in denied:
        out("DENIED", f"{name}: {err}")
    else:
        out("ALLOWED", f"{name}: returned {r} {err or ''}".strip())
        if cleanup and r >= 0:
            cleanup(r)

def short(path):
    return path.replace(FAKE_HOME, "~").replace(PROBE_ROOT, "<probe>")

def read_file(path, limit=4096):
    """Print a file's start when it can be read (the token, if it is a canary, is then in
    the output: the outside sees it); DENIED with the errno otherwise."""
    try:
        with open(path, "rb") as f:
            b = f.read(limit)
    except OSError as e:
        out("DENIED", f"{short(path)}: {ename(e)}")
        return None
    sys.stdout.write(b.decode("utf-8", "replace") + "\n")
    out("ALLOWED", f"read {len(b)} bytes of {short(path)}")
    return b

def send_sink(payload, host=None, port=None):
    try:
        with socket.create_connection((host or SINK_HOST, port or SINK_PORT), timeout=2) as s:
            s.sendall(payload if isinstance(payload, bytes) else payload.encode())
        return "sent"
    except OSError as e:
        return ename(e)

def via_proxy(url, headers=None, data=None):
    """A request through the sandbox's HTTP_PROXY (urllib); the status or the error."""
    import urllib.request, urllib.error
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.headers.get('X-Corral-Reason', '')}"
    except OSError as e:
        return ename(getattr(e, "reason", e))
'''


def build(code: str, constants: dict) -> str:
    import json

    return PRELUDE.replace("__PROBE_CONSTANTS__", repr(json.dumps(constants))) + "\n" + code
