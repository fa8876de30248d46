from ._net import ALLOW, NAIVE, PROXY, target_code

ID = "dos.proxy-connections"
CATEGORY = "dos"
DESCRIPTION = ("open 1500 idle connections to the egress proxy (its cap is 512), then let "
               "them go: are those past the cap refused, and is the proxy still serving?")
CLAIMS = ("rule:network.mode",)
POLICY = {**ALLOW, "limits": {"open_files": 4096, "timeout": "30s"}}
ATTACK = """
CAP = 512                                 # the proxy's max_connections (docs/network.md)
held, failed, t0 = [], 0, time.monotonic()
for _ in range(1500):
    if time.monotonic() - t0 > 10:        # bounded: a target that stalls connects ends it
        break
    try:
        held.append(socket.create_connection(target(), timeout=1))
    except OSError:
        failed += 1
during = legit_request()
# a listener accepts in order: once `during` has its answer, every connection made before
# it has been accepted, and each one past the cap has its 503 (or was closed)
refused = 0
for s in held:
    s.setblocking(False)                  # a look, never a wait
    try:
        got = s.recv(64, socket.MSG_PEEK)
        refused += not got or got.startswith(b"HTTP/1.1 503")
    except BlockingIOError:
        pass                              # admitted, waiting for a request head
    except OSError:
        refused += 1                      # reset
admitted = len(held) - refused
for s in held:
    s.close()
time.sleep(1)
after = legit_request()
what = (f"{len(held)} held ({failed} connects failed): {admitted} admitted, {refused} refused "
        f"(cap {CAP}); a request during: {during}; after: {after}")
ok = (len(held) > CAP and admitted <= CAP and during.startswith("HTTP/1.")
      and after.startswith("HTTP/1.1 2"))
out("DENIED" if ok else "ALLOWED", what)
"""
CODE = PROXY + target_code() + ATTACK
CONTROL = {"where": "host", "code": PROXY + target_code() + NAIVE + ATTACK}
CONTAINED = ("the proxy admits at most its cap (those past it get a 503 at once), answers a "
             "request in the middle of the flood, and serves again once it ends")
