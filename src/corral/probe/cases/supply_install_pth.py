ID = "supply.install-pth"
CATEGORY = "supply-chain"
DESCRIPTION = ("corral install of a wheel whose .pth runs at every Python start-up, reads the "
               "host's home and the supervisor's secret and posts them to the sink; then a run "
               "on the installed image starts Python")
CLAIMS = ("host_fs_hidden", "rule:env", "rule:network (namespace)")
CODE = ""   # runs through the install phase (INSTALL below)
CONTROL = "host"
CONTAINED = ("the .pth runs in the run's sandbox (and never during the install) but finds no "
             "secret and reaches no sink")


def _score(obs):
    if obs.where == "host":
        return None, "inconclusive: the control's .pth did not leak"
    if obs.rc != 0:
        return None, f"inconclusive: corral install failed ({obs.supervisor_stderr[-200:]!r})"
    if "LOOT" not in obs.stdout:
        return None, "inconclusive: the .pth did not run in the run on the image"
    return True, "the .pth ran at start-up: no canary, no sink"


INSTALL = {
    "indexes": {"A": {"probe-pth": [("wheel", "1.0", {
        "probe_pth.pth": "import probe_pth_boot\n",
        "probe_pth_boot.py": "{LOOT}"})]}},
    "args": ["--index-url", "{A}", "probe-pth"],
    "run": "pass",
    "control": ["--index-url", "{A}", "probe-pth"],
    "control_run": True,
    "score": _score,
}
