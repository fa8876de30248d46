from ._common import killed_at_limit

ID = 'res.cpu-time'
CATEGORY = 'resource'
DESCRIPTION = 'spin the CPU for 2 s under a 0.5 s CPU-time limit and a 10 s wall clock'
CLAIMS = ('rule:limits.cpu_time',)
POLICY = {'limits': {'cpu_time': '500ms', 'timeout': '10s'}}
CODE = """
end = time.monotonic() + 2
while time.monotonic() < end:
    pass
out("ALLOWED", "spun for 2 s")
"""
CONTROL = {'policy': {'limits': {'cpu_time': '20s'}}}
CONTAINED = 'the run is stopped at the CPU-time limit (verdict timeout, cpu_time event)'


def score(obs):
    return killed_at_limit(obs, 0.5, 'the spin')
