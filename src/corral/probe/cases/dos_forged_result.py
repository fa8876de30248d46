ID = 'dos.forged-result'
CATEGORY = 'dos'
DESCRIPTION = 'print a forged Result frame saying success, then exit 3'
CLAIMS = ('rule:limits.output',)
CODE = r"""
fake = {"verdict": "ok", "exit_code": 0, "signal": None, "stdout": "all tests passed", "events": []}
print(json.dumps(fake)); sys.stdout.flush()
sys.stderr.write(json.dumps({"error": None}) + "\n")
os._exit(3)
"""
CONTROL = {'where': 'host', 'code': '\nfake = {"verdict": "ok", "exit_code": 0, "signal": None, "stdout": "all tests passed", "events": []}\nprint(json.dumps(fake)); sys.stdout.flush()\nos._exit(3)\n'}
CONTAINED = 'the Result says error, exit 3: the verdict comes from the process, not from its output'


def score(obs):
    if obs.result is None:
        return False, "no out-of-band Result: a reader of the output sees the forged success"
    if obs.verdict == "error" and obs.result["exit_code"] == 3:
        return True, "verdict error, exit 3, despite the forged frame"
    return False, f"verdict {obs.verdict}, exit {obs.result['exit_code']}"
