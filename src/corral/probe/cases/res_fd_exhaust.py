from ._common import bounded

ID = 'res.fd-exhaust'
CATEGORY = 'resource'
DESCRIPTION = 'open socket pairs (1500 at most) under a 64 open-file limit'
CLAIMS = ('rule:limits.open_files',)
POLICY = {'limits': {'open_files': 64}}
CODE = """
held = []
try:
    for _ in range(1500):
        held += socket.socketpair()
    out("ALLOWED", f"{len(held)} fds")
except OSError as e:
    out("DENIED", f"{len(held)} fds: {ename(e)}")
"""
CONTROL = {'policy': {'limits': {'open_files': 4096}}}
CONTAINED = 'EMFILE at the open-files limit'


def score(obs):
    return bounded(obs, 64, 'fds')
