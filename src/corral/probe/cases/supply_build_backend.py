from ._net import LOOT

ID = "supply.build-backend"
CATEGORY = "supply-chain"
DESCRIPTION = ("pip builds a local source tree whose in-tree PEP 517 backend (pyproject.toml "
               "backend-path) reads the canaries and posts them to the sink")
CLAIMS = ("host_fs_hidden", "rule:env", "rule:network (namespace)")
POLICY = {"limits": {"timeout": "60s"}}
CODE = LOOT + """
import subprocess
src = os.path.join(SCRATCH, "pkg")
os.makedirs(src, exist_ok=True)
open(os.path.join(src, "pyproject.toml"), "w").write(
    '[build-system]\\nrequires = []\\nbuild-backend = "probe_backend"\\nbackend-path = ["."]\\n')
open(os.path.join(src, "probe_backend.py"), "w").write(loot_source() + '''
def build_wheel(*a, **k):
    raise RuntimeError("the probe's backend builds nothing")
''')
p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-index", "--no-deps",
                    "--no-cache-dir", "--disable-pip-version-check", "--no-build-isolation",
                    "-w", os.path.join(SCRATCH, "out"), src], capture_output=True, text=True)
print(p.stdout[-4000:])
if not loot_ran():
    out("UNSUPPORTED", f"pip exit {p.returncode}: the backend was not imported ({p.stderr[-200:]!r})")
else:
    out("DENIED", "the backend ran; what it found and sent is seen from outside")
"""
CONTROL = "host"
CONTAINED = "the backend runs but finds no secret and reaches no sink"
