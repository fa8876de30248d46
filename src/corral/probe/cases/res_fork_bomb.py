from ._common import bounded

ID = 'res.fork-bomb'
CATEGORY = 'resource'
DESCRIPTION = 'fork up to 100 waiting processes under a 32-process limit'
CLAIMS = ('rule:limits.pids',)
SAFETY = ('rule:limits.pids',)
POLICY = {'limits': {'pids': 32, 'timeout': '10s'}}
# each child waits on a pipe only the parent holds open: every child lives until the
# parent exits, however slowly the fork loop runs (gVisor's ptrace platform forks slowly)
CODE = """
r, w = os.pipe()
n = 0
try:
    for n in range(1, 101):
        if os.fork() == 0:
            os.close(w); os.close(1); os.close(2)
            os.read(r, 1)                 # EOF once the parent is gone
            os._exit(0)
    out("ALLOWED", "forked 100 processes")
except OSError as e:
    out("DENIED", f"{n - 1} processes: {ename(e)}")
"""
CONTROL = {'policy': {'limits': {'pids': 1024, 'memory': '2G', 'timeout': '120s'}}}
CONTAINED = 'fork fails (EAGAIN) at the pids limit; the supervisor stays responsive'


def score(obs):
    return bounded(obs, 32, 'processes')
