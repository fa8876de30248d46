ID = "res.memory"
CATEGORY = "resource"
DESCRIPTION = "allocate and touch 256 MiB in 8 MiB steps under a 64 MiB memory limit"
CLAIMS = ("rule:limits.memory",)
SAFETY = ("rule:limits.memory",)
POLICY = {"limits": {"memory": "64M", "timeout": "10s"}}
CODE = """
held = []
try:
    for i in range(32):
        held.append(bytearray(8 << 20))   # zero-filled: every page touched
    out("ALLOWED", "held 256 MiB")
except MemoryError:
    out("DENIED", f"MemoryError after {len(held) * 8} MiB")
"""
CONTROL = {"policy": {"limits": {"memory": "512M", "timeout": "120s"}}}
CONTAINED = "the memory cgroup stops it (verdict oom or MemoryError) with the peak at the limit"


def score(obs):
    if obs.tag("ALLOWED") is not None:
        return False, "held all 256 MiB"
    peak = obs.result["usage"].get("memory_peak_bytes")
    peak_s = f", peak {peak / 2**20:.0f} MiB" if peak else ""
    if peak and peak > 72 * 2**20:
        return False, f"peak {peak / 2**20:.0f} MiB is past the 64 MiB limit"
    if obs.verdict == "oom" or obs.tag("DENIED"):
        return True, (f"verdict {obs.verdict}" + (f", {obs.tag('DENIED')}" if obs.tag("DENIED") else "")
                      + peak_s)
    return None, f"inconclusive: verdict {obs.verdict}{peak_s}"
