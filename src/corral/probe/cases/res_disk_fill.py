from ._common import bounded

ID = 'res.disk-fill'
CATEGORY = 'resource'
DESCRIPTION = 'write 1 MiB files (64 MiB at most) under an 8 MiB scratch cap'
CLAIMS = ('rule:limits.scratch',)
SAFETY = ('rule:limits.scratch',)
POLICY = {'limits': {'scratch': '8M'}}
CODE = """
d = os.path.join(SCRATCH, "fill"); os.makedirs(d, exist_ok=True)
chunk = b"x" * (1 << 20)
n = 0
try:
    for n in range(64):
        with open(os.path.join(d, str(n)), "wb") as f:
            f.write(chunk)
    out("ALLOWED", "wrote 64 MiB")
except OSError as e:
    out("DENIED", f"{n} MiB: {ename(e)}")
"""
CONTROL = {'policy': {'limits': {'scratch': '128M'}}}
CONTAINED = 'ENOSPC at the scratch cap; nothing outside scratch fills'


def score(obs):
    return bounded(obs, 8, 'MiB')
