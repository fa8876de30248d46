"""corral's agent inside a microvm guest: PID 1 after the initramfs's switch_root, run by
the image's own python3 (standard library only). Its one peer is the host, over the
virtio-serial port named "corral.ctl"; it trusts nothing else and holds no secret.

Frames both ways: 1 byte type, 4 bytes big-endian length, then that many bytes (at most
MAX_FRAME). Host to guest: C (a command: JSON argv, env, cwd, limits), I (stdin bytes),
D (stdin's end), K (kill the running command), S (fresh entropy, after a restore from a
snapshot: answered with R). Guest to host: R (ready, JSON), O and E
(stdout and stderr bytes), X (how the command ended: JSON). A frame the agent cannot parse
ends the guest: it powers off (PID 1 exits).

The command runs as uid/gid 1000 (no capabilities, no supplementary groups) in a session
of its own, with RLIMIT_CPU, RLIMIT_NOFILE and RLIMIT_NPROC as the host's C frame says;
/scratch (a tmpfs capped by the policy) is its home and the only writable place besides
/tmp, which lives in it.

Also from the host: H (a fresh identity, JSON {"hostname", "machine_id"}: set before the
first command of every sandbox, so that no two sandboxes restored from one snapshot share
one), N (network allow: JSON {"port", "ca"}: a relay listens on 127.0.0.1:PORT inside and
carries each connection over the second virtio-serial port, "corral.net", to the host,
which hands it to the sandbox's egress proxy; "ca", if not empty, is the run's CA bundle,
written to /etc/corral-ca.pem), L (live mode: from here on the frames of
live_loop(), many commands at once, each with an id).

The guest has no network device: the relay is the only way out, and it reaches nothing
but the proxy (the host connects each relayed connection to the proxy's listener only).
"""

import fcntl
import json
import os
import resource
import selectors
import signal
import struct
import sys

MAX_FRAME = 65536
#: frames from the host may be longer (run_code's runner travels in a command's argv)
HOST_MAX = 1 << 20
PORT_NAME = "corral.ctl"
NET_PORT = "corral.net"
UID = 1000
HOST_KINDS = (b"C", b"I", b"D", b"K", b"S", b"H", b"N", b"L", b"W", b"w",
              b"c", b"i", b"d", b"k", b"g", b"z")
TIOCSWINSZ, TIOCSCTTY = 0x5414, 0x540E


def find_port(want=PORT_NAME):
    base = "/sys/class/virtio-ports"
    for _ in range(500):
        try:
            for name in os.listdir(base):
                with open(os.path.join(base, name, "name")) as f:
                    if f.read().strip() == want:
                        return "/dev/" + name
        except OSError:
            pass
        import time
        time.sleep(0.01)
    raise SystemExit("corral-agent: no control port")


class Channel:
    def __init__(self, fd):
        self.fd = fd
        self.buf = b""

    def send(self, kind, data=b""):
        for i in range(0, max(len(data), 1), MAX_FRAME):
            part = data[i:i + MAX_FRAME]
            msg = kind + struct.pack(">I", len(part)) + part
            while msg:
                n = os.write(self.fd, msg)
                msg = msg[n:]

    def feed(self):
        """Read what is there; returns the whole frames, or None at the host's EOF."""
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            return None
        self.buf += chunk
        frames = []
        while len(self.buf) >= 5:
            kind, n = self.buf[:1], struct.unpack(">I", self.buf[1:5])[0]
            if kind not in HOST_KINDS or n > HOST_MAX:
                raise SystemExit("corral-agent: bad frame from host")
            if len(self.buf) < 5 + n:
                break
            frames.append((kind, self.buf[5:5 + n]))
            self.buf = self.buf[5 + n:]
        return frames


