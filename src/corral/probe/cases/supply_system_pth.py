ID = 'supply.system-pth'
CATEGORY = 'supply-chain'
DESCRIPTION = 'drop a .pth into the system site-packages (runs in every later Python on the host)'
CLAIMS = ('read_only_root',)
SAFETY = ('read_only_root',)
CODE = r"""
import glob
dirs = sorted(glob.glob("/usr/lib/python3*/dist-packages")) + sorted(glob.glob("/usr/local/lib/python3*/dist-packages"))
res = []
for d in dirs:
    p = os.path.join(d, f"corral-probe-{RUN_ID}.pth")
    try:
        with open(p, "w") as f:
            f.write("import os\n")
        os.unlink(p)                      # planted only for the instant of the check
        out("ALLOWED", f"wrote {p}")
        sys.exit(0)
    except OSError as e:
        res.append(f"{d}: {ename(e)}")
out("DENIED", "; ".join(res[:2]))
"""
CONTROL = {'where': 'sandbox', 'code': '\nimport site, subprocess\nd = site.getusersitepackages(); os.makedirs(d, exist_ok=True)\nwith open(os.path.join(d, "probe.pth"), "w") as f:\n    f.write("import sys; print(\'PROBE ALLOWED a .pth ran at start-up\')\\n")\nsubprocess.run([sys.executable, "-c", "pass"])\n'}
CONTAINED = 'the system site-packages are read-only (EROFS/EACCES)'
