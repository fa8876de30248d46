ID = 'term.tiocsti'
CATEGORY = 'terminal'
DESCRIPTION = 'TIOCSTI: push keystrokes into the controlling terminal (/dev/tty, fds 0-2)'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
import fcntl, termios, pty
if ON_HOST:   # the host control: a terminal of its own, to show the ioctl works when reachable
    m, s = pty.openpty()
    try:
        fcntl.ioctl(s, termios.TIOCSTI, b"#"); out("ALLOWED", "TIOCSTI on a terminal")
    except OSError as e:
        out("UNSUPPORTED" if ename(e) in ("EIO", "EPERM") else "DENIED", f"TIOCSTI on a pty: {ename(e)} (dev.tty.legacy_tiocsti?)")
    sys.exit(0)
res = []
fds = [0, 1, 2]
try:
    fds.append(os.open("/dev/tty", os.O_RDWR))
except OSError as e:
    res.append(f"/dev/tty: {ename(e)}")
for fd in fds:
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"#"); out("ALLOWED", f"TIOCSTI on fd {fd}"); sys.exit(0)
    except OSError as e:
        res.append(f"fd {fd}: {ename(e)}")
out("DENIED", "; ".join(res))
"""
CONTROL = 'host'
CONTAINED = 'no terminal is reachable, or the ioctl is refused'
