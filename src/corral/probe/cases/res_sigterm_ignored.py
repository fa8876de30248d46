from ._common import killed_at_limit

ID = 'res.sigterm-ignored'
CATEGORY = 'resource'
DESCRIPTION = 'ignore SIGTERM, SIGINT and SIGHUP, then sleep past the wall clock'
CLAIMS = ('rule:limits.timeout',)
POLICY = {'limits': {'timeout': '500ms'}}
CODE = """
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
end = time.monotonic() + 2
while time.monotonic() < end:
    time.sleep(0.05)
out("ALLOWED", "outlived the limit by ignoring signals")
"""
CONTROL = {'policy': {'limits': {'timeout': '10s'}}}
CONTAINED = 'the run is killed (SIGKILL) at the limit despite ignoring SIGTERM'


def score(obs):
    return killed_at_limit(obs, 0.5, 'the signal-ignoring sleep')
