from ._net import ALLOW, NAIVE, PROXY, target_code

ID = "dos.proxy-connections"
CATEGORY = "dos"
DESCRIPTION = "open 1500 idle connections to the egress proxy, then let them go: is the proxy still serving?"
CLAIMS = ("rule:network.mode",)
POLICY = {**ALLOW, "limits": {"open_files": 4096, "timeout": "30s"}}
ATTACK = """
held, failed, t0 = [], 0, time.monotonic()
for _ in range(1500):
    if time.monotonic() - t0 > 10:        # bounded: a target that stalls connects ends it
        break
    try:
        held.append(socket.create_connection(target(), timeout=1))
    except OSError:
        failed += 1
during = legit_request()
for s in held:
    s.close()
time.sleep(1)
after = legit_request()
what = f"{len(held)} held, {failed} refused; a request during: {during}; after: {after}"
out("DENIED" if after.startswith("HTTP/1.1 2") else "ALLOWED", what)
"""
CODE = PROXY + target_code() + ATTACK
CONTROL = {"where": "host", "code": PROXY + target_code() + NAIVE + ATTACK}
CONTAINED = "the proxy caps and survives the flood: once it ends, an ordinary request is served again"
