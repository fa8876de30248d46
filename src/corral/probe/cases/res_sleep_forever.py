from ._common import killed_at_limit

ID = 'res.sleep-forever'
CATEGORY = 'resource'
DESCRIPTION = 'sleep (2 s, bounded) under a 0.5 s wall clock: CPU limits never fire on an idle process'
CLAIMS = ('rule:limits.timeout',)
POLICY = {'limits': {'timeout': '500ms'}}
CODE = """
time.sleep(2)
out("ALLOWED", "slept 2 s")
"""
CONTROL = {'policy': {'limits': {'timeout': '10s'}}}
CONTAINED = 'the wall clock ends the run: verdict timeout well under 2 s'


def score(obs):
    return killed_at_limit(obs, 0.5, 'the sleep')
