ID = "supply.install-sdist"
CATEGORY = "supply-chain"
DESCRIPTION = ("corral install of a name an index serves only as an sdist whose setup.py "
               "reads the canaries and posts them to the sink")
CLAIMS = ("install phase: wheels only",)
CODE = ""   # runs through the install phase (INSTALL below), not as code in a sandbox
CONTROL = "host"
CONTAINED = ("wheels only: the sdist is never fetched, its setup.py never runs (the control, "
             "pip on the host without --only-binary, runs it and leaks)")


def _score(obs):
    fetched = [h for h in obs.hits["A"] if "/files/probe_sdist" in h]
    if obs.where == "host":
        return (False, "pip fetched and built the sdist: setup.py ran") if fetched else \
            (None, "inconclusive: the control did not fetch the sdist")
    if fetched:
        return False, f"the sdist was fetched: {fetched[0]}"
    if obs.rc == 0:
        return False, "the install succeeded: something was installed from the sdist"
    return True, "refused by wheels only: the sdist was never fetched, setup.py never ran"


INSTALL = {
    "indexes": {"A": {"probe-sdist": [("sdist", "1.0", "{LOOT}\nfrom setuptools import setup\n"
                                       "setup(name='probe-sdist', version='1.0')\n")]}},
    "args": ["--index-url", "{A}", "probe-sdist"],
    # the host control: the same index, sdists allowed, the host's setuptools
    "control": ["--index-url", "{A}", "--no-build-isolation", "probe-sdist"],
    "score": _score,
}
