from ._common import plant, planted

ID = 'persist.scratch'
CATEGORY = 'persistence'
DESCRIPTION = 'plant a file in scratch; does the next run see it?'
CLAIMS = ('rule:limits.scratch',)
PATHS = ['$SCRATCH/.planted']
CODE = plant(PATHS)
SECOND = planted(PATHS)
CONTROL = {"where": "sandbox", "code": CODE + SECOND}   # one run: the planted files are seen
CONTAINED = 'every run starts from an empty scratch: nothing planted survives'
