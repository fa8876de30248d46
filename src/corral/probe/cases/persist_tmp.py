ID = 'persist.tmp'
CATEGORY = 'persistence'
DESCRIPTION = 'plant a file in the temp directory ($TMPDIR or /tmp) and /dev/shm; does the next run see it?'
CLAIMS = ('rule:limits.scratch',)
CODE = r"""
for p in ['$TMP/corral-probe-planted', '/dev/shm/corral-probe-planted']:
    p = p.replace("$SCRATCH", SCRATCH).replace("$TMP", os.environ.get("TMPDIR", "/tmp"))
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "a") as f:
            f.write("planted by run 1\n")
    except OSError as e:
        print("could not plant", p, ename(e))
"""
SECOND = r"""
found = []
for p in ['$TMP/corral-probe-planted', '/dev/shm/corral-probe-planted']:
    p = p.replace("$SCRATCH", SCRATCH).replace("$TMP", os.environ.get("TMPDIR", "/tmp"))
    if os.path.exists(p):
        found.append(p)
out("ALLOWED" if found else "DENIED", ("found " + " ".join(found)) if found else "the next run starts clean")
"""
CONTROL = {"where": "sandbox", "code": CODE + SECOND}   # one run: the planted files are seen
CONTAINED = 'every run starts from an empty scratch: nothing planted survives'
