from ._common import BOUND_S, killed_at_limit

ID = 'res.cpu-time'
CATEGORY = 'resource'
DESCRIPTION = f'spin for {BOUND_S} s of CPU time under a 0.5 s CPU-time limit (and a 120 s wall clock)'
CLAIMS = ('rule:limits.cpu_time',)
# the wall clock is far off: on a busy machine the spin gets a fraction of a core, and it
# is the CPU-time limit that must end it
POLICY = {'limits': {'cpu_time': '500ms', 'timeout': '120s'}}
# bounded by the CPU time it used, not by the clock: a spin that gets a tenth of a core
# still uses {BOUND_S} s of CPU before it prints
CODE = f"""
while time.process_time() < {BOUND_S}:
    pass
out("ALLOWED", "spun for {BOUND_S} s of CPU time")
"""
CONTROL = {'policy': {'limits': {'cpu_time': '120s'}}}
CONTAINED = 'the run is stopped at the CPU-time limit (verdict timeout, cpu_time event)'


def score(obs):
    return killed_at_limit(obs, "cpu_time", "the spin")
