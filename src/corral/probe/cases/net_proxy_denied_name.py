ID = 'net.proxy-denied-name'
CATEGORY = 'network'
DESCRIPTION = 'POST the data through the egress proxy to a name the policy does not allow'
CLAIMS = ('rule:network.mode',)
POLICY = {'network': {'mode': 'allow', 'allow': ['ok.{DOMAIN}:{SINK_PORT}'], 'allow_private': ['{CIDR}'], 'nameservers': ['{DNS_HOST}:{DNS_PORT}']}}
CODE = r"""
st = via_proxy(f"http://sink.{DOMAIN}:{SINK_PORT}/", data=DATA.encode())
out("ALLOWED" if st.startswith("200") else "DENIED", f"proxy: {st}")
"""
CONTROL = {'policy': {'network': {'allow': ['sink.{DOMAIN}:{SINK_PORT}']}}}
CONTAINED = '403 from the proxy; the sink receives nothing'
