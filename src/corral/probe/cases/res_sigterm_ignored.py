from ._common import BOUND_S, killed_at_limit

ID = 'res.sigterm-ignored'
CATEGORY = 'resource'
DESCRIPTION = 'ignore SIGTERM, SIGINT and SIGHUP, then sleep past the wall clock'
CLAIMS = ('rule:limits.timeout',)
POLICY = {'limits': {'timeout': '500ms'}}
CODE = f"""
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
end = time.monotonic() + {BOUND_S}
while time.monotonic() < end:
    time.sleep(0.05)
out("ALLOWED", "outlived the limit by ignoring signals")
"""
CONTROL = {'policy': {'limits': {'timeout': '120s'}}}
CONTAINED = 'the run is killed (SIGKILL) at the limit despite ignoring SIGTERM'


def score(obs):
    return killed_at_limit(obs, "timeout", 'the signal-ignoring sleep')
