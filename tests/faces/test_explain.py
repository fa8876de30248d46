"""`corral explain` reads the same plan as `corral run`: flip a rule, both change."""

import json
import os
import subprocess

import pytest
from conftest import CORRAL

NOBODY = 65534


def cli(*args, user=None):
    kw = dict(user=user, group=user, extra_groups=[], cwd="/") if user is not None else {}
    return subprocess.run([CORRAL, *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"}, **kw)


def explain(*args, user=None):
    r = cli("explain", "--json", *args, user=user)
    return r.returncode, json.loads(r.stdout)


def rule(d, name):
    (r,) = [r for r in d["rules"] if r["rule"] == name]
    return r


def test_explain_answers_the_three_questions():
    rc, d = explain()
    assert rc == 0 and d["tier"] == "namespace" and d["own_kernel"] is False
    assert d["network"] == {"default_closed": True, "reachable": [],
                            "note": d["network"]["note"]}
    assert d["credentials"] == []
    assert d["properties"]["pid_isolation"] is True and d["properties"]["no_host_root"] is True
    for r in d["rules"]:
        assert r["enforced_by"] in ("kernel", "proxy", "supervisor", "none") and r["note"]
    text = cli("explain").stdout
    assert "1. its own kernel? no" in text and "2. network closed by default? yes" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_flipping_the_network_rule_changes_explain_and_run():
    rc, d = explain("--allow-domain", "example.org")
    assert d["network"]["reachable"] == ["example.org (via the egress proxy)"]
    assert rule(d, "network.mode")["enforced_by"] == "proxy"
    # run agrees: the proxy is there and refuses what is not allowed, naming the rule
    r = cli("run", "--json", "--allow-domain", "example.org", "--", "/bin/sh", "-c",
            "curl -s -o /dev/null -w '%{http_code}' -m 5 http://other.invalid/")
    res = json.loads(r.stdout)
    assert res["stdout"] == "403"
    assert [e["reason"] for e in res["events"] if e["kind"] == "net"][0].startswith(
        "not in network.allow")
    r = cli("run", "--json", "--", "/bin/sh", "-c", "env | grep -c -i _proxy")
    assert json.loads(r.stdout)["stdout"].strip() == "0"


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to nobody")
def test_flipping_a_limit_for_an_unprivileged_user_changes_explain_and_run():
    rc, d = explain(user=NOBODY)
    assert rc == 0 and rule(d, "limits.memory")["enforced_by"] == "none"
    r = json.loads(cli("run", "--json", "--", "true", user=NOBODY).stdout)
    assert "limits.memory" in {e["rule"] for e in r["events"] if e["kind"] == "unenforced"}
    rc, d = explain("--memory", "1G", user=NOBODY)  # now explicit: refused by both
    assert rc == 3 and d["runs"] is False and d["refused"]["field"] == "limits.memory"
    r = cli("run", "--memory", "1G", "--", "true", user=NOBODY)
    assert r.returncode == 3 and "limits.memory" in r.stderr


def test_credentials_are_listed():
    rc, d = explain("--allow-domain", "api.github.com", "--env", "HOME",
                    "--secret", "GH=env:GH_TOKEN@api.github.com")
    names = {c["name"]: c["how"] for c in d["credentials"]}
    assert "placeholder" in names["GH"] and "api.github.com" in names["GH"]
    assert "real value" in names["HOME"]
