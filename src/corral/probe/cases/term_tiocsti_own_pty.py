ID = "term.tiocsti-own-pty"
CATEGORY = "terminal"
DESCRIPTION = ("TIOCSTI on a terminal that is the caller's controlling tty (a pty the code makes "
               "its own), plain and with garbage in the request's high 32 bits (CVE-2019-10063)")
CLAIMS = ("kernel_surface_filtered",)
# Tests the filter itself, not whether a terminal is reachable (the sandbox gets none): the
# pty is the code's own, so pushing a byte into it is harmless everywhere.
CODE = """
import pty
IOCTL = {"x86_64": 16, "aarch64": 29}[os.uname().machine]
TIOCSTI = 0x5412

def both(fd):
    res = []
    for req in (TIOCSTI, TIOCSTI | 1 << 32):
        ch = ctypes.c_char(b"#")
        ctypes.set_errno(0)
        r = libc.syscall(IOCTL, fd, ctypes.c_ulong(req), ctypes.byref(ch))
        res.append(f"{req:#x}=" + ("ok" if r == 0 else ename(ctypes.get_errno())))
    return " ".join(res)

try:
    pid, master = pty.fork()
except OSError as e:
    # no terminal can be made here: the filter still sees the request on any fd (the kernel
    # answers ENOTTY on /dev/null, past the filter; the filter answers EPERM)
    r = both(os.open("/dev/null", os.O_RDONLY))
    out("ALLOWED" if "ENOTTY" in r else "DENIED", f"no pty ({ename(e)}); on /dev/null: {r}")
    sys.exit(0)
if pid == 0:    # session leader; the pty's slave is its controlling terminal and its fd 0
    os.write(1, ("\\nR " + both(0) + "\\n").encode())
    os._exit(0)
import re, select
got, deadline = b"", time.monotonic() + 60   # the loop ends when the line arrives
while not re.search(rb"\\nR [^\\n]*\\n", got) and time.monotonic() < deadline:
    if select.select([master], [], [], 0.2)[0]:
        try:
            b = os.read(master, 1024)
        except OSError:          # EIO: the child closed the terminal
            break
        if not b:
            break
        got += b
os.waitpid(pid, 0)
line = next((x.strip() for x in got.decode(errors="replace").splitlines() if x.startswith("R ")), "")
if not line:
    out("UNSUPPORTED", f"the child said nothing: {got[:80]!r}")
elif "=ok" in line:
    out("ALLOWED", "TIOCSTI pushed input: " + line[2:])
else:
    out("DENIED", line[2:])
"""
CONTROL = "host"
CONTAINED = "both forms of the ioctl are refused (EPERM), or no terminal can be made"
