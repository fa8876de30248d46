ID = "net.abstract-socket"
CATEGORY = "network"
DESCRIPTION = "connect to a host service's abstract unix socket (no file: only the network namespace scopes it)"
CLAIMS = ("rule:network (namespace)",)
CODE = """
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(ABSTRACT)
        print(s.recv(4096).decode(errors="replace"))
    out("ALLOWED", "the abstract socket answered")
except OSError as e:
    out("DENIED", f"connect @{ABSTRACT[1:]}: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "the abstract name does not exist in the sandbox's namespace (or unix connect is refused): the token is not read"
