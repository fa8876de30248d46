ID = "term.tioclinux"
CATEGORY = "terminal"
DESCRIPTION = "TIOCLINUX (the console's select-and-paste, ttyjack) on a pty the code makes itself, else on /dev/null"
CLAIMS = ("kernel_surface_filtered",)
# Judged at the filter: on a pty or /dev/null the kernel answers ENOTTY/EINVAL past its own checks (the
# paste only works on a virtual console), which is "allowed"; EPERM means the filter refused.
CODE = """
import pty, fcntl
try:
    master, slave = pty.openpty()
except OSError:      # the filter sees the request on any fd; the kernel then says ENOTTY
    slave = os.open("/dev/null", os.O_RDONLY)
arg = ctypes.c_char(b"\\x03")              # subcode 3: paste the selection
IOCTL = {"x86_64": 16, "aarch64": 29}[os.uname().machine]
ctypes.set_errno(0)
r = libc.syscall(IOCTL, slave, ctypes.c_ulong(0x541C), ctypes.byref(arg))
err = ename(ctypes.get_errno()) if r < 0 else "ok"
out("DENIED" if err in ("EPERM", "EACCES") else "ALLOWED", f"ioctl(TIOCLINUX): {err}")
"""
CONTROL = "host"
CONTAINED = "the ioctl is refused by the filter (EPERM)"
