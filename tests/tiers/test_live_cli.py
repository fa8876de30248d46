"""`corral sandbox exec ID [options] -- CMD` takes only what a command of a live sandbox
can have (--timeout, --env NAME=VALUE, --stdin, --json, --raw). A policy option
(--isolation, --memory, --workspace, ...) was accepted and silently ignored: the command
ran on the sandbox's own tier and limits, so `--isolation gvisor` ran on namespace. It is
refused now, before anything runs. Real CLI, real detached namespace sandbox."""

from __future__ import annotations

import subprocess

import pytest
from conftest import CORRAL, tier_unavailable

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


def _cli(*args, input=None):
    return subprocess.run([CORRAL, *args], capture_output=True, text=True, input=input,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def sid():
    p = _cli("sandbox", "create", "--timeout", "120")
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    yield sid
    _cli("sandbox", "kill", sid)


@pytest.mark.parametrize("opts", [["--isolation", "gvisor"], ["--memory", "1G"],
                                  ["--workspace", "/tmp"], ["--net", "allow"],
                                  ["--policy", "/dev/null"], ["--env", "HOME"], ["-t"],
                                  ["--stdin=yes"], ["--apply"]])
def test_a_policy_option_is_refused_and_nothing_runs(sid, opts):
    p = _cli("sandbox", "exec", sid, *opts, "--", "touch", "/scratch/ran")
    assert p.returncode == 2, (p.returncode, p.stderr)
    name = opts[0].partition("=")[0]
    assert p.stderr.startswith(f"corral: {name}: ") and p.stderr.count("\n") == 1, p.stderr
    assert f"{name}: {name}" not in p.stderr and "not an option" in p.stderr or \
        name == "--env", p.stderr
    assert _cli("sandbox", "exec", sid, "--", "test", "!", "-e", "/scratch/ran").returncode \
        == 0


def test_what_exec_takes_still_works(sid):
    p = _cli("sandbox", "exec", sid, "--env", "A=1", "--env=B=two words", "--timeout", "30s",
             "--", "sh", "-c", 'echo "$A $B"')
    assert (p.returncode, p.stdout) == (0, "1 two words\n"), p.stderr
    p = _cli("sandbox", "exec", sid, "--stdin", "--raw", "--", "cat", input="piped")
    assert (p.returncode, p.stdout) == (0, "piped"), p.stderr
    p = _cli("sandbox", "exec", sid, "--json", "--", "echo", "--isolation", "gvisor")
    assert p.returncode == 0, p.stderr                   # after --: the command's own
    assert '"stdout": "--isolation gvisor\\n"' in p.stdout
    # without --, the command starts at the first word that is no option
    p = _cli("sandbox", "exec", sid, "--timeout=30s", "echo", "--memory", "1G")
    assert (p.returncode, p.stdout) == (0, "--memory 1G\n"), p.stderr


@pytest.mark.parametrize("opt", ["--stdin", "-t", "--apply", "--patch=/tmp/p", "--raw"])
def test_create_refuses_a_runs_own_options(opt):
    p = _cli("sandbox", "create", "--timeout", "60", opt)
    # no id printed: nothing was made (`sandbox ls` is host-wide: other sandboxes of this
    # uid come and go meanwhile, so it cannot be compared)
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("corral: --") and "sandbox create" in p.stderr, p.stderr


@pytest.mark.parametrize("value", ["-1s", "9999d", "soon", "0s"])
def test_a_bad_exec_timeout_is_one_line_and_exit_2(sid, value):
    p = _cli("sandbox", "exec", sid, "--timeout", value, "--", "touch", "/scratch/late")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("corral: ") and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert _cli("sandbox", "exec", sid, "--", "test", "!", "-e", "/scratch/late").returncode \
        == 0
