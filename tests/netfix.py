"""Network fixtures shared by the test files (a pytest plugin, see conftest.py): real HTTP
and HTTPS servers on random loopback /24s, a real dnsmasq answering the test names, the
egress proxy as its own process, and the secret-grant "world" (a test CA standing for the
web PKI, echo servers that record what reached them, a git repository, a run CA).

Traffic goes only to 127.0.0.0/8. Two /24s of their own per run, so parallel runs never
share ports 80/443: NET for the egress tests (allowed.test, ...), GRANT_NET for the grants
(granted.test, other.test)."""

from __future__ import annotations

import base64
import datetime
import gzip
import http.server
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# a loopback /24 of its own per run, so parallel runs of this file never share ports 80/443
NET = "127.{}.{}".format(*os.urandom(2))
SRV = f"{NET}.2"           # allowed.test and friends
OTHER = f"{NET}.3"         # the "wrong" server in the pinning test
PRIV = f"{NET}.0/24"       # allow_private for the test servers

GRANT_NET = "127.{}.{}".format(*os.urandom(2))
GRANTED = f"{GRANT_NET}.2"           # granted.test
GRANTED_OTHER = f"{GRANT_NET}.3"     # other.test: allowed, but no grant names it
GRANT_PRIV = f"{GRANT_NET}.0/24"
TOKEN = "ghp_R3alS3cretV4lue+/=0123456789abcdef"   # the credential (never in the sandbox)


# --- helpers --------------------------------------------------------------------

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as t, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        t.bind((host, 0))
        port = t.getsockname()[1]
        u.bind((host, port))
        return port


def start_dnsmasq(addresses: dict[str, str], log: Path | None = None):
    """dnsmasq on 127.0.0.1 at a free port answering each name (and its subdomains) with its
    address, nothing else; queries logged to `log`. Returns (process, port) once it answers."""
    import dns.exception
    import dns.message
    import dns.query

    port = free_port()
    argv = ["dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
            "--conf-file=/dev/null", f"--port={port}", "--listen-address=127.0.0.1",
            "--bind-interfaces", "--pid-file=", "--user=root"]
    if log is not None:
        argv += ["--log-queries", f"--log-facility={log}"]
    argv += [f"--address=/{name}/{ip}" for name, ip in addresses.items()]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = next(iter(addresses))
    deadline = time.monotonic() + 10
    while True:
        try:
            dns.query.udp(dns.message.make_query(f"ready.{first}", "A"), "127.0.0.1",
                          port=port, timeout=0.2)
            return proc, port
        except (OSError, dns.exception.Timeout):
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("dnsmasq did not start") from None



# --- the egress tests' servers and resolver ----------------------------------------------

def send_body(handler, body: bytes, chunks: int = 0) -> None:
    """End a handler's headers and send body: in `chunks`-byte chunks (chunked encoding) if
    chunks, else with Content-Length (and no body for HEAD)."""
    if chunks:
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for i in range(0, len(body), chunks):
            part = body[i:i + chunks]
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        handler.wfile.write(b"0\r\n\r\n")
        return
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _reply(self, body: bytes, status: int = 200, chunked: bool = False) -> None:
        self.send_response(status)
        self.send_header("X-Served-By", self.server.server_address[0])
        send_body(self, body, 8192 if chunked else 0)

    def do_GET(self):
        p = self.path
        if p.startswith("/bytes/"):
            self._reply(b"x" * int(p.split("/")[2]))
        elif p.startswith("/chunked/"):
            self._reply(b"y" * int(p.split("/")[2]), chunked=True)
        elif p == "/host":
            self._reply(self.headers.get("Host", "").encode())
        elif p == "/slow":
            time.sleep(0.5)
            self._reply(b"slow")
        else:
            self._reply(f"hello from {self.server.server_address[0]}\n".encode())

    do_HEAD = do_GET

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        got = 0
        while got < n:
            chunk = self.rfile.read(min(65536, n - got))
            if not chunk:
                break
            got += len(chunk)
        self.server.received.append(got)
        self._reply(f"got {got}\n".encode())


