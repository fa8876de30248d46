ID = "supply.install-typosquat"
CATEGORY = "supply-chain"
DESCRIPTION = ("corral install reqests: a name one letter from requests, served by the index "
               "with a .pth that leaks at start-up")
CLAIMS = ("install phase: typosquat check",)
CODE = ""   # runs through the install phase (INSTALL below)
CONTROL = "host"
CONTAINED = "refused before any sandbox runs: the index never sees a request"


def _score(obs):
    asked = obs.hits["A"]
    if obs.where == "host":
        return (False, f"pip fetched the squatted name: {asked[0]}") if asked else \
            (None, "inconclusive: the control did not reach the index")
    if asked:
        return False, f"the index was asked: {asked[0]}"
    if "close to the popular package 'requests'" not in obs.supervisor_stderr:
        return None, f"inconclusive: refused for another reason ({obs.supervisor_stderr[-200:]!r})"
    return True, "refused by the typosquat check (near 'requests'); the index saw nothing"


INSTALL = {
    "indexes": {"A": {"reqests": [("wheel", "2.99", {
        "reqests.pth": "import reqests_boot\n", "reqests_boot.py": "{LOOT}"})]}},
    "args": ["--index-url", "{A}", "reqests"],
    "control": ["--index-url", "{A}", "reqests"],
    "control_run": True,
    "score": _score,
}
