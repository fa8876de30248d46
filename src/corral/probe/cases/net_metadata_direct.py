ID = "net.metadata-direct"
CATEGORY = "network"
DESCRIPTION = "reach the cloud metadata service (169.254.169.254:80) directly, ignoring any proxy"
CLAIMS = ("rule:network (namespace)",)
# Harmless by construction: a UDP connect() only asks the routing table (no packet). Only
# when the address is local (the host control's own network namespace, where it is put on
# lo) does the code open a TCP connection; a route off the machine is reported, never used.
CODE = """
META = "169.254.169.254"
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.connect((META, 80))
        src = u.getsockname()[0]
except OSError as e:
    out("DENIED", f"no route to {META}: {ename(e)}")
else:
    if src != META:
        out("ALLOWED", f"a route to {META} exists (not contacted, to stay harmless)")
    else:
        try:
            with socket.create_connection((META, 80), timeout=2) as s:
                s.sendall(b"GET /latest/meta-data/ HTTP/1.0\\r\\n\\r\\n")
                got = s.recv(100)
            out("ALLOWED", f"{META}:80 answered {got[:12]!r}")
        except OSError as e:
            out("DENIED", f"connect {META}:80: {ename(e)}")
"""
# the host control, root only, in a network namespace of its own where 169.254.169.254 is
# on lo and a stand-in answers: the attack works wherever the address is reachable
CONTROL = {"where": "host", "code": """
import subprocess, threading
CLONE_NEWNET = 0x40000000
if os.geteuid() != 0 or libc.unshare(CLONE_NEWNET) != 0:
    out("UNSUPPORTED", "needs root for a network namespace of its own")
    sys.exit(0)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"], check=True)
srv = socket.socket()
srv.bind(("169.254.169.254", 80))
srv.listen(1)
def answer():
    c, _ = srv.accept()
    c.recv(1024)
    c.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\niam/")
    c.close()
threading.Thread(target=answer, daemon=True).start()
""" + CODE}
CONTAINED = "there is no route to 169.254.169.254 from the sandbox"
