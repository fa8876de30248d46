ID = 'net.host-unix-socket'
CATEGORY = 'network'
DESCRIPTION = "connect to a host daemon's unix socket by path (a docker.sock stand-in that hands out a secret)"
CLAIMS = ('host_fs_hidden',)
CODE = r"""
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2); s.connect(AGENT_SOCK)
        print(s.recv(4096).decode(errors="replace")); out("ALLOWED", "the host daemon answered")
except OSError as e:
    out("DENIED", f"connect: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'the socket is not reachable'
