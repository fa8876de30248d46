"""A terminal for a sandboxed command (`corral run -t`, `Sandbox.exec(tty=True)`).

The command gets a pseudo-terminal of its own, never the caller's terminal: a new pty pair,
whose slave is the command's stdin, stdout, stderr and controlling terminal (each tier makes
it so: see `Terminal.open`), and whose master stays with the supervisor. A relay thread
copies the caller's input (a terminal, a pipe, a file) to the master and the master's output
to the caller (`on_output`), keeping the first `cap` bytes of it for the Result: a terminal
is one stream, so the Result's stdout holds what the command's terminal showed (its stderr
and the echo of typed input included) and its stderr is empty. What is shown is not capped
(it is a live display); what is kept is.

Ctrl-C and the like are bytes like any other: the line discipline of the sandbox's own pty
turns ^C into SIGINT for the sandbox's foreground process group. A window-size change of the
caller's terminal (SIGWINCH) is copied to the master (TIOCSWINSZ), which signals the
sandbox's foreground group in turn. TIOCSTI and TIOCLINUX stay refused by the tiers'
seccomp rules: the code inside can push input only into its own terminal, never the
caller's, and not even there.

`raw_mode` puts the caller's terminal in raw mode for the session and restores it on the way
out, error or signal, discarding input left unread (so a late reply of the terminal to a
query the sandbox sent does not reach the caller's shell as typed input).

Imported only for a tty run: `corral run` without -t never loads termios or threading.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import termios
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

READ_CHUNK = 65536
#: the window size when neither the caller's terminal nor tty_size gives one
DEFAULT_SIZE = (24, 80)
#: ptys the sandbox may open in the run's own devpts instance (a shell and its jobs need one
#: or two; `script`, `expect`, tmux a few more)
DEVPTS_MAX = 64
#: after the command's end: how long the relay keeps reading what the terminal still holds
DRAIN_S = 2.0
#: input read from the caller but not yet taken by the terminal: reading more waits
PENDING_MAX = 1 << 16
TIOCSPTLCK = 0x40045431   # _IOW('T', 0x31, int): unlock the slave
TIOCGPTN = 0x80045430     # _IOR('T', 0x30, unsigned int): the slave's number
TIOCGSID = 0x5429         # the session of the terminal (on a master: of its slave)
SIGWINCH = 28


def mount_devpts(path: str, uid: int, gid: int) -> None:
    """A devpts instance of the run's own at `path` (root only): its ptys are the sandbox's
    alone, numbered from 0, owned by uid:gid; bound at the sandbox's /dev/pts so that
    ttyname() inside names the command's terminal /dev/pts/N."""
    from ._sys import MS_NOEXEC, MS_NOSUID, mount

    mount("devpts", path, "devpts", MS_NOSUID | MS_NOEXEC,
          f"newinstance,ptmxmode=0666,mode=0620,uid={uid},gid={gid},max={DEVPTS_MAX}")