def limits(spec):
    def apply():
        cpu = spec.get("cpu")
        if cpu:
            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu) + 1, int(cpu) + 2))
        for name, value in (spec.get("rlimits") or {}).items():
            if name in ("nofile", "fsize", "core"):
                resource.setrlimit(getattr(resource, "RLIMIT_" + name.upper()), (value,) * 2)
        if spec.get("pids"):
            resource.setrlimit(resource.RLIMIT_NPROC, (spec["pids"],) * 2)
        os.setgroups([])
        os.setgid(UID)
        os.setuid(UID)
    return apply


def oom_kills():
    """The guest kernel's OOM kills so far (/proc/vmstat oom_kill)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def scratch_full():
    """1: /scratch has no bytes left; 2: no inodes left (both: 3)."""
    try:
        st = os.statvfs("/scratch")
    except OSError:
        return 0
    return (1 if st.f_blocks and st.f_bavail == 0 else 0) | (
        2 if st.f_files and st.f_favail == 0 else 0)


def end_all():
    """Kill every process of the guest but this one (PID 1: kill(-1) spares the caller),
    and reap them: nothing a command started outlives it."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def run(ch, spec, pending):
    import subprocess

    oom0 = oom_kills()
    argv, env = spec["argv"], spec["env"]
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise SystemExit("corral-agent: bad argv")
    try:
        p = subprocess.Popen(argv, env=env, cwd=spec.get("cwd") or "/scratch",
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=limits(spec), close_fds=True)
    except (OSError, ValueError) as e:   # ValueError: a NUL in argv or env
        why = getattr(e, "strerror", None) or str(e)
        ch.send(b"E", f"corral: cannot run {argv[0]!r}: {why}\n".encode())
        ch.send(b"X", json.dumps({"code": 127, "signal": None, "cpu": 0.0,
                                  "oom": 0, "full": scratch_full()}).encode())
        return
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ, b"O")
    sel.register(p.stderr, selectors.EVENT_READ, b"E")
    sel.register(ch.fd, selectors.EVENT_READ, None)
    stdin_open = True
    open_pipes = 2

    def on_frame(kind, data):
        nonlocal stdin_open
        if kind == b"I" and stdin_open:
            try:
                p.stdin.write(data)
                p.stdin.flush()
            except OSError:
                stdin_open = False
        elif kind == b"D" and stdin_open:
            stdin_open = False
            try:
                p.stdin.close()
            except OSError:
                pass
        elif kind == b"K":   # every process but PID 1: the command and all it started
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        elif kind == b"C":
            raise SystemExit("corral-agent: a command while one runs")

    for kind, data in pending:
        on_frame(kind, data)
    while open_pipes:
        for key, _ in sel.select():
            if key.data is None:
                frames = ch.feed()
                if frames is None:
                    raise SystemExit("corral-agent: host gone")
                for kind, data in frames:
                    on_frame(kind, data)
                continue
            chunk = os.read(key.fileobj.fileno(), 32768)
            if chunk:
                ch.send(key.data, chunk)
            else:
                sel.unregister(key.fileobj)
                open_pipes -= 1
    _, status, ru = os.wait4(p.pid, 0)
    end_all()   # what the command left running, even in sessions of its own
    sel.close()
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    ch.send(b"X", json.dumps({"code": code, "signal": sig, "cpu": ru.ru_utime + ru.ru_stime,
                              "oom": oom_kills() - oom0, "full": scratch_full()}).encode())


