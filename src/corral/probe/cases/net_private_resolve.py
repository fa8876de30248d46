ID = 'net.private-resolve'
CATEGORY = 'network'
DESCRIPTION = 'an allowed name that resolves to a loopback/private address (SSRF, rebinding)'
CLAIMS = ('rule:network.mode',)
POLICY = {'network': {'mode': 'allow', 'allow': ['sink.{DOMAIN}:{SINK_PORT}'], 'nameservers': ['{DNS_HOST}:{DNS_PORT}']}}
CODE = r"""
st = via_proxy(f"http://sink.{DOMAIN}:{SINK_PORT}/", data=DATA.encode())
out("ALLOWED" if st.startswith("200") else "DENIED", f"proxy: {st}")
"""
CONTROL = {'policy': {'network': {'allow_private': ['{CIDR}']}}}
CONTAINED = 'the proxy refuses the private address it resolved; the sink receives nothing'
