ID = 'net.bypass-proxy'
CATEGORY = 'network'
DESCRIPTION = "with a proxy present, ignore it and connect straight to the allowed host's address"
CLAIMS = ('rule:network.mode', 'rule:network (namespace)')
POLICY = {'network': {'mode': 'allow', 'allow': ['sink.{DOMAIN}:{SINK_PORT}'], 'allow_private': ['{CIDR}'], 'nameservers': ['{DNS_HOST}:{DNS_PORT}']}}
CODE = r"""
r = send_sink("exfil " + DATA)
out("ALLOWED" if r == "sent" else "DENIED", f"direct connect: {r}")
"""
CONTROL = 'host'
CONTAINED = 'no route: only the proxy leads out'