def reseed(seed):
    """After a restore from a snapshot: mix the host's fresh bytes into the kernel's pool,
    credited, and force the CRNG to reseed, so that no two restored guests share a random
    stream (each command is a new process: Python's os.urandom and random read it anew)."""
    import fcntl

    rnd_add_entropy, rnd_reseed_crng = 0x40085203, 0x5207
    with open("/dev/urandom", "wb") as f:
        fcntl.ioctl(f, rnd_add_entropy, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
        fcntl.ioctl(f, rnd_reseed_crng)


def identity(spec):
    """A fresh hostname and /etc/machine-id (a bind of /run/corral/machine-id, made by the
    initramfs: written in place), and the host's wall clock."""
    import socket

    name, mid = spec["hostname"], spec["machine_id"]
    if not (isinstance(name, str) and 0 < len(name) <= 63 and isinstance(mid, str)
            and len(mid) == 32 and all(c in "0123456789abcdef" for c in mid)):
        raise SystemExit("corral-agent: bad identity")
    socket.sethostname(name)
    with open("/run/corral/machine-id", "w") as f:
        f.write(mid + "\n")
    # the host's wall clock: a guest restored from a template would otherwise go on from
    # the time the template was saved (TLS certificates minted now would not be valid yet)
    now = spec.get("time")
    if not (type(now) is float and 1e9 < now < 1e11):
        raise SystemExit("corral-agent: bad time")
    import time

    time.clock_settime(time.CLOCK_REALTIME, now)


class NetRelay:
    """network allow: a listener on 127.0.0.1:PORT inside; each connection accepted gets
    an id and travels over the "corral.net" port as frames A (open), B (bytes), Z (this
    side's end), each payload 4 bytes of id then data; from the host also R (the proxy
    reset it: closed at once, with a reset). The host connects it to the egress proxy and
    nothing else. Past MAX_CONNS at once a connection gets a 503 and is closed, as the
    proxy answers past its own cap."""

    MAX_CONNS = 480
    BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nX-Corral-Reason: too many connections "
            b"to the egress proxy at once (the microvm relay's cap)\r\nContent-Length: 0"
            b"\r\nConnection: close\r\n\r\n")

    def __init__(self, port):
        import socket
        import threading

        self.fd = os.open(find_port(NET_PORT), os.O_RDWR)
        self.lock = threading.Lock()
        self.conns = {}
        self.ends = {}
        self.next = 0
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", port))
        ls.listen(128)
        self.ls = ls
        for target in (self.accept_loop, self.reader):
            threading.Thread(target=target, daemon=True).start()

    def send(self, kind, cid, data=b""):
        msg = kind + struct.pack(">II", 4 + len(data), cid) + data
        with self.lock:
            while msg:
                msg = msg[os.write(self.fd, msg):]

    def accept_loop(self):
        import threading

        while True:
            c, _ = self.ls.accept()
            with self.lock:
                full = len(self.conns) >= self.MAX_CONNS
            if full:
                try:
                    c.settimeout(1)
                    c.sendall(self.BUSY)
                except OSError:
                    pass
                c.close()
                continue
            with self.lock:
                self.next += 1
                cid = self.next
                self.conns[cid], self.ends[cid] = c, 0
            self.send(b"A", cid)
            threading.Thread(target=self.pump, args=(c, cid), daemon=True).start()

    def pump(self, c, cid):
        while True:
            try:
                data = c.recv(MAX_FRAME - 4)
            except OSError:
                data = b""
            if not data:
                self.send(b"Z", cid)
                self.ended(cid, 1)
                return
            self.send(b"B", cid, data)

    def ended(self, cid, side):
        import socket

        with self.lock:
            c = self.conns.get(cid)
            if c is None:
                return
            self.ends[cid] |= side
            done = self.ends[cid] == 3
            if done:
                del self.conns[cid], self.ends[cid]
        try:
            if done:
                c.close()
            elif side == 2:
                c.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def reset(self, cid):
        import socket

        with self.lock:
            c = self.conns.pop(cid, None)
            self.ends.pop(cid, None)
        if c is not None:
            try:   # a reset to the client, as from a proxy that closed on it
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def reader(self):
        buf = b""
        while True:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                continue   # the host's end closed: nothing comes back
            buf += chunk
            while len(buf) >= 5:
                kind, n = buf[:1], struct.unpack(">I", buf[1:5])[0]
                if kind not in (b"B", b"Z", b"R") or not 4 <= n <= HOST_MAX:
                    raise SystemExit("corral-agent: bad net frame from host")
                if len(buf) < 5 + n:
                    break
                cid = struct.unpack(">I", buf[5:9])[0]
                data, buf = buf[9:5 + n], buf[5 + n:]
                if kind == b"Z":
                    self.ended(cid, 2)
                    continue
                if kind == b"R":
                    self.reset(cid)
                    continue
                c = self.conns.get(cid)
                if c is not None:
                    try:
                        c.sendall(data)
                    except OSError:
                        pass


