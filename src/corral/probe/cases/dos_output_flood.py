ID = 'dos.output-flood'
CATEGORY = 'dos'
DESCRIPTION = 'flood stdout with 8 MiB of random bytes (no newlines, invalid UTF-8) under a 64 KiB output cap'
CLAIMS = ('rule:limits.output',)
POLICY = {'limits': {'output': '64K'}}
CODE = r"""
chunk = os.urandom(1 << 20)
for _ in range(8):
    os.write(1, chunk)
os.write(2, b"\nPROBE DENIED flood written\n")
"""
CONTROL = {'policy': {'limits': {'output': '32M', 'timeout': '120s'}}}
CONTAINED = 'the Result keeps at most 64 KiB, is marked truncated, and the supervisor stays well'


def score(obs):
    if obs.result is None:
        return False, "no Result (the flood reached the host unbounded)"
    n = len(obs.result["stdout"])   # characters: each raw byte is at most one
    if obs.result["stdout_truncated"] and n <= 64 * 1024 + 64:
        return True, f"kept {n} bytes, truncated, verdict {obs.verdict}"
    return False, f"kept {n} bytes (truncated={obs.result['stdout_truncated']})"
