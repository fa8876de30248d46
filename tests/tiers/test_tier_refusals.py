"""docs/tiers.md, "Filesystem refusals": the table says, per tier, which filesystem fields
of a policy its check() refuses. Here each row's policy is planned and given to every tier
usable on this host (a real check: Landlock, bwrap, runsc, qemu, wasmtime probed as for
a run), and what it refuses is compared with the cell, read against this host's facts
(root or not, idmap of the workspace, CAP_SYS_ADMIN)."""

import os
import re
import shutil
import tempfile

import pytest
from conftest import ROOT

from corral.errors import BackendUnavailable
from corral.plan import ImageRoot
from corral.runtime.tiers import _plan, check_tier, coerce_policy

TIERS = ("process", "namespace", "gvisor", "microvm", "wasm")


def table() -> dict[str, dict[str, str]]:
    """{row label: {tier: cell}} of the section's table."""
    with open(os.path.join(ROOT, "docs", "tiers.md")) as f:
        text = f.read()
    section = text.split("\n## Filesystem refusals\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == ["policy", *TIERS], head
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0]] = dict(zip(TIERS, cells[1:], strict=True))
    return rows


def refused(cell: str, facts: dict) -> bool | None:
    """Whether a cell's words mean refused on this host; None: not decidable here."""
    root, idmap_ok = facts["root"], facts["idmap"]
    return {
        "allowed": False,
        "refused": True,
        "refused as root": root,
        "refused without root": not root,
        "refused without idmap": not idmap_ok,
        "refused as root without idmap": root and not idmap_ok,
        "refused without root; as root without idmap": not root or not idmap_ok,
        "refused as root unless others can read it": root and not facts["others_read"],
        "refused without root or CAP_SYS_ADMIN": not root or not facts["sys_admin"],
        "refused if the image lacks the path": None,     # needs an image in the store
    }[cell]


def _sys_admin() -> bool:
    with open("/proc/self/status") as f:
        eff = next(ln for ln in f if ln.startswith("CapEff:")).split()[1]
    return bool(int(eff, 16) >> 21 & 1)


@pytest.fixture(scope="module")
def workspace():
    """A plain directory every uid can read, under the world-searchable /tmp."""
    d = tempfile.mkdtemp(dir="/tmp", prefix="corral-refusals-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def rows_for(ws: str) -> dict[str, tuple[dict, set[str], bool]]:
    """{row label: (policy, the rules its refusal comes under, layered image)}."""
    def w(**kw):
        return {"filesystem": {"workspace": {"path": ws, **kw}}}

    return {
        '`filesystem.workspace` mode `ro`': (w(mode="ro"), {"filesystem.workspace"}, False),
        '`filesystem.workspace` mode `rw`': (w(mode="rw"), {"filesystem.workspace"}, False),
        '`filesystem.workspace` mode `review`': (w(mode="review"), {"filesystem.workspace"},
                                                 False),
        '`filesystem.workspace.mount_at = "same"`': (w(mode="ro", mount_at="same"),
                                                     {"filesystem.workspace"}, False),
        '`filesystem.ro_binds`': ({"filesystem": {"ro_binds": [ws]}},
                                  {"filesystem.ro_binds"}, False),
        '`image = "NAME"`': ({"image": "python"}, {"image"}, False),
        '`image = "NAME"`, layered': ({"image": "python"}, {"image"}, True),
        '`image = "host"` (the default)': ({}, {"image"}, False),
        '`limits.scratch`': ({"limits": {"scratch": "64MiB"}}, {"limits.scratch"}, False),
        '`filesystem.ro_binds` on an image without that path': (
            {"image": "python", "filesystem": {"ro_binds": [ws]}},
            {"filesystem.ro_binds", "image"}, False),
    }


def test_the_filesystem_refusals_table_matches_each_tier_s_check(workspace):
    from corral.backends.process import _others_can_read
    from corral.linux import idmap

    facts = {"root": os.geteuid() == 0, "idmap": idmap.supported(workspace) is True,
             "others_read": _others_can_read(workspace) is None, "sys_admin": _sys_admin()}
    doc = table()
    rows = rows_for(workspace)
    assert set(doc) == set(rows), "the table's rows changed: update rows_for()"
    compared, wrong = 0, []
    for tier in TIERS:
        for label, (pol, rules, layered) in rows.items():
            plan = _plan(coerce_policy({"isolation": tier, **pol}), {}, False)
            if layered:   # the check reads only whether the image has layers over its tree
                plan = plan.replace(ops=tuple(
                    op.replace(layers=("/nonexistent-layer",)) if isinstance(op, ImageRoot)
                    else op for op in plan.ops))
            try:
                _, check = check_tier(tier, plan)
            except BackendUnavailable:
                break                   # not usable here: none of its cells can be compared
            want = refused(doc[label][tier], facts)
            if want is None:
                continue
            got = any(g.rule in rules for g in check.refused)
            compared += 1
            if got != want:
                reasons = [g.reason for g in check.refused if g.rule in rules]
                wrong.append(f"{tier} / {label}: the table says {doc[label][tier]!r}, the "
                             f"check {'refuses' if got else 'allows'} {reasons}")
    assert not wrong, "\n".join(wrong)
    assert compared >= 10, f"only {compared} cells could be compared on this host"


def test_every_cell_is_one_of_the_words_the_comparison_reads():
    facts = {"root": True, "idmap": True, "others_read": True, "sys_admin": True}
    for label, cells in table().items():
        for tier, cell in cells.items():
            try:
                refused(cell, facts)
            except KeyError:
                pytest.fail(f"{tier} / {label}: {cell!r} is not a word of refused()")
            assert re.fullmatch(r"[a-zA-Z ;_-]+", cell), cell
