ID = 'res.daemon'
CATEGORY = 'resource'
DESCRIPTION = 'double-fork and setsid a daemon that tries to outlive the run'
CLAIMS = ('rule:limits.timeout',)
# The parent returns once the daemon has exec'd (its close-on-exec pipe end closes then),
# however slow the machine: no fixed wait. The daemon sleeps far longer than any run
# takes; the run's teardown (or the probe, when it escaped) kills it.
CODE = """
r, w = os.pipe()                          # both close-on-exec
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, w); os.closerange(w + 1, 256)
        os.execv("/usr/bin/python3", ["python3", "-c", "import time; time.sleep(300)",
                                      f"corral-probe-daemon-{RUN_ID}"])
    os._exit(0)
os.close(w)
os.read(r, 1)                             # EOF: the daemon exec'd (or its fork failed)
out("DENIED", "the daemon is started; whether it survives is seen from outside")
"""
CONTROL = 'host'
CONTAINED = 'no process of the run is alive once the run returns'


def score(obs):
    # a surviving daemon is caught before this (ESCAPE); here it was gone
    if obs.tag("DENIED") is None:
        return None, "inconclusive: the daemon was not started"
    return True, "no process of the run outlived it"
