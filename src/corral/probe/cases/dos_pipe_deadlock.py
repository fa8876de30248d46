ID = 'dos.pipe-deadlock'
CATEGORY = 'dos'
DESCRIPTION = 'fill stderr (1 MiB, 16 pipe buffers) before writing a byte of stdout, then block (4 s) past a 3 s limit'
CLAIMS = ('rule:limits.timeout', 'rule:limits.output')
# the limit leaves time for the writes on a slow machine; the sleep outlasts it, so only
# the timeout can end the attack (the control, with the limit off, sleeps to its end)
POLICY = {'limits': {'timeout': '3s', 'output': '64K'}}
CODE = r"""
os.write(2, b"e" * (1 << 20))
os.write(1, b"PROBE DENIED stderr drained\n")
time.sleep(4)
"""
CONTROL = {'policy': {'limits': {'timeout': '120s'}}}
CONTAINED = 'both streams are drained (stdout arrives) and the timeout still fires'


def score(obs):
    if obs.result is None:
        return False, "no Result"
    got = "stderr drained" in obs.result["stdout"]
    wall = obs.result["usage"]["wall_s"]
    # verdict timeout: the deadline passed while it slept (how long the kill took is not
    # judged: a slower machine kills more slowly)
    if got and obs.verdict == "timeout":
        return True, f"stdout arrived after 1 MiB of stderr; timeout, ended at {wall:.1f}s"
    return False, f"stdout arrived={got}, verdict {obs.verdict} at {wall:.1f}s"
