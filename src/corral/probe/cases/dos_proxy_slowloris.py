from ._net import ALLOW, NAIVE, PROXY, target_code

ID = "dos.proxy-slowloris"
CATEGORY = "dos"
DESCRIPTION = "send a request head to the egress proxy one byte every 0.25 s: how long does the proxy hold it?"
CLAIMS = ("rule:network.mode",)
POLICY = {**ALLOW, "limits": {"timeout": "30s"}}
ATTACK = """
s = socket.create_connection(target(), timeout=2)
head = f"GET http://sink.{DOMAIN}:{SINK_PORT}/ HTTP/1.1\\r\\n" + "X-Slow: " + "a" * 200
t0, cut = time.monotonic(), None
for ch in head.encode():
    try:
        s.send(bytes([ch]))
    except OSError as e:
        cut = f"send: {ename(e)}"
        break
    if time.monotonic() - t0 > 14:
        break
    import select
    if select.select([s], [], [], 0.25)[0]:          # the server spoke or closed
        got = s.recv(4096)
        cut = (got.split(b"\\r\\n")[0].decode("latin-1") or "closed")
        break
held = time.monotonic() - t0
s.close()
# the proxy's header_timeout is 10 s (egress/config.py); 2 s of slack
out("DENIED" if cut and held < 12 else "ALLOWED", f"held {held:.1f} s ({cut or 'still open'})")
"""
CODE = PROXY + target_code() + ATTACK
CONTROL = {"where": "host", "code": PROXY + target_code() + NAIVE + ATTACK}
CONTAINED = "the proxy cuts an unfinished request head at its header timeout (10 s, cut before 12 s)"
