ID = "res.busy-loop"
CATEGORY = "resource"
DESCRIPTION = "spin the CPU (a 2 s bounded busy loop) past a 0.5 s wall-clock limit"
CLAIMS = ("rule:limits.timeout",)
POLICY = {"limits": {"timeout": "500ms"}}
CODE = """
end = time.monotonic() + 2
while time.monotonic() < end:
    pass
out("ALLOWED", "the loop ran its full 2 s")
"""
CONTROL = {"policy": {"limits": {"timeout": "10s"}}}
CONTAINED = "the run is killed at the wall-clock limit: verdict timeout, well under 2 s"


def score(obs):
    if obs.tag("ALLOWED") is not None:
        return False, "the loop ran its full 2 s"
    wall = obs.result["usage"]["wall_s"]
    if obs.verdict == "timeout" and wall < 2.0:
        return True, f"verdict timeout after {wall:.2f}s"
    return False, f"verdict {obs.verdict} after {wall:.2f}s"
