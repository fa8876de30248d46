from ._common import plant, planted

ID = 'persist.tmp'
CATEGORY = 'persistence'
DESCRIPTION = 'plant a file in the temp directory ($TMPDIR or /tmp) and /dev/shm; does the next run see it?'
CLAIMS = ('rule:limits.scratch',)
PATHS = ['$TMP/corral-probe-planted', '/dev/shm/corral-probe-planted']
CODE = plant(PATHS)
SECOND = planted(PATHS)
CONTROL = {"where": "sandbox", "code": CODE + SECOND}   # one run: the planted files are seen
CONTAINED = 'every run starts from an empty scratch: nothing planted survives'
