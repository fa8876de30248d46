ID = 'dos.pipe-deadlock'
CATEGORY = 'dos'
DESCRIPTION = 'fill stderr (4 MiB) before writing a byte of stdout, then block (3 s) past a 1.5 s limit'
CLAIMS = ('rule:limits.timeout', 'rule:limits.output')
POLICY = {'limits': {'timeout': '1500ms', 'output': '64K'}}
CODE = r"""
os.write(2, b"e" * (4 << 20))
os.write(1, b"PROBE DENIED stderr drained\n")
time.sleep(3)
"""
CONTROL = {'policy': {'limits': {'timeout': '8s'}}}
CONTAINED = 'both streams are drained (stdout arrives) and the timeout still fires'


def score(obs):
    if obs.result is None:
        return False, "no Result"
    got = "stderr drained" in obs.result["stdout"]
    wall = obs.result["usage"]["wall_s"]
    if got and obs.verdict == "timeout" and wall < 4:
        return True, f"stdout arrived after 4 MiB of stderr; timeout at {wall:.1f}s"
    return False, f"stdout arrived={got}, verdict {obs.verdict} at {wall:.1f}s"
