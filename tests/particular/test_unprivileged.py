"""corral run by an ordinary user: the same namespaces and filter, no cgroups or tmpfs
(this host delegates none), so those defaults are reported unenforced, and an explicit
limit that needs them is refused with exit 3 (fail closed)."""

import json
import os
import subprocess

import pytest
from conftest import CORRAL

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to nobody")


def as_nobody(*args):
    return subprocess.run([CORRAL, *args], capture_output=True, text=True, timeout=60,
                          user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                          env={"PATH": "/usr/bin:/bin", "SECRET_TOKEN": "hunter2"})


def test_unprivileged_run_is_contained_and_says_what_it_cannot_enforce():
    r = as_nobody("run", "--json", "--", "/bin/sh", "-c",
                  "cat /proc/self/uid_map; ls /root /home 2>&1; touch /usr/x 2>&1; env; "
                  "grep -E 'NoNewPrivs|Seccomp:' /proc/self/status; cat /proc/net/dev")
    d = json.loads(r.stdout)
    assert d["verdict"] == "ok", d
    out = d["stdout"]
    assert out.split()[:2] == ["0", str(NOBODY)]
    assert "No such file or directory" in out and "Read-only file system" in out
    assert "hunter2" not in out and "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out
    assert "eth" not in out and "lo:" in out
    unenforced = {e["rule"] for e in d["events"] if e["kind"] == "unenforced"}
    assert {"limits.scratch", "limits.memory", "limits.pids"} <= unenforced
    for e in d["events"]:
        if e["kind"] == "unenforced":   # (an "audit" one says a record with no home was lost)
            assert e["reason"] and e["tier"] == "namespace"


@pytest.mark.parametrize("flag,value,field", [
    ("--memory", "1G", "limits.memory"),
    ("--pids", "10", "limits.pids"),
    ("--scratch-size", "10M", "limits.scratch"),
])
def test_explicit_limits_that_cannot_be_enforced_are_refused(flag, value, field):
    r = as_nobody("run", "--json", flag, value, "--", "/bin/sh", "-c", "echo ran")
    assert r.returncode == 3
    err = json.loads(r.stdout)["error"]
    assert err["field"] == field and err["kind"] == "unsupported"
    assert "ran" not in r.stdout
