from ._common import BOUND_S, killed_at_limit

ID = 'res.sleep-forever'
CATEGORY = 'resource'
DESCRIPTION = f'sleep ({BOUND_S} s, bounded) under a 0.5 s wall clock: CPU limits never fire on an idle process'
CLAIMS = ('rule:limits.timeout',)
POLICY = {'limits': {'timeout': '500ms'}}
CODE = f"""
time.sleep({BOUND_S})
out("ALLOWED", "slept {BOUND_S} s")
"""
CONTROL = {'policy': {'limits': {'timeout': '120s'}}}
CONTAINED = f'the wall clock ends the run: verdict timeout before the {BOUND_S} s sleep ends'


def score(obs):
    return killed_at_limit(obs, "timeout", 'the sleep')
