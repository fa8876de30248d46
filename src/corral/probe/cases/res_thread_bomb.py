from ._common import bounded

ID = 'res.thread-bomb'
CATEGORY = 'resource'
DESCRIPTION = 'start up to 200 waiting threads under a 32-task limit'
CLAIMS = ('rule:limits.pids',)
SAFETY = ('rule:limits.pids',)
POLICY = {'limits': {'pids': 32, 'timeout': '10s'}}
# the threads wait on an event nobody sets (os._exit ends them): every thread lives
# until the end, however slowly they start
CODE = """
import threading
never = threading.Event()
n = 0
try:
    for n in range(1, 201):
        threading.Thread(target=never.wait, daemon=True).start()
    out("ALLOWED", "started 200 threads")
except RuntimeError as e:
    out("DENIED", f"{n - 1} threads: {e}")
os._exit(0)
"""
CONTROL = {'policy': {'limits': {'pids': 1024, 'timeout': '120s'}}}
CONTAINED = 'thread creation fails at the pids limit'


def score(obs):
    return bounded(obs, 32, 'threads')
