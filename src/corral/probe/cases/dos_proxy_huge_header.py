from ._net import ALLOW, NAIVE, PROXY, target_code

ID = "dos.proxy-huge-header"
CATEGORY = "dos"
DESCRIPTION = "send the egress proxy a request head that never ends (64 MiB of one header line)"
CLAIMS = ("rule:network.mode",)
POLICY = {**ALLOW, "limits": {"timeout": "30s"}}
ATTACK = """
s = socket.create_connection(target(), timeout=3)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
s.sendall(f"GET http://sink.{DOMAIN}:{SINK_PORT}/ HTTP/1.1\\r\\nX-Big: ".encode())
chunk, sent, stop = b"a" * 65536, 0, None
while sent < 64 << 20:
    try:
        s.sendall(chunk)
        sent += len(chunk)
    except OSError as e:              # reset, or the server stopped reading (timeout)
        stop = ename(e)
        break
s.close()
after = legit_request()
# the proxy's head cap is 16 KiB (egress/config.py max_header_bytes); loopback socket buffers
# can take a few MiB the server never reads, hence 8 MiB
what = f"{sent >> 10} KiB of header taken ({stop or 'all of it'}); a request after: {after}"
out("DENIED" if stop and sent < 8 << 20 and after.startswith("HTTP/1.1 2") else "ALLOWED", what)
"""
CODE = PROXY + target_code() + ATTACK
CONTROL = {"where": "host", "code": PROXY + target_code() + NAIVE + ATTACK}
CONTAINED = "the proxy refuses a head past its 16 KiB cap (the sender is cut before 8 MiB) and keeps serving"
