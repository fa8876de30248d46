from ._common import BOUND_S, killed_at_limit

ID = "res.busy-loop"
CATEGORY = "resource"
DESCRIPTION = f"spin the CPU (a {BOUND_S} s bounded busy loop) past a 0.5 s wall-clock limit"
CLAIMS = ("rule:limits.timeout",)
POLICY = {"limits": {"timeout": "500ms"}}
CODE = f"""
end = time.monotonic() + {BOUND_S}
while time.monotonic() < end:
    pass
out("ALLOWED", "the loop ran its full {BOUND_S} s")
"""
CONTROL = {"policy": {"limits": {"timeout": "120s"}}}
CONTAINED = f"the run is killed at the wall-clock limit: verdict timeout before the {BOUND_S} s loop ends"


def score(obs):
    return killed_at_limit(obs, "timeout", "the loop")
