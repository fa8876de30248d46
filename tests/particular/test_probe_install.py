"""The probe's install-phase cases (probe/install_phase.py) on the cached test image: each
is contained on namespace, and each positive control (pip on the host, without corral's
guards) really leaks: setup.py ran, the .pth ran, the squatted name was fetched, index B
was asked. Real indexes on loopback, real pip, the real `corral install` and `corral run`."""

import json
import os
import tempfile

import pytest
from imagefix import CACHE, corral_in

from corral.probe.canaries import Canaries
from corral.probe.cases import load_cases
from corral.probe.runner import Runner

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the probe's tiers need root here")]

CASES = {c.id: c for c in load_cases() if c.install is not None}
CONTROL = {"supply.install-sdist": "READ: canary reached",   # setup.py ran on the host
           "supply.install-pth": "READ: canary reached",     # the .pth ran
           "supply.install-typosquat": "READ: canary reached",   # reqests' .pth ran
           "supply.install-confusion": "READ: canary reached"}   # 99.0 from index B ran


@pytest.fixture(scope="module")
def runner(mini_image):
    from corral.images.store import remove_tree

    src_state, _, digest = mini_image
    tar = os.path.join(os.path.dirname(src_state), f"{digest[7:19]}.tar")
    if not os.path.exists(tar):
        corral_in(src_state, "image", "export", digest, tar + ".tmp")
        os.replace(tar + ".tmp", tar)
    st = tempfile.mkdtemp(prefix="probe-store-", dir=CACHE)
    os.chmod(st, 0o711)
    corral_in(st, "image", "import", tar, "--name", "probe-base")
    old = {k: os.environ.get(k) for k in ("CORRAL_STATE_DIR", "CORRAL_PROBE_IMAGE")}
    os.environ.update(CORRAL_STATE_DIR=st, CORRAL_PROBE_IMAGE="probe-base")
    cn = Canaries().plant()
    try:
        yield Runner(cn), st
    finally:
        cn.remove()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        remove_tree(st)
        from corral.backends.host.imageroot import sweep_shared

        sweep_shared()   # the shared overlays of this store's layered images: detached


def test_the_four_cases_are_in_the_catalogue():
    assert sorted(CASES) == sorted(CONTROL)


@pytest.mark.parametrize("case_id", sorted(CONTROL))
def test_install_case_is_contained_and_its_control_leaks(runner, case_id):
    r, st = runner
    cell = r.cell(CASES[case_id], "namespace")
    assert (cell.status, cell.contained, cell.expected) == ("contained", True, True), cell.reason
    control = cell.reason.split("(control on the host: ", 1)[1]
    assert CONTROL[case_id] in control, cell.reason
    # nothing the attack made stays in the store: only the base
    images = json.loads(corral_in(st, "image", "ls", "--json").stdout)
    assert [m["names"] for m in images] == [["probe-base"]]


def test_process_tier_is_refused_not_failed(runner):
    r, _ = runner
    cell = r.cell(CASES["supply.install-pth"], "process")
    assert cell.status == "refused" and cell.contained is None and not cell.failing
