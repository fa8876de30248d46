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
"""

import json
import os
import resource
import selectors
import signal
import struct
import sys

MAX_FRAME = 65536
PORT_NAME = "corral.ctl"
UID = 1000


def find_port():
    base = "/sys/class/virtio-ports"
    for _ in range(500):
        try:
            for name in os.listdir(base):
                with open(os.path.join(base, name, "name")) as f:
                    if f.read().strip() == PORT_NAME:
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
            if kind not in (b"C", b"I", b"D", b"K", b"S") or n > MAX_FRAME:
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
    except OSError as e:
        ch.send(b"E", f"corral: cannot run {argv[0]!r}: {e.strerror}\n".encode())
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


def main():
    os.chown("/scratch", UID, UID)
    os.chmod("/scratch", 0o755)
    fd = os.open(find_port(), os.O_RDWR)
    ch = Channel(fd)
    ch.send(b"R", json.dumps({"agent": 1, "python": sys.version.split()[0]}).encode())
    pending = []
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
            if kind != b"C":
                continue   # stdin or kill of no command: nothing to do
            run(ch, json.loads(data), pending)
            pending = []


if __name__ == "__main__":
    try:
        main()
    finally:
        os.sync()
        # PID 1 ending panics the kernel; panic=-1 and QEMU's -no-reboot end the VM
        os._exit(0)
