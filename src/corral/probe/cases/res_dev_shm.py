from ._common import bounded

ID = 'res.dev-shm'
CATEGORY = 'resource'
DESCRIPTION = 'use /dev/shm as hidden RAM: write up to 64 MiB there under an 8 MiB scratch cap'
CLAIMS = ('rule:limits.scratch',)
SAFETY = ('rule:limits.scratch',)
POLICY = {'limits': {'scratch': '8M'}}
CODE = """
p = f"/dev/shm/corral-probe-{RUN_ID}"
chunk = b"x" * (1 << 20)
n = 0
try:
    with open(p, "wb") as f:
        for n in range(64):
            f.write(chunk); f.flush()
    out("ALLOWED", "wrote 64 MiB to /dev/shm")
except OSError as e:
    out("DENIED", f"{n} MiB: {ename(e)}")
finally:
    try:
        os.unlink(p)
    except OSError:
        pass
"""
CONTROL = 'host'
CONTAINED = "ENOSPC at the scratch cap (or no write access to the host's /dev/shm)"


def score(obs):
    return bounded(obs, 8, 'MiB')
