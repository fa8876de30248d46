from ._net import ALLOW

ID = "net.proxy-metadata"
CATEGORY = "network"
DESCRIPTION = "ask the proxy for http://169.254.169.254/ (and its decimal and mapped spellings) with allow_private off"
CLAIMS = ("rule:network.mode",)
POLICY = ALLOW
# Not runnable harmlessly with the probe's parts: the proxy runs in the host's network
# namespace, so a proxy that failed open would send the request to the real metadata address
# (off the machine). It needs a metadata stand-in the probe owns: the proxy's upstream side in
# a network namespace holding 169.254.169.254 (see tests/particular/test_egress_proxy.py, which does it
# for the bare proxy). Until then it reports itself unsupported, everywhere.
CODE = """
out("UNSUPPORTED", "needs a metadata stand-in in a network namespace the probe owns")
"""
CONTROL = "host"
CONTAINED = "the proxy refuses the metadata address in every spelling without connecting"