def open_pty(devpts: str | None = None) -> tuple[int, int]:
    """(master, slave), both close-on-exec and not the caller's controlling terminal: from
    the devpts instance mounted at `devpts`, else from the host's /dev/ptmx."""
    if devpts is None:
        master, slave = os.openpty()
        return master, slave
    master = os.open(os.path.join(devpts, "ptmx"), os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
        (n,) = struct.unpack("I", fcntl.ioctl(master, TIOCGPTN, b"\0" * 4))
        # the number comes from our own ioctl on our own master; O_NOFOLLOW: a devpts
        # entry is never a symlink
        slave = os.open(os.path.join(devpts, str(n)),
                        os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except BaseException:
        os.close(master)
        raise
    return master, slave


def window_size(fd: int) -> tuple[int, int] | None:
    """(rows, cols) of the terminal on fd, or None if it is not one (or says 0x0)."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return None
    return (rows, cols) if rows and cols else None


def set_window_size(fd: int, size: tuple[int, int]) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))


class raw_mode:
    """The caller's terminal on fd in raw mode (no echo, no line editing, no signals from
    ^C/^Z/^\\, no output processing) until exit; then its settings as they were, input not
    yet read discarded (TCSAFLUSH). Nothing happens if fd is not a terminal."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.saved = None

    def __enter__(self) -> raw_mode:
        try:
            self.saved = termios.tcgetattr(self.fd)
        except termios.error:
            return self
        mode = termios.tcgetattr(self.fd)
        iflag, oflag, cflag, lflag = 0, 1, 2, 3
        mode[iflag] &= ~(termios.BRKINT | termios.ICRNL | termios.INPCK | termios.ISTRIP
                         | termios.IXON | termios.INLCR | termios.IGNCR | termios.PARMRK)
        mode[oflag] &= ~termios.OPOST
        mode[cflag] = (mode[cflag] & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
        mode[lflag] &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG
                         | termios.IEXTEN)
        mode[6][termios.VMIN] = 1
        mode[6][termios.VTIME] = 0
        termios.tcsetattr(self.fd, termios.TCSANOW, mode)  # typed-ahead input goes in
        return self

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            try:
                termios.tcsetattr(self.fd, termios.TCSAFLUSH, self.saved)
            except termios.error:
                pass  # the terminal went away (hangup): nothing to restore


class Terminal:
    """The caller's side of one tty exec: where input comes from, where output goes, the
    window size; then (tiers call open() and start(), Sandbox.exec calls finish()) the pty
    pair and the relay thread.

    `stdin`: a readable fd (the caller's terminal, a pipe, a file) or None for no input.
    Its end is not an end of file for the command (a terminal has none): send b"\\x04" (^D)
    for that. `size`: (rows, cols); None takes the size of stdin when it is a terminal,
    else DEFAULT_SIZE. When stdin is a terminal and this is the main thread, its size
    changes are followed (SIGWINCH)."""

    def __init__(self, stdin: int | None, on_output: Callable[[bytes], None] | None,
                 cap: int, size: tuple[int, int] | None = None) -> None:
        self.stdin = stdin
        self.on_output = on_output
        self.cap = cap
        self.follow = stdin if stdin is not None and os.isatty(stdin) else None
        self.size = size or (self.follow is not None and window_size(self.follow)) \
            or DEFAULT_SIZE
        self.master = self.slave = -1
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False
        self._thread: threading.Thread | None = None
        self._stop_r = self._stop_w = -1
        self._old_winch = None
        self._error: BaseException | None = None
        self._listener = None
        self._console = None

    # -- the tiers' side -----------------------------------------------------------------
    def open(self, devpts: str | None = None) -> int:
        """Make the pty pair (see open_pty) and return the slave, for the command's fds
        0, 1 and 2. The tier makes it the command's controlling terminal."""
        if self.master >= 0:
            raise RuntimeError("this Terminal is open already: one per exec")
        self.master, self.slave = open_pty(devpts)
        set_window_size(self.master, self.size)
        return self.slave

    def console_socket(self, directory: str) -> str:
        """For a runtime that makes the pty itself and sends its master over a unix socket
        (runsc --console-socket; it also makes the slave its sandbox's controlling terminal):
        a listener in `directory` (made here, 0700: only root reaches it) whose first
        connection, from root, must bring exactly one fd, a terminal. The relay accepts it.
        Returns the socket's path."""
        import socket

        if self.master >= 0 or self._listener is not None:
            raise RuntimeError("this Terminal is open already: one per exec")
        os.makedirs(directory, 0o700, exist_ok=True)
        path = os.path.join(directory, f"console-{os.urandom(4).hex()}.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._listener.bind(path)
        self._listener.listen(1)
        self._console = path
        return path

    def _accept_master(self) -> bool:
        """The master from the console socket; False if the stop came first."""
        import socket

        poller = select.poll()
        poller.register(self._listener.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return False
            conn, _ = self._listener.accept()
            with conn:
                uid = struct.unpack("3i", conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                _, fds, flags, _ = socket.recv_fds(conn, 4096, 2, socket.MSG_CMSG_CLOEXEC)
                fd = fds[0] if len(fds) == 1 and not flags & socket.MSG_CTRUNC else -1
                for other in fds:
                    if other != fd:
                        os.close(other)
                if fd >= 0 and (uid != 0 or not os.isatty(fd)):
                    os.close(fd)
                    fd = -1
            if fd >= 0:
                self.master = fd
                os.set_blocking(fd, False)
                size = self.follow is not None and window_size(self.follow)
                set_window_size(fd, size or self.size)
                return True

    def start(self) -> None:
        """Start relaying: called by the tier once the command is started (after its last
        fork: the relay is a thread)."""
        if self._thread is not None or (self.master < 0 and self._listener is None):
            return
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        if self.master >= 0:
            os.set_blocking(self.master, False)
        if self.follow is not None and threading.current_thread() is threading.main_thread():
            import _signal

            self._old_winch = _signal.signal(SIGWINCH, self._resized)
        self._thread = threading.Thread(target=self._relay, name="corral-tty", daemon=True)
        self._thread.start()

    def resize(self, size: tuple[int, int]) -> None:
        """A new window size (rows, cols), for a terminal not following a caller's: set on
        the master now if it is there, else when it comes (console_socket). The kernel then
        signals the sandbox's foreground group (SIGWINCH)."""
        self.size = size
        if self.master >= 0:
            set_window_size(self.master, size)

    def session(self) -> int | None:
        """The host pid of the pty's session leader (TIOCGSID on the master): the command
        on the namespace tier (setsid --ctty), runsc's sandbox process on gvisor (its
        console's slave is that process's controlling terminal); None if it has none."""
        if self.master < 0:
            return None
        try:
            (sid,) = struct.unpack("i", fcntl.ioctl(self.master, TIOCGSID, b"\0" * 4))
        except OSError:
            return None
        return sid if sid > 0 else None

    def _resized(self, signum, frame) -> None:
        size = window_size(self.follow)
        if size is not None and self.master >= 0:
            try:
                set_window_size(self.master, size)
            except OSError:
                pass

    # -- the relay (its own thread) ------------------------------------------------------
    def _relay(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self._error = e

    def _loop(self) -> None:
        if self.master < 0 and not self._accept_master():
            return
        poller = select.epoll()
        try:
            poller.register(self.master, select.EPOLLIN)
            poller.register(self._stop_r, select.EPOLLIN)
            source = self.stdin
            always_ready = False   # a regular file (or memfd) cannot be polled: just read
            if source is not None:
                try:
                    poller.register(source, select.EPOLLIN)
                except PermissionError:
                    always_ready = True
            pending = b""
            drain_until = None
            while True:
                if source is not None and always_ready and not pending:
                    pending = os.read(source, PENDING_MAX)
                    if not pending:
                        source = None
                mask = select.EPOLLIN | (select.EPOLLOUT if pending else 0)
                poller.modify(self.master, mask)
                wait = -1 if drain_until is None else max(drain_until - _now(), 0)
                events = poller.poll(wait)
                if drain_until is not None and not events:
                    return   # nothing more came in time
                for fd, ev in events:
                    if fd == self._stop_r:   # the command ended: drain, then stop
                        poller.unregister(self._stop_r)
                        if source is not None and not always_ready:
                            poller.unregister(source)
                        source, pending = None, b""
                        drain_until = _now() + DRAIN_S
                    elif fd == self.master:
                        if ev & select.EPOLLOUT and pending:
                            try:
                                pending = pending[os.write(self.master, pending):]
                            except BlockingIOError:
                                pass
                        if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                            if not self._read_master():
                                return   # every slave is closed: all is read
                    elif fd == source:
                        if pending:     # the terminal has not taken the last input yet
                            poller.modify(source, 0)
                            continue
                        try:
                            data = os.read(source, PENDING_MAX)
                        except OSError:   # e.g. EIO: the caller's terminal hung up
                            data = b""
                        if data:
                            pending = data
                        else:
                            poller.unregister(source)
                            source = None
                if source is not None and not always_ready and not pending:
                    poller.modify(source, select.EPOLLIN)
                if drain_until is not None and _now() >= drain_until:
                    return
        finally:
            poller.close()

    def _read_master(self) -> bool:
        """Read what the master holds. False once it reports EIO: no slave is open."""
        try:
            data = os.read(self.master, READ_CHUNK)
        except BlockingIOError:
            return True
        except OSError as e:
            if e.errno == 5:   # EIO
                return False
            raise
        if not data:
            return False
        room = self.cap - self.kept
        if room > 0:
            kept = data[:room]
            self.chunks.append(kept)
            self.kept += len(kept)
        if len(data) > max(room, 0):
            self.truncated = True
        if self.on_output is not None:
            try:
                self.on_output(data)
            except OSError:
                self.on_output = None   # the caller's output went away: keep capturing
        return True

    # -- the end ---------------------------------------------------------------------------
    def finish(self, *, errors: bool = True) -> str:
        """After the command and everything of its run are gone: close our slave (the master
        then reads what is left, then EIO), let the relay drain it, stop it, restore
        SIGWINCH. Returns the kept output as text. Re-raises what broke the relay, unless
        not `errors`. Safe to call more than once, and on a Terminal never opened or
        started."""
        if self.slave >= 0:
            os.close(self.slave)
            self.slave = -1
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join(DRAIN_S + 5)
            if self._thread.is_alive():   # stuck writing to the caller: leave it its fds
                self.master = self._stop_r = self._stop_w = -1
            self._thread = None
        if self._old_winch is not None:
            import _signal

            _signal.signal(SIGWINCH, self._old_winch)
            self._old_winch = None
        for name in ("master", "_stop_r", "_stop_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self._console)
            except OSError:
                pass
        if self._error is not None:
            err, self._error = self._error, None
            if errors:   # the relay failed (a bug, or the caller's fds went bad)
                raise err
        return b"".join(self.chunks).decode("utf-8", errors="replace")


_now = time.monotonic
