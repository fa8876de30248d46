from ._common import bounded

ID = 'res.inode-fill'
CATEGORY = 'resource'
DESCRIPTION = 'create empty files (3000 at most) under a 256-inode scratch cap'
CLAIMS = ('rule:limits.scratch',)
SAFETY = ('rule:limits.scratch',)
POLICY = {'limits': {'scratch_inodes': 256}}
CODE = """
d = os.path.join(SCRATCH, "inodes"); os.makedirs(d, exist_ok=True)
n = 0
try:
    for n in range(3000):
        open(os.path.join(d, str(n)), "w").close()
    out("ALLOWED", "created 3000 files")
except OSError as e:
    out("DENIED", f"{n} files: {ename(e)}")
"""
CONTROL = {'policy': {'limits': {'scratch_inodes': 65536}}}
CONTAINED = 'ENOSPC at the inode cap'


def score(obs):
    return bounded(obs, 256, 'files')
