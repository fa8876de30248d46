ID = 'net.host-header'
CATEGORY = 'network'
DESCRIPTION = 'absolute-form request to an allowed name with a Host header naming another'
CLAIMS = ('rule:network.mode',)
POLICY = {'network': {'mode': 'allow', 'allow': ['ok.{DOMAIN}:{SINK_PORT}'], 'allow_private': ['{CIDR}'], 'nameservers': ['{DNS_HOST}:{DNS_PORT}']}}
CODE = r"""
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1) if "HTTP_PROXY" in os.environ else ("", "0")
target = f"ok.{DOMAIN}:{SINK_PORT}"
hdr = os.environ.get("PROBE_HOST_HEADER", f"evil.example:{SINK_PORT}")
try:
    with socket.create_connection((host, int(port)), timeout=3) as s:
        s.sendall(f"POST http://{target}/ HTTP/1.1\r\nHost: {hdr}\r\nContent-Length: {len(DATA)}\r\nConnection: close\r\n\r\n{DATA}".encode())
        line = s.recv(4096).split(b"\r\n")[0].decode()
    out("ALLOWED" if " 200 " in line else "DENIED", line)
except (OSError, ValueError) as e:
    out("DENIED", f"proxy: {ename(e)}")
"""
CONTROL = {'policy': {'env': {'set': {'PROBE_HOST_HEADER': 'ok.{DOMAIN}:{SINK_PORT}'}}}}
CONTAINED = 'the proxy refuses a Host that differs from the target; the sink receives nothing'
