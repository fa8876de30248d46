from ._common import bounded

ID = 'res.fork-bomb'
CATEGORY = 'resource'
DESCRIPTION = 'fork up to 100 sleeping processes under a 32-process limit'
CLAIMS = ('rule:limits.pids',)
SAFETY = ('rule:limits.pids',)
POLICY = {'limits': {'pids': 32, 'timeout': '10s'}}
CODE = """
n = 0
try:
    for n in range(1, 401):
        if os.fork() == 0:
            os.close(1); os.close(2)
            time.sleep(3)
            os._exit(0)
    out("ALLOWED", "forked 100 processes")
except OSError as e:
    out("DENIED", f"{n - 1} processes: {ename(e)}")
"""
CONTROL = {'policy': {'limits': {'pids': 1024, 'memory': '2G'}}}
CONTAINED = 'fork fails (EAGAIN) at the pids limit; the supervisor stays responsive'


def score(obs):
    return bounded(obs, 32, 'processes')
