ID = 'res.daemon'
CATEGORY = 'resource'
DESCRIPTION = 'double-fork and setsid a daemon that tries to outlive the run'
CLAIMS = ('rule:limits.timeout',)
CODE = """
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 256)
        os.execv("/usr/bin/python3", ["python3", "-c", "import time; time.sleep(4)",
                                      f"corral-probe-daemon-{RUN_ID}"])
    os._exit(0)
time.sleep(0.3)
out("DENIED", "the daemon is started; whether it survives is seen from outside")
"""
CONTROL = 'host'
CONTAINED = 'no process of the run is alive once the run returns'


def score(obs):
    # a surviving daemon is caught before this (ESCAPE); here it was gone
    if obs.tag("DENIED") is None:
        return None, "inconclusive: the daemon was not started"
    return True, "no process of the run outlived it"