def network(spec):
    port, ca = spec["port"], spec.get("ca") or ""
    if not (type(port) is int and 0 < port < 65536 and isinstance(ca, str)):
        raise SystemExit("corral-agent: bad network frame")
    if ca:
        with open("/run/corral/ca.pem", "w") as f:
            f.write(ca)
    return NetRelay(port)


#: a workspace's tar, at most (the host packs at most 64 MiB of file data)
WORKSPACE_TAR_MAX = 80 << 20
BUSYBOX = "/run/corral/busybox"


def workspace(tar_bytes, spec):
    """A read-only workspace: the host's tar unpacked into the tmpfs at /workspace (the
    initramfs mounted it read-only), given to the sandbox's user, remounted read-only."""
    import io
    import subprocess
    import tarfile

    dest = spec.get("dest")
    if dest != "/workspace":
        raise SystemExit("corral-agent: bad workspace frame")
    subprocess.run([BUSYBOX, "mount", "-o", "remount,rw", dest], check=True)
    with tarfile.open(fileobj=io.BytesIO(bytes(tar_bytes)), mode="r:") as tar:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **kw)
    for root, dirs, files in os.walk(dest):
        for n in dirs + files:
            os.lchown(os.path.join(root, n), UID, UID)
    os.chown(dest, UID, UID)
    subprocess.run([BUSYBOX, "mount", "-o", "remount,ro", dest], check=True)


CG = "/sys/fs/cgroup"
#: bytes of stdin the agent holds for a command that does not read them
STDIN_BUFFER = 16 << 20


class Cmd:
    def __init__(self, cid):
        self.id, self.idb = cid, struct.pack(">I", cid)
        self.pid = 0
        self.status = self.ru = None
        self.open = 2
        self.stdin_w = -1
        self.inbuf = bytearray()
        self.stdin_end = False
        self.cg = f"{CG}/c{cid}"
        self.master = -1


def _cg_write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def _cg_value(path, key):
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
    except (OSError, ValueError):
        pass
    return None


