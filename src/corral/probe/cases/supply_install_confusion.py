ID = "supply.install-confusion"
CATEGORY = "supply-chain"
DESCRIPTION = ("dependency confusion: the user names index A, which has probe-internal 1.0; "
               "the requirements file adds --extra-index-url B, an index serving "
               "probe-internal 99.0 with a .pth that leaks")
CLAIMS = ("install phase: only the named indexes",)
CODE = ""   # runs through the install phase (INSTALL below)
CONTROL = "host"
CONTAINED = "index B, which the user did not name, is unreachable: it sees no request"


def _score(obs):
    b = obs.hits["B"]
    if obs.where == "host":
        return (False, f"pip asked index B: {b[0]}") if b else \
            (None, "inconclusive: the control did not reach index B")
    if b:
        return False, f"index B was asked: {b[0]}"
    return True, f"index B saw nothing (install exit {obs.rc}: from index A or nothing)"


INSTALL = {
    "indexes": {
        "A": {"probe-internal": [("wheel", "1.0", {"probe_internal.py": "V = 1\n"})]},
        "B": {"probe-internal": [("wheel", "99.0", {
            "probe_internal.py": "V = 99\n", "probe_internal.pth": "import probe_confused\n",
            "probe_confused.py": "{LOOT}"})]},
    },
    "args": ["--index-url", "{A}"],
    "requirements": "--extra-index-url {B}\nprobe-internal\n",
    "run": "import probe_internal; print('VERSION', probe_internal.V)",
    "control": ["--index-url", "{A}"],
    "control_run": True,
    "score": _score,
}
