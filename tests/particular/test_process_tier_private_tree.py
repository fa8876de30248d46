"""The process tier's command child runs as the run's uid under Landlock: whatever it
needs of corral after that must be imported before, because corral's own tree may not be
readable to that uid (CI clones into a 0700 directory: a lazy import there once failed
with PermissionError on every exec failure of the process tier)."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
from conftest import ROOT, tier_unavailable

pytestmark = pytest.mark.skipif(tier_unavailable("process") is not None,
                                reason=f"process tier: {tier_unavailable('process')}")


def test_an_exec_failure_is_reported_when_corrals_tree_is_private(tmp_path, request):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    shutil.copytree(os.path.join(ROOT, "src"), private / "src",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # the workspace where the run's uid may reach it (pytest's tmp root is 0700)
    work = pathlib.Path(tempfile.mkdtemp(prefix="corral-private-tree-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    work.chmod(0o755)
    script = work / "s.py"
    script.write_text("#!/nonexistent/python9\nprint('x')\n")
    script.chmod(0o755)
    code = ("import sys, json; sys.path.insert(0, %r); import corral; "
            "r = corral.run([%r], {'isolation': 'process', 'filesystem': "
            "{'workspace': {'path': %r}}}); print(json.dumps([r.exit_code, r.stderr]))"
            % (str(private / "src"), "./s.py", str(work)))
    p = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr
    exit_code, stderr = json.loads(p.stdout)
    assert "PermissionError" not in stderr, stderr
    assert exit_code == 127 and "its interpreter /nonexistent/python9 is missing" in stderr, \
        stderr
