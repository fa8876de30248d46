"""The canaries the probe plants outside the sandbox, and the sinks it watches.

- a fake home (`<root>/home/probe`) with an SSH key, cloud and tool credentials, each
  holding the run's secret token; world-readable on purpose, so that only the sandbox's
  isolation (never file permissions) keeps them away from the code;
- `CORRAL_PROBE_SECRET=<token>` in the supervisor's environment;
- a host process whose command line carries the token (a secret passed as an argument);
- an "agent" unix socket and an abstract unix socket that hand the token to whoever
  connects (an ssh-agent or a docker.sock stand-in);
- a TCP and UDP sink on a loopback address of its own (127.X.Y.1), recording every byte;
- dnsmasq on 127.X.Y.53 answering `*.probe.test` with the sink's address, its query log
  being the DNS sink.

Two tokens: `token` is the host's secret (it must appear nowhere: not in the sandbox's
output, not at a sink); `data` is a value the sandbox holds legitimately (env.set
PROBE_DATA), which must not reach a sink. Nothing here touches the user's real files.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

DOMAIN = "probe.test"

HOME_FILES = {
    ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\n{t}\n-----END OPENSSH PRIVATE KEY-----\n",
    ".ssh/config": "Host prod\n  IdentityFile ~/.ssh/id_ed25519\n  # {t}\n",
    ".aws/credentials": "[default]\naws_access_key_id = AKIA{t}\naws_secret_access_key = {t}\n",
    ".kube/config": "apiVersion: v1\nusers:\n- name: admin\n  user:\n    token: {t}\n",
    ".docker/config.json": '{{"auths": {{"registry.example": {{"auth": "{t}"}}}}}}\n',
    ".netrc": "machine api.example login probe password {t}\n",
    ".git-credentials": "https://probe:{t}@git.example\n",
    ".bashrc": "export PS1='$ '\n",
}


class Sink:
    """TCP and UDP on one (host, port): records every byte; answers HTTP-ish so clients
    that wait for a reply do not hang. `GET /redirect?hex=<hex of a URL>` answers 302 to
    that URL (hex, so that what the redirect leads to is not in the first request)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.data = bytearray()
        self.lock = threading.Lock()
        self.open_connections = 0           # accepted and not yet read to the end
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind((host, 0))
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((host, self.port))
        self.tcp.listen(64)
        self.tcp6 = None
        try:  # [::1]:port too, for the IPv6 case
            s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s6.bind(("::1", self.port))
            s6.listen(16)
            self.tcp6 = s6
        except OSError:
            pass
        self._stop = False
        for s in filter(None, (self.tcp, self.tcp6)):
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        threading.Thread(target=self._udp, daemon=True).start()

    def _record(self, b: bytes) -> None:
        with self.lock:
            self.data += b

    def _accept(self, srv) -> None:
        while not self._stop:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with self.lock:
                self.open_connections += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c) -> None:
        c.settimeout(1.0)
        buf, replied = b"", False
        try:
            while len(buf) < 1 << 20:
                b = c.recv(65536)
                if not b:
                    break
                self._record(b)
                buf += b
                if not replied and b"\r\n\r\n" in buf:
                    c.sendall(_reply(buf))
                    replied = True
        except OSError:
            pass
        finally:
            c.close()
            with self.lock:
                self.open_connections -= 1

    def _udp(self) -> None:
        while not self._stop:
            try:
                b, _ = self.udp.recvfrom(65536)
            except OSError:
                return
            self._record(b)

    def quiet(self) -> bool:
        """Everything sent here so far is recorded: no connection open or waiting to be
        accepted, no datagram queued."""
        import select

        with self.lock:
            if self.open_connections:
                return False
        socks = [s for s in (self.tcp, self.tcp6, self.udp) if s is not None]
        return not select.select(socks, [], [], 0)[0]

    def settle(self, most: float = 10.0) -> None:
        """Wait until the sink is quiet (twice in a row, 10 ms apart: an accept in flight
        is neither queued nor counted), at most `most` seconds (a connection a leftover
        process holds open). A run's last bytes are recorded however slow the machine is."""
        wait_until(self.quiet, most)

    def take(self) -> bytes:
        with self.lock:
            b = bytes(self.data)
            self.data.clear()
        return b

    def close(self) -> None:
        self._stop = True
        for s in filter(None, (self.tcp, self.tcp6, self.udp)):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _reply(head: bytes) -> bytes:
    target = head.split(b"\r\n", 1)[0].split(b" ")[1:2]
    path = target[0].split(b"://", 1)[-1] if target else b""
    _, _, query = path.partition(b"/redirect?hex=")
    if query:
        try:
            location = bytes.fromhex(query.split(b"&")[0].decode("ascii"))
        except ValueError:
            location = b""
        if location and b"\r" not in location and b"\n" not in location:
            return (b"HTTP/1.1 302 Found\r\nLocation: " + location +
                    b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    return b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"


class Teller:
    """A unix socket (path or abstract) that sends the token to whoever connects."""

    def __init__(self, address, token: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)
        self.sock.listen(16)
        self.token = token
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                c.sendall(f"identity: {self.token}\n".encode())
            except OSError:
                pass
            c.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Canaries:
    def __init__(self) -> None:
        self.token = "cnry" + secrets.token_hex(12)
        self.data = "pdat" + secrets.token_hex(12)
        self.run_id = secrets.token_hex(4)
        # on the root filesystem when /tmp is (the open_by_handle_at case needs /usr's fs)
        self.root = tempfile.mkdtemp(prefix="corral-probe-", dir="/var/tmp" if os.path.isdir(
            "/var/tmp") else None)
        os.chmod(self.root, 0o755)
        self.home = os.path.join(self.root, "home", "probe")
        self.host_dir = os.path.join(self.root, "shared")   # world-writable host dir
        self.marker = os.path.join(self.root, "escaped")     # created only by an escape
        self.agent_path = os.path.join(self.root, "agent.sock")
        self.abstract = f"\0corral-probe-{self.run_id}"
        net = os.urandom(2)
        self.net = f"127.{net[0]}.{max(net[1], 1)}"
        self.cidr = f"{self.net}.0/24"
        self.sink_host = f"{self.net}.1"
        self.dns_host = f"{self.net}.53"
        self.sink: Sink | None = None
        self.dns_proc = None
        self.dns_port = 0
        self.dns_log = os.path.join(self.root, "dns.log")
        self._dns_offset = 0
        self.tellers: list[Teller] = []
        self.cmdline_proc = None
        self.passed_fds: list[int] = []
        self.snapshot: dict = {}
        self.problems: list[str] = []

    # --- set up --------------------------------------------------------------------

    def plant(self) -> Canaries:
        sweep_stale(os.path.dirname(self.root))
        with open(os.path.join(self.root, "owner.pid"), "w") as f:
            f.write(str(os.getpid()))
        self.replant()
        # a workspace holding the link an earlier read-write run could leave: sub -> the home
        ws = os.path.join(self.root, "workspace")
        os.mkdir(ws, 0o755)
        os.symlink(self.home, os.path.join(ws, "sub"))
        self.sink = Sink(self.sink_host)
        self._start_dns()
        self.tellers = [Teller(self.agent_path, self.token), Teller(self.abstract, self.token)]
        self.cmdline_proc = subprocess.Popen(
            ["/bin/sh", "-c", "sleep 3600", "corral-probe", f"--password={self.token}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env={"PATH": "/usr/bin:/bin", "CORRAL_PROBE_SECRET": self.token},
            preexec_fn=_die_with_parent)
        # fds the supervisor inherits (not close-on-exec): a canary file and the host's "/"
        f = os.open(os.path.join(self.home, ".aws", "credentials"), os.O_RDONLY)
        d = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        for fd in (f, d):
            os.set_inheritable(fd, True)
        self.passed_fds = [f, d]
        return self

    def replant(self) -> None:
        """(Re)write the fake home and the shared dir exactly; called before every run.
        Untouched trees are left as they are (the file handle case needs stable inodes)."""
        if self.snapshot and not self.changed() and not os.path.lexists(self.marker):
            return
        if os.path.lexists(self.home):
            _force_rmtree(os.path.join(self.root, "home"))
        if os.path.lexists(self.host_dir):
            _force_rmtree(self.host_dir)
        if os.path.lexists(self.marker):
            os.unlink(self.marker)
        for rel, text in HOME_FILES.items():
            p = os.path.join(self.home, rel)
            os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
            with open(p, "w") as f:
                f.write(text.format(t=self.token))
            os.chmod(p, 0o644)
        with open(os.path.join(self.home, f"notes-{self.token}.txt"), "w") as f:
            f.write("a file whose name is a secret\n")
        for dirpath, dirnames, _ in os.walk(os.path.join(self.root, "home")):
            os.chmod(dirpath, 0o755)
        os.makedirs(self.host_dir)
        os.chmod(self.host_dir, 0o1777)
        self.snapshot = self.tree_state()

    def _start_dns(self) -> None:
        if not shutil.which("dnsmasq"):
            self.problems.append("dnsmasq not installed: DNS sink missing")
            return
        for _ in range(5):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.bind((self.dns_host, 0))
                port = u.getsockname()[1]
            cmd = ["dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
                   "--conf-file=/dev/null", f"--port={port}",
                   f"--listen-address={self.dns_host}", "--bind-interfaces",
                   "--log-queries", f"--log-facility={self.dns_log}", "--pid-file=",
                   f"--address=/{DOMAIN}/{self.sink_host}"]
            if os.geteuid() == 0:
                cmd.append("--user=root")
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    preexec_fn=_die_with_parent)
            if _dns_ready(self.dns_host, port, proc):
                self.dns_proc, self.dns_port = proc, port
                return
            proc.kill()
            proc.wait()
        self.problems.append("dnsmasq did not start: DNS sink missing")

    # --- observation ----------------------------------------------------------------

    def tree_state(self) -> dict:
        state = {}
        for base in (os.path.join(self.root, "home"), self.host_dir):
            for dirpath, dirnames, filenames in os.walk(base):
                for name in dirnames + filenames:
                    p = os.path.join(dirpath, name)
                    st = os.lstat(p)
                    digest = ""
                    if stat.S_ISREG(st.st_mode):
                        with open(p, "rb") as f:
                            digest = hashlib.sha256(f.read()).hexdigest()
                    state[p] = (st.st_mode, st.st_uid, digest)
            state[base] = os.lstat(base).st_mode if os.path.lexists(base) else None
        return state

    def changed(self) -> list[str]:
        now = self.tree_state()
        out = []
        for p in sorted(set(now) | set(self.snapshot)):
            if now.get(p) != self.snapshot.get(p):
                what = ("created" if p not in self.snapshot else
                        "removed" if p not in now else "changed")
                out.append(f"{os.path.relpath(p, self.root)} {what}")
        return out

    def settle(self) -> None:
        """Wait until the sinks have recorded what a finished run sent them: the TCP/UDP
        sink is quiet and dnsmasq has read every query waiting for it (it logs a query
        as it reads it). Waits for the condition, not for a fixed time."""
        if self.sink is not None:
            self.sink.settle()
        if self.dns_port:
            wait_until(lambda: udp_queued(self.dns_port) == 0, 10.0)

    def take_dns(self) -> str:
        try:
            with open(self.dns_log, encoding="utf-8", errors="replace") as f:
                f.seek(self._dns_offset)
                text = f.read()
                self._dns_offset = f.tell()
        except FileNotFoundError:
            return ""
        return text

    def constants(self) -> dict:
        """What the code inside knows: paths and addresses, never the token."""
        return {"FAKE_HOME": self.home, "HOST_DIR": self.host_dir, "MARKER": self.marker,
                "PROBE_ROOT": self.root, "AGENT_SOCK": self.agent_path,
                "ABSTRACT": self.abstract, "SINK_HOST": self.sink_host,
                "SINK_PORT": self.sink.port if self.sink else 0, "DNS_HOST": self.dns_host,
                "DNS_PORT": self.dns_port, "DOMAIN": DOMAIN, "NET": self.net,
                "CIDR": self.cidr, "RUN_ID": self.run_id,
                "INHERITED_FDS": list(self.passed_fds), "HANDLE": self.file_handle()}

    def file_handle(self) -> str:
        """The host file handle of the fake SSH key (hex), as a shocker-style attacker
        would guess it; empty when the host cannot make one."""
        if hasattr(self, "_handle"):
            return self._handle
        self._handle = ""
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            buf = ctypes.create_string_buffer(8 + 128)
            ctypes.c_uint.from_buffer(buf, 0).value = 128
            mount_id = ctypes.c_int()
            path = os.path.join(self.home, ".ssh", "id_ed25519").encode()
            if libc.name_to_handle_at(-100, path, buf, ctypes.byref(mount_id), 0) == 0:
                size = ctypes.c_uint.from_buffer(buf, 0).value
                self._handle = bytes(buf.raw[: 8 + size]).hex()
        except (OSError, AttributeError):
            pass
        return self._handle

    # --- tear down --------------------------------------------------------------------

    def remove(self) -> None:
        for fd in self.passed_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        for t in self.tellers:
            t.close()
        if self.sink:
            self.sink.close()
        for p in (self.dns_proc, self.cmdline_proc):
            if p is not None and p.poll() is None:
                if p is self.cmdline_proc:
                    os.killpg(p.pid, signal.SIGKILL)
                else:
                    p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        _force_rmtree(self.root)


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the probe dies, however it dies."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def sweep_stale(base: str = "/var/tmp") -> None:
    """Remove the canary trees of probes that died without cleaning up (their pid is gone)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith("corral-probe-"):
            continue
        root = os.path.join(base, name)
        try:
            with open(os.path.join(root, "owner.pid")) as f:
                pid = int(f.read())
        except (OSError, ValueError):
            continue
        if not os.path.exists(f"/proc/{pid}"):
            _force_rmtree(root)


def _force_rmtree(path: str) -> None:
    def fix(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o755)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=fix)


def wait_until(cond, most: float) -> bool:
    """Poll cond() every 10 ms until it holds twice in a row or `most` seconds pass."""
    deadline = time.monotonic() + most
    seen = 0
    while seen < 2:
        seen = seen + 1 if cond() else 0
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def udp_queued(port: int) -> int:
    """Bytes waiting in the receive queues of this host's IPv4 UDP sockets bound to
    `port` (/proc/net/udp), e.g. queries dnsmasq has not read yet."""
    queued = 0
    try:
        with open("/proc/net/udp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[1].rpartition(":")[2], 16) == port:
                    queued += int(fields[4].partition(":")[2], 16)
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    return queued


def _dns_ready(host: str, port: int, proc) -> bool:
    # a hand-made query for ready.probe.test (no dnspython needed)
    q = (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"".join(
        bytes([len(p)]) + p.encode() for p in ("ready", "probe", "test")) + b"\x00\x00\x01\x00\x01")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.settimeout(0.2)
            try:
                u.sendto(q, (host, port))
                u.recv(512)
                return True
            except OSError:
                continue
    return False