class TLSServer(http.server.ThreadingHTTPServer):
    """A threaded HTTP server; with `tls`, every accepted socket is wrapped first."""

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, addr, handler, tls: ssl.SSLContext | None = None):
        self.tls = tls
        super().__init__(addr, handler)

    def get_request(self):
        sock, addr = super().get_request()
        if self.tls is not None:
            sock.settimeout(5)
            sock = self.tls.wrap_socket(sock, server_side=True)
            sock.settimeout(None)
        return sock, addr


class Server(TLSServer):
    """The egress tests' server: records the sizes of POST bodies it received."""

    def __init__(self, addr, tls: ssl.SSLContext | None = None):
        self.received: list[int] = []
        super().__init__(addr, Handler, tls)


def serve(addr, tls=None) -> Server:
    s = Server(addr, tls)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


def make_cert(tmp: Path, name: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("egress-srv")
    cert, key = make_cert(tmp, "allowed.test")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    s = [serve((SRV, 80)), serve((SRV, 443), ctx), serve((SRV, 8443), ctx), serve((OTHER, 80))]
    yield {"http": s[0], "https": s[1], "https8443": s[2], "other": s[3], "cert": cert}
    for x in s:
        x.shutdown()
        x.server_close()


@pytest.fixture(scope="module")
def dnsmasq(tmp_path_factory):
    log = tmp_path_factory.mktemp("egress-dns") / "dnsmasq.log"
    proc, port = start_dnsmasq({"allowed.test": SRV, "private.test": SRV, "denied.test": SRV,
                                "bad.allowed.test": SRV}, log)
    yield {"port": port, "log": log}
    proc.terminate()
    proc.wait(5)


def queried(dnsmasq, name: str) -> bool:
    return f" {name} from" in dnsmasq["log"].read_text()


class Proxy:
    """The egress proxy as its own process on 127.0.0.1:<free port>, events to a file."""

    def __init__(self, cfg: dict, tmp: Path, nofile: int | None = None,
                 hosts: Path | None = None):
        """`nofile`: the proxy's RLIMIT_NOFILE (soft and hard) instead of ours; `hosts`: its
        hosts file instead of /etc/hosts."""
        self.cfg_path = tmp / f"cfg-{id(self)}.json"
        self.events_path = tmp / f"events-{id(self)}.jsonl"
        self.cfg_path.write_text(json.dumps(cfg))

        def limit() -> None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral.egress", "--config", str(self.cfg_path),
             "--listen", "127.0.0.1:0", "--events", str(self.events_path),
             *(["--hosts", str(hosts)] if hosts else [])],
            stderr=subprocess.PIPE, text=True, preexec_fn=limit if nofile else None)
        self.stderr = ""
        while "listening on" not in (line := self.proc.stderr.readline()):
            self.stderr += line                  # what it says before (its fd limit, say)
            assert line, self.stderr + self.proc.stderr.read()
        self.port = int(line.rsplit(":", 1)[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr += line

    def events(self, wait_for: int = 0, timeout: float = 30.0, kind: str | None = None
               ) -> list[dict]:
        """The proxy's events so far, once there are at least `wait_for` of them (of `kind`
        only, if given), or when `timeout` passes: the wait is bounded by what arrives,
        not by how fast this machine is."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                evs = [json.loads(x) for x in self.events_path.read_text().splitlines()]
            except FileNotFoundError:
                evs = []
            counted = [e for e in evs if kind is None or e.get("kind") == kind]
            if len(counted) >= wait_for or time.monotonic() > deadline:
                return evs
            time.sleep(0.01)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr += self.proc.stderr.read()
        self.proc.stderr.close()



# --- the grants' world -------------------------------------------------------------------

def make_test_ca(tmp: Path) -> tuple[Path, dict[str, tuple[Path, Path]]]:
    """A CA of the test's own (standing for the public web PKI), and server certs it signed
    for granted.test and other.test."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject, issuer, pub, sign_key, ext):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=2)))
        for e, crit in ext:
            b = b.add_extension(e, critical=crit)
        return b.sign(sign_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test web PKI")])
    ca = build(ca_name, ca_name, ca_key.public_key(), ca_key,
               [(x509.BasicConstraints(ca=True, path_length=None), True)])
    ca_path = tmp / "test-ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out = {}
    for name in ("granted.test", "other.test"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), ca_name,
                     key.public_key(), ca_key,
                     [(x509.SubjectAlternativeName([x509.DNSName(name)]), False),
                      (x509.BasicConstraints(ca=False, path_length=None), True)])
        c, k = tmp / f"{name}.pem", tmp / f"{name}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        out[name] = (c, k)
    return ca_path, out


def _json_all(s: bytes) -> bytes:
    """JSON-escape every character that is not a letter or digit as \\u00hh."""
    return b'"' + b"".join(bytes([c]) if bytes([c]).isalnum() else b"\\u%04x" % c
                           for c in s) + b'"'


def _entities_named(s: bytes) -> bytes:
    import html.entities

    names = {v: k for k, v in html.entities.html5.items() if k.endswith(";") and len(v) == 1}
    return b"".join(("&" + names[chr(c)]).encode() if chr(c) in names and not chr(c).isalnum()
                    else bytes([c]) for c in s)


def _pct(s: bytes, every: bool = False, lower: bool = False) -> bytes:
    from urllib.parse import quote_from_bytes

    out = (b"".join(b"%%%02X" % c for c in s) if every
           else quote_from_bytes(s, safe="").encode())
    return re.sub(rb"%[0-9A-F]{2}", lambda m: m.group().lower(), out) if lower else out


#: how a reflecting server may spell what it echoes (/form?f=NAME): name -> bytes -> bytes
REFLECT_FORMS = {
    "exact": lambda s: s,
    "base64": base64.b64encode,
    "base64-nopad": lambda s: base64.b64encode(s).rstrip(b"="),
    "base64url": base64.urlsafe_b64encode,
    "base64url-nopad": lambda s: base64.urlsafe_b64encode(s).rstrip(b"="),
    "hex": lambda s: s.hex().encode(),
    "HEX": lambda s: s.hex().upper().encode(),
    "json": lambda s: json.dumps(s.decode()).encode(),
    "json-slash": lambda s: json.dumps(s.decode()).replace("/", "\\/").encode(),
    "json-unicode": _json_all,
    "json-in-json": lambda s: json.dumps(json.dumps({"v": s.decode()})).encode(),
    "percent": _pct,
    "percent-lower": lambda s: _pct(s, lower=True),
    "percent-every": lambda s: _pct(s, every=True),
    "percent-every-lower": lambda s: _pct(s, every=True, lower=True),
    "percent-twice": lambda s: _pct(_pct(s)),
    "html-named": _entities_named,
    "html-decimal": lambda s: b"".join(b"&#%d;" % c for c in s),
    "html-hex": lambda s: b"".join(b"&#x%x;" % c for c in s),
    "html-HEX": lambda s: b"".join(b"&#X%02X;" % c for c in s),
    "upper": bytes.upper,
    "lower": bytes.lower,
}


class Echo(http.server.BaseHTTPRequestHandler):
    """Echoes what it received: /echo (identity), /gzip, /chunks (the body in 3-byte chunks),
    /form?f=NAME (one header, spelled as REFLECT_FORMS[NAME]), /ce?v=CODING (the echo with
    that Content-Encoding),
    /header (the credential headers back as response headers), /redirect?to=URL, /basic
    (200 only with the real token as Basic password), /git/... (a dumb-HTTP git repository
    that wants the real token as Basic password, 401 otherwise)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _seen(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        rec = {"server": self.server.name, "method": self.command, "path": self.path,
               "headers": [[k, v] for k, v in self.headers.items()],
               "body": body.decode("latin-1")}
        self.server.log.append(rec)
        return rec

    def _send(self, status, body: bytes, headers=(), chunks: int = 0) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        send_body(self, body, chunks)

    def _password_ok(self) -> bool:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Basic "):
            return False
        try:
            _, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
        except ValueError:
            return False
        return pw == TOKEN

    def do_GET(self):
        rec = self._seen()
        path, _, query = self.path.partition("?")
        echo = json.dumps(rec).encode()
        if path == "/echo":
            self._send(200, echo, [("Content-Type", "application/json")])
        elif path == "/gzip":
            self._send(200, gzip.compress(echo), [("Content-Encoding", "gzip")])
        elif path == "/chunks":
            self._send(200, echo, chunks=3)
        elif path == "/form":
            # one request header (h=, default x-api-key) inside "p"*pre + value + "s",
            # spelled as REFLECT_FORMS[f], sent in 1-byte chunks with chunks=1
            q = dict(x.split("=", 1) for x in query.split("&") if "=" in x)
            text = (b"p" * int(q.get("pre", "0")) + self.headers.get(q.get("h", "x-api-key"),
                                                                     "").encode() + b"s")
            self._send(200, REFLECT_FORMS[q["f"]](text), chunks=int(q.get("chunks", "0")))
        elif path == "/ce":
            # the echo with Content-Encoding: v (each "|" another header; the body gzipped
            # as many times as the header names gzip, else sent as is)
            codings = [c for h in query.partition("=")[2].split("|") for c in h.split(",")]
            body = echo
            for c in codings:
                if c.strip() in ("gzip", "x-gzip"):
                    body = gzip.compress(body)
                elif c.strip() == "deflate":
                    import zlib

                    body = zlib.compress(body)
            self._send(200, body, [("Content-Encoding", h.replace("%20", " "))
                                   for h in query.partition("=")[2].split("|")])
        elif path == "/header":
            self._send(200, b"see headers", [
                ("X-Echo-" + k, v) for k, v in self.headers.items()
                if k.lower() in ("authorization", "x-api-key")])
        elif path == "/redirect":
            self._send(302, b"moved", [("Location", query.partition("=")[2])])
        elif path == "/basic":
            if self._password_ok():
                self._send(200, b"basic ok")
            else:
                self._send(401, b"no", [("WWW-Authenticate", 'Basic realm="t"')])
        elif path.startswith("/git/"):
            if not self._password_ok():
                self._send(401, b"auth", [("WWW-Authenticate", 'Basic realm="git"')])
                return
            f = (self.server.git_root / path[len("/git/"):]).resolve()
            if self.server.git_root not in f.parents or not f.is_file():
                self._send(404, b"no")
                return
            self._send(200, f.read_bytes(), [("Content-Type", "application/octet-stream")])
        else:
            self._send(404, b"no")

    do_HEAD = do_GET
    do_POST = do_GET


class ShortEcho(Echo):
    timeout = 0.3            # closes a kept-alive connection idle for that long


class EchoServer(TLSServer):
    def __init__(self, addr, name: str, log: list, git_root: Path, tls=None, handler=Echo):
        self.name, self.log, self.git_root = name, log, git_root
        super().__init__(addr, handler, tls)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """dnsmasq, the echo servers, the test CA, a bare git repo, the run CA."""
    from corral.egress.mitm import make_ca

    tmp = tmp_path_factory.mktemp("secrets")
    test_ca, certs = make_test_ca(tmp)
    repo = tmp / "repo.git"
    work = tmp / "work"
    genv = {**os.environ, "HOME": str(tmp), "GIT_CONFIG_NOSYSTEM": "1"}
    for argv in (["git", "init", "-q", "-b", "main", str(work)],
                 ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t",
                  "commit", "-q", "--allow-empty", "-m", "first"],
                 ["git", "clone", "-q", "--bare", str(work), str(repo)],
                 ["git", "-C", str(repo), "update-server-info"]):
        subprocess.run(argv, check=True, env=genv, capture_output=True)
    log: list[dict] = []
    servers = []
    for name, ip in (("granted.test", GRANTED), ("other.test", GRANTED_OTHER)):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*certs[name])
        for port, tls in ((443, ctx), (80, None)):
            s = EchoServer((ip, port), name, log, tmp.resolve(), tls)
            threading.Thread(target=s.serve_forever, daemon=True).start()
            servers.append(s)
        if name == "granted.test":
            s = EchoServer((ip, 8443), name, log, tmp.resolve(), ctx, ShortEcho)
            threading.Thread(target=s.serve_forever, daemon=True).start()
            servers.append(s)
    proc, port = start_dnsmasq({"granted.test": GRANTED, "other.test": GRANTED_OTHER})
    run_cert, run_key = make_ca("corral test run")
    run_ca = tmp / "run-ca.pem"
    run_ca.write_text(run_cert)
    bundle = tmp / "bundle.pem"            # what the sandbox trusts: the "system" CAs + run CA
    bundle.write_text(test_ca.read_text() + run_cert)
    yield {"tmp": tmp, "log": log, "test_ca": test_ca, "run_ca": run_ca, "bundle": bundle,
           "run_cert": run_cert, "run_key": run_key, "dns": port, "repo": repo}
    proc.terminate()
    proc.wait(5)
    for s in servers:
        s.shutdown()
        s.server_close()


