from ._common import bounded

ID = 'res.file-size'
CATEGORY = 'resource'
DESCRIPTION = 'write one 16 MiB file under a 1 MiB file-size limit'
CLAIMS = ('rule:limits.file_size',)
POLICY = {'limits': {'file_size': '1M'}}
CODE = """
n = 0
try:
    with open(os.path.join(SCRATCH, "big"), "wb") as f:
        for n in range(16):
            f.write(b"y" * (1 << 20)); f.flush()
    out("ALLOWED", "wrote 16 MiB")
except OSError as e:
    out("DENIED", f"{n} MiB: {ename(e)}")
"""
CONTROL = {'policy': {'limits': {'file_size': '64M'}}}
CONTAINED = 'EFBIG (or SIGXFSZ) at the file-size limit'


def score(obs):
    return bounded(obs, 1, 'MiB')
