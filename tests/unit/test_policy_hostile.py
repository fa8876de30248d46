"""Hostile values for the policy loader's text checks: a long crafted string is refused
with a PolicyError naming its field, in time linear in its length. A request's policy comes
from a token holder (corral serve, MCP), so a check whose regular expression backtracks
(quadratic on `aaaa...a` followed by a bad character) is a way to hold a worker for
minutes. Each case runs in a subprocess with a timeout of a few seconds: the outcome is
tested (refused, the field named, the process done), not a time."""

import json
import subprocess
import sys

import pytest

SIZE = 100_000

#: shapes that made the old `install.packages` pattern backtrack: a name run that the
#: version tail could also take, ended by a character neither takes
SHAPES = {
    "name-then-newline": "a" * SIZE + "\n",
    "name-then-bracket": "a" * SIZE + "[",
    "name-then-nul": "a" * SIZE + "\0",
    "extras-unclosed": "a[" + "b" * SIZE,
    "tail-then-bad": "a" + "=" * SIZE + "\n",
}

SCRIPT = r"""
import json, sys
from corral.errors import PolicyError
from corral.policy.load import policy_from_dict
field, value = json.loads(sys.stdin.read())
section, key = field.split(".")
try:
    policy_from_dict({"image": "python", section: {key: ["ok==1.0", value]}})
except PolicyError as e:
    print(json.dumps([e.field, len(str(e))]))
else:
    print(json.dumps(None))
"""


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("field", ["install.packages", "install.allow_names"])
def test_a_hostile_long_requirement_is_refused_at_once_naming_the_field(field, shape):
    out = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(
        [field, SHAPES[shape]]), capture_output=True, text=True, timeout=8)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got is not None, "accepted"
    name, length = got
    assert name == f"{field}[1]"
    assert length < 1000, "the message carries the whole hostile value"


def test_ordinary_requirements_still_pass_and_near_misses_do_not():
    from corral.errors import PolicyError
    from corral.policy.load import policy_from_dict

    good = ["requests==2.32.3", "Flask[async, dotenv]>=3", "a", "x.y_z-w",
            "numpy>=1.26; python_version >= '3.11'", "pkg[extra]", "pkg[]~=1.0"]
    p = policy_from_dict({"image": "python", "install": {"packages": good,
                                                         "allow_names": ["reqeusts"]}})
    assert p.install.packages == tuple(good)
    for bad in ["-e .", "--index-url=x", "pkg\n--x", "[extra]pkg", "pkg[a]b[c]",
                "pkg @ https://x/y.whl", "", "a" * 1025, "pkg[a\n]"]:
        with pytest.raises(PolicyError) as e:
            policy_from_dict({"image": "python", "install": {"packages": ["ok", bad]}})
        assert e.value.field == "install.packages[1]", bad
