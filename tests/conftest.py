import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: tests/fixtures: the network fixtures (netfix) and the syscall probe, importable by name
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
if FIXTURES not in sys.path:
    sys.path.insert(0, FIXTURES)
CORRAL = os.path.join(ROOT, ".venv", "bin", "corral")
#: the audit store (docs/audit.md) is off for the suite unless a test turns it on: the
#: suites of many worktrees share /var/lib/corral, and a test that asserts a Result's
#: events must not see another suite's lock on the database. tests/faces/test_audit.py
#: turns it on, each test in a state directory of its own.
os.environ.setdefault("CORRAL_AUDIT", "0")
PY = "/usr/bin/python3"

#: the tiers a behavioural test runs in (each skipped where this host cannot run it)
ALL_TIERS = ("namespace", "gvisor", "process")


def tier_unavailable(tier: str, policy: dict | None = None) -> str | None:
    """Why `corral explain` says this policy cannot run on this tier here, or None."""
    from corral.errors import BackendUnavailable
    from corral.policy import policy_from_dict
    from corral.runtime.explain import explain

    try:
        d = explain(policy_from_dict(policy or {}), tier)
    except BackendUnavailable as e:
        return e.message
    return None if d["runs"] else d["refused"]["message"]


def procs_mentioning(text: str) -> list[int]:
    """Host processes whose command line, its arguments joined by spaces, contains
    `text` (`sleep 5` matches both `sh -c "sleep 5"` and a `sleep 5` exec'd without the
    shell, as a live sandbox runs a plain command line)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read().replace(b"\0", b" "):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def procs_of_uid(uid: int) -> list[int]:
    """Host processes whose real uid is `uid`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(pid))
                        break
        except OSError:
            pass
    return found


def mountinfo() -> list[str]:
    """This process's mount table, a line a mount."""
    with open("/proc/self/mountinfo") as f:
        return f.read().splitlines()


def sh(cmd: str, policy: dict | None = None, **kw):
    """corral.run of `/bin/sh -c cmd`; the Result is checked to come from the tier the
    policy names (when it names one)."""
    import corral

    r = corral.run(["/bin/sh", "-c", cmd], policy=policy, **kw)
    if policy and policy.get("isolation", "auto") != "auto":
        assert r.isolation == policy["isolation"], r
    return r


def net_events(r) -> list[dict]:
    """The egress proxy's "net" events of a Result."""
    return [e for e in r.events if e["kind"] == "net"]


#: the network fixtures (servers, dnsmasq, the grants' world) for every test file
pytest_plugins = ("netfix", "imagefix", "vmfix", "wasmfix")


@pytest.fixture(scope="session")
def corral_bin():
    assert os.access(CORRAL, os.X_OK), "run scripts/setup.sh first"
    return CORRAL


def pytest_report_header(config):
    return f"corral tests as uid {os.geteuid()}, python {sys.version.split()[0]}"