def live_loop(ch, pending=()):
    """Many commands at once, each with an id (4 bytes, big-endian, before its payload).
    Host: c (JSON spec with "id"; "tty": {"rows", "cols"} for a terminal), i (stdin bytes),
    d (stdin's end), k (kill the command and all it started: its cgroup), g (one byte: a
    signal to the command's own process), z (a terminal's new size: JSON rows, cols).
    A terminal is a pty of the guest's: its master's output comes as o frames, i frames
    are written to it.
    Guest: p (started: JSON {"pid"}), o and e (output), x (its end: JSON, as X).
    A command's end kills what it left running (its cgroup): nothing outlives it."""
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_r, False)
    os.set_blocking(sig_w, False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(sig_w)
    sel = selectors.DefaultSelector()
    sel.register(ch.fd, selectors.EVENT_READ, ("ch", None))
    sel.register(sig_r, selectors.EVENT_READ, ("sig", None))
    cmds, pids, stale = {}, {}, []

    def start(spec):
        cid = spec.get("id")
        argv, env = spec.get("argv"), spec.get("env")
        if not (type(cid) is int and 0 < cid < 1 << 31 and cid not in cmds
                and isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                and isinstance(env, dict)):
            raise SystemExit("corral-agent: bad live command")
        c = Cmd(cid)
        tty = spec.get("tty")
        if tty is not None and not (isinstance(tty, dict) and all(
                type(tty.get(k)) is int and 0 < tty[k] < 10000 for k in ("rows", "cols"))):
            raise SystemExit("corral-agent: bad terminal size")
        os.mkdir(c.cg)
        if tty is not None:
            master, slave = os.openpty()
            fcntl.ioctl(slave, TIOCSWINSZ, struct.pack("HHHH", tty["rows"], tty["cols"], 0, 0))
            in_r = out_w = err_w = slave
            out_r, err_r, c.stdin_w = master, None, os.dup(master)
            c.open = 1
        else:
            in_r, c.stdin_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
        apply = limits(spec)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                if tty is not None:
                    fcntl.ioctl(0, TIOCSCTTY, 0)
                with open(c.cg + "/cgroup.procs", "w") as f:
                    f.write("0")
                apply()
                os.chdir(spec.get("cwd") or "/scratch")
                os.execvpe(argv[0], argv, env)
            except BaseException as e:
                msg = getattr(e, "strerror", None) or str(e)
                os.write(2, f"corral: cannot run {argv[0]!r}: {msg}\n".encode())
            os._exit(127)
        for fd in {in_r, out_w, err_w}:
            os.close(fd)
        os.set_blocking(c.stdin_w, False)
        c.pid = pid
        c.master = out_r if tty is not None else -1
        cmds[cid], pids[pid] = c, c
        sel.register(out_r, selectors.EVENT_READ, (b"o", c))
        if err_r is not None:
            sel.register(err_r, selectors.EVENT_READ, (b"e", c))
        ch.send(b"p", c.idb + json.dumps({"pid": pid}).encode())

    def flush_stdin(c):
        if c.stdin_w < 0:
            return
        try:
            while c.inbuf:
                del c.inbuf[:os.write(c.stdin_w, c.inbuf)]
        except BlockingIOError:
            pass
        except OSError:
            c.inbuf.clear()
            c.stdin_end = True
        registered = c.stdin_w in sel.get_map()
        if c.inbuf and not registered:
            sel.register(c.stdin_w, selectors.EVENT_WRITE, ("in", c))
        elif not c.inbuf and registered:
            sel.unregister(c.stdin_w)
        if not c.inbuf and c.stdin_end:
            os.close(c.stdin_w)
            c.stdin_w = -1

    def close_stdin(c):
        if c.stdin_w >= 0:
            if c.stdin_w in sel.get_map():
                sel.unregister(c.stdin_w)
            os.close(c.stdin_w)
            c.stdin_w = -1

    def on_frame(kind, data):
        if kind == b"c":
            spec = json.loads(data)
            try:
                start(spec)
            except OSError as e:   # no pty, no memory, no pids: that command fails
                cid = spec["id"]
                cmds.pop(cid, None)
                idb = struct.pack(">I", cid)
                ch.send(b"e", idb + f"corral: cannot start it: {e.strerror or e}\n".encode())
                ch.send(b"x", idb + json.dumps({"code": 127, "signal": None, "cpu": 0.0,
                                                "oom": 0, "full": scratch_full()}).encode())
            return
        if len(data) < 4 or kind not in (b"i", b"d", b"k", b"g", b"z"):
            raise SystemExit("corral-agent: bad live frame")
        c = cmds.get(struct.unpack(">I", data[:4])[0])
        if c is None:
            return    # a command that has ended
        if kind == b"i":
            if len(c.inbuf) + len(data) - 4 > STDIN_BUFFER:
                c.inbuf.clear()
                c.stdin_end = True
            elif not c.stdin_end:
                c.inbuf += data[4:]
            flush_stdin(c)
        elif kind == b"d":
            c.stdin_end = True
            flush_stdin(c)
        elif kind == b"k":
            if not _cg_write(c.cg + "/cgroup.kill", "1") and c.status is None:
                os.kill(c.pid, signal.SIGKILL)
        elif kind == b"z" and c.master >= 0:
            size = json.loads(data[4:])
            if not (isinstance(size, dict) and all(type(size.get(k)) is int
                                                   and 0 < size[k] < 10000
                                                   for k in ("rows", "cols"))):
                raise SystemExit("corral-agent: bad terminal size")
            fcntl.ioctl(c.master, TIOCSWINSZ,
                        struct.pack("HHHH", size["rows"], size["cols"], 0, 0))
        elif kind == b"g" and len(data) == 5 and c.status is None and 0 < data[4] < 65:
            try:
                os.kill(c.pid, data[4])
            except OSError:
                pass

    def maybe_end(c):
        if c.status is None or c.open:
            return
        close_stdin(c)
        st = c.status
        code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else None
        sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None
        usec = _cg_value(c.cg + "/cpu.stat", "usage_usec")
        cpu = usec / 1e6 if usec is not None else c.ru.ru_utime + c.ru.ru_stime
        oom = _cg_value(c.cg + "/memory.events", "oom_kill") or 0
        ch.send(b"x", c.idb + json.dumps({"code": code, "signal": sig, "cpu": cpu,
                                          "oom": oom, "full": scratch_full()}).encode())
        del cmds[c.id]
        stale.append(c.cg)

    def reap():
        while True:
            try:
                pid, st, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            c = pids.pop(pid, None)
            if c is not None:
                c.status, c.ru = st, ru
                _cg_write(c.cg + "/cgroup.kill", "1")   # what it left running goes too
                maybe_end(c)
        for d in list(stale):
            try:
                os.rmdir(d)
                stale.remove(d)
            except OSError:
                pass

    for kind, data in pending:   # what came with the L frame
        on_frame(kind, data)
    while True:
        for key, _ in sel.select(1.0 if stale else None):
            what, c = key.data
            if what == "ch":
                frames = ch.feed()
                if frames is None:
                    raise SystemExit("corral-agent: host gone")
                for kind, data in frames:
                    on_frame(kind, data)
            elif what == "sig":
                try:
                    while os.read(sig_r, 512):
                        pass
                except BlockingIOError:
                    pass
                reap()
            elif what == "in":
                flush_stdin(c)
            else:
                try:
                    chunk = os.read(key.fd, 32768)
                except OSError:
                    chunk = b""
                if chunk:
                    ch.send(what, c.idb + chunk)
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    c.open -= 1
                    maybe_end(c)
        if stale:
            reap()


def main():
    os.chown("/scratch", UID, UID)
    os.chmod("/scratch", 0o755)
    fd = os.open(find_port(), os.O_RDWR)
    ch = Channel(fd)
    ch.send(b"R", json.dumps({"agent": 1, "python": sys.version.split()[0]}).encode())
    pending = []
    ws_tar = bytearray()
    while True:
        frames = ch.feed()
        if frames is None:
            return
        pending += frames
        while pending:
            kind, data = pending.pop(0)
            if kind == b"S":
                reseed(data)
                ch.send(b"R", json.dumps({"agent": 1, "restored": True}).encode())
                continue
            if kind == b"H":
                identity(json.loads(data))
                continue
            if kind == b"W":
                ws_tar += data
                if len(ws_tar) > WORKSPACE_TAR_MAX:
                    raise SystemExit("corral-agent: workspace too large")
                continue
            if kind == b"w":
                workspace(ws_tar, json.loads(data))
                ws_tar = bytearray()
                ch.send(b"R", json.dumps({"agent": 1, "workspace": True}).encode())
                continue
            if kind == b"N":
                relay = network(json.loads(data))   # noqa: F841 - its threads hold it
                continue
            if kind == b"L":
                live_loop(ch, pending)
                return
            if kind != b"C":
                continue   # stdin or kill of no command: nothing to do
            run(ch, json.loads(data), pending)
            pending = []


if __name__ == "__main__":
    try:
        main()
    except BaseException:   # on the console (the host keeps its tail for the error)
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os.sync()
        # PID 1 ending panics the kernel; panic=-1 and QEMU's -no-reboot end the VM
        os._exit(0)
