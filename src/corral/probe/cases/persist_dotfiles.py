ID = 'persist.dotfiles'
CATEGORY = 'persistence'
DESCRIPTION = 'append to ~/.bashrc, ~/.profile, ~/.gitconfig and a pip cache; does the next run see them?'
CLAIMS = ('rule:limits.scratch',)
CODE = r"""
for p in ['$SCRATCH/.bashrc', '$SCRATCH/.profile', '$SCRATCH/.gitconfig', '$SCRATCH/.cache/pip/planted']:
    p = p.replace("$SCRATCH", SCRATCH)
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "a") as f:
            f.write("planted by run 1\n")
    except OSError as e:
        print("could not plant", p, ename(e))
"""
SECOND = r"""
found = []
for p in ['$SCRATCH/.bashrc', '$SCRATCH/.profile', '$SCRATCH/.gitconfig', '$SCRATCH/.cache/pip/planted']:
    p = p.replace("$SCRATCH", SCRATCH)
    if os.path.exists(p):
        found.append(p)
out("ALLOWED" if found else "DENIED", ("found " + " ".join(found)) if found else "the next run starts clean")
"""
CONTROL = {"where": "sandbox", "code": CODE + SECOND}   # one run: the planted files are seen
CONTAINED = 'every run starts from an empty scratch: nothing planted survives'
