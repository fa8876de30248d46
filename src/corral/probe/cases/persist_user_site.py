ID = "persist.user-site"
CATEGORY = "persistence"
DESCRIPTION = "plant usercustomize.py in the user site-packages: every later Python imports it at start-up"
CLAIMS = ("rule:limits.scratch",)
CODE = """
import site
d = site.getusersitepackages()
try:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "usercustomize.py"), "w") as f:
        f.write("import os; os.environ['PROBE_PLANTED'] = 'usercustomize ran'\\n")
    print("planted", d.replace(SCRATCH, "$SCRATCH"))
except OSError as e:
    print("could not plant:", ename(e))
"""
# this interpreter started after the plant: did site import the planted usercustomize?
SECOND = """
import subprocess
r = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('PROBE_PLANTED', ''))"],
                   capture_output=True, text=True).stdout.strip()
out("ALLOWED" if r else "DENIED", r or "no usercustomize ran at start-up")
"""
CONTROL = {"where": "sandbox", "code": CODE + SECOND}   # one run: a later Python imports it
CONTAINED = "the next sandbox starts with an empty user site: nothing planted runs"
