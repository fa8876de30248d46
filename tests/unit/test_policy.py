"""The policy schema: units, defaults, unknown keys, one-line errors, TOML round trip."""

import tomllib

import pytest
from conftest import ROOT

from corral.errors import PolicyError
from corral.policy import FIELDS, Policy, dump_toml, load_policy, policy_from_dict
from corral.policy.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize("text,seconds", [
    ("500ms", 0.5), ("60s", 60), ("2m", 120), ("1h", 3600), (5, 5.0), ("7", 7.0), (1.5, 1.5),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "-1s", "", "1d", True, None, "nan", [1]])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("text,n", [
    (4096, 4096), ("64K", 64 << 10), ("512M", 512 << 20), ("1G", 1 << 30), ("1MiB", 1 << 20),
    ("2kb", 2048), ("1.5K", 1536),
])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["12X", "-5M", "1.3", True, "M", None])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_format_round_trip():
    for s in (0.5, 1, 60, 61.5, 3600, 0.001):
        assert parse_duration(format_duration(s)) == s
    for n in (1, 4096, 1 << 20, 3 << 30, 1000):
        assert parse_size(format_size(n)) == n


def test_defaults_are_the_documented_ones():
    p = Policy()
    assert p.isolation == "namespace"
    lim = p.limits
    assert (lim.timeout, lim.cpu_time, lim.memory, lim.cpus, lim.pids) == (60, 30, 512 << 20, 1.0, 256)
    assert (lim.scratch, lim.scratch_inodes, lim.output) == (256 << 20, 65536, 1 << 20)
    assert (lim.open_files, lim.file_size) == (256, 128 << 20)
    assert p.filesystem.workspace is None and p.filesystem.ro_binds == ()
    assert p.env.pass_ == () and p.env.set == ()
    assert p.network.mode == "none"
    assert p.explicit == frozenset()


def test_every_key_of_the_issue_exists():
    paths = {f.path for f in FIELDS}
    for key in ["isolation", "limits.timeout", "limits.cpu_time", "limits.memory", "limits.cpus",
                "limits.pids", "limits.scratch", "limits.scratch_inodes", "limits.output",
                "limits.open_files", "limits.file_size", "filesystem.workspace",
                "filesystem.ro_binds", "env.pass", "env.set", "network.mode"]:
        assert key in paths


def test_sandbox_env_is_base_plus_pass_plus_set():
    p = policy_from_dict({"env": {"pass": ["KEEP", "ABSENT"], "set": {"HOME": "/x", "A": "1"}}})
    env = p.sandbox_env({"KEEP": "k", "SECRET": "s", "PATH": "/host/bin"})
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/x", "LANG": "C.UTF-8",
                   "TERM": "dumb", "KEEP": "k", "A": "1"}


@pytest.mark.parametrize("data,field,words", [
    ({"limits": {"memroy": "1G"}}, "limits.memroy", "did you mean 'memory'"),
    ({"limit": {}}, "limit", "unknown key"),
    ({"limits": {"memory": "12X"}}, "limits.memory", "not a size"),
    ({"limits": {"memory": "1K"}}, "limits.memory", "out of range"),
    ({"limits": {"pids": 0}}, "limits.pids", "out of range"),
    ({"limits": {"pids": True}}, "limits.pids", "whole number"),
    ({"limits": {"cpus": 0}}, "limits.cpus", "out of range"),
    ({"limits": {"timeout": "forever"}}, "limits.timeout", "not a duration"),
    ({"limits": "x"}, "limits", "must be a table"),
    ({"isolation": "docker"}, "isolation", "unknown tier"),
    ({"network": {"mode": "open"}}, "network.mode", "unknown network mode"),
    ({"filesystem": {"ro_binds": ["relative/path"]}}, "filesystem.ro_binds[0]", "absolute"),
    ({"filesystem": {"ro_binds": ["/nonexistent-corral"]}}, "filesystem.ro_binds[0]", "does not exist"),
    ({"filesystem": {"ro_binds": ["/usr/../etc"]}}, "filesystem.ro_binds[0]", "'..'"),
    ({"filesystem": {"ro_binds": ["/proc/self"]}}, "filesystem.ro_binds[0]", "corral builds"),
    ({"filesystem": {"ro_binds": ["/usr\nx"]}}, "filesystem.ro_binds[0]", "newline"),
    ({"filesystem": {"workspace": {"path": "/etc/hostname"}}}, "filesystem.workspace.path", "not a directory"),
    ({"filesystem": {"workspace": {"path": "/"}}}, "filesystem.workspace.path", "host root"),
    ({"filesystem": {"workspace": {"path": "/tmp", "mode": "rwx"}}}, "filesystem.workspace.mode", "\"ro\" or \"rw\""),
    ({"filesystem": {"workspace": {"path": "/tmp", "moed": "rw"}}}, "filesystem.workspace.moed", "did you mean"),
    ({"env": {"pass": ["BAD-NAME"]}}, "env.pass[0]", "not a variable name"),
    ({"env": {"set": {"A": "x\0y"}}}, "env.set.A", "NUL"),
])
def test_errors_name_the_field_and_the_fix(data, field, words):
    with pytest.raises(PolicyError) as ei:
        policy_from_dict(data)
    assert ei.value.field == field
    assert words in str(ei.value)
    assert "\n" not in str(ei.value)
    assert ei.value.exit_code == 2


def test_explicit_tracks_what_the_user_set(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[limits]\nmemory = "1G"\n')
    p = load_policy(str(f), overrides={"limits": {"pids": 10}})
    assert p.limits.memory == 1 << 30 and p.limits.pids == 10
    assert p.explicit == {"limits.memory", "limits.pids"}


def test_dump_is_accepted_back_with_every_default(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    p = policy_from_dict({"limits": {"timeout": "1.5s", "memory": 5_000_000_001},
                          "filesystem": {"workspace": {"path": str(ws), "mode": "rw"},
                                         "ro_binds": ["/usr/share"]},
                          "env": {"pass": ["X"], "set": {"Q": "a \"quoted\" \\ value\tç"}}})
    text = dump_toml(p)
    for f in FIELDS:
        if f.path not in ("isolation", "network.upstream_ca", "install.requirements"):
            assert f"{f.path.rsplit('.')[-1]} =" in text
    again = policy_from_dict(tomllib.loads(text))
    assert again.limits == p.limits and again.filesystem == p.filesystem and again.env == p.env
    # defaults print too, and read back as the same policy
    d = policy_from_dict(tomllib.loads(dump_toml(Policy())))
    assert (d.limits, d.filesystem, d.env, d.network) == (
        Policy().limits, Policy().filesystem, Policy().env, Policy().network)


def test_bad_toml_file(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text("[limits\n")
    with pytest.raises(PolicyError) as ei:
        load_policy(str(f))
    assert ei.value.field == "--policy" and "not valid TOML" in str(ei.value)
    with pytest.raises(PolicyError, match="does not exist"):
        load_policy(str(tmp_path / "missing.toml"))


def test_docs_policy_md_is_generated_from_the_schema():
    import pathlib

    from corral.policy.docs import render

    doc = pathlib.Path(ROOT) / "docs" / "policy.md"
    assert doc.read_text() == render(), (
        "docs/policy.md is stale: .venv/bin/python -m corral.policy.docs > docs/policy.md")


def test_secrets_grammar_and_sources(monkeypatch, tmp_path):
    base = {"network": {"mode": "allow", "allow": ["api.github.com"]}}
    p = policy_from_dict({**base, "secrets": {"GH": {"from": "env:GH_TOKEN",
                                                     "hosts": ["api.github.com"], "ttl": "5m"}}})
    (s,) = p.secrets
    assert (s.name, s.source, s.hosts, s.ttl, s.plain_http) == (
        "GH", "env:GH_TOKEN", ("api.github.com",), 300.0, False)
    lit = policy_from_dict({**base, "secrets": {"GH": {"value": "hunter2",
                                                       "hosts": ["api.github.com"]}}})
    assert "hunter2" not in repr(lit) and "hunter2" not in dump_toml(lit)
    for bad, field in [
        ({"GH": {"from": "literal:x", "hosts": ["api.github.com"]}}, "secrets.GH.from"),
        ({"GH": {"from": "env:GH", "hosts": []}}, "secrets.GH.hosts"),
        ({"GH": {"from": "env:GH", "hosts": ["other.com"]}}, "secrets.GH.hosts[0]"),
        ({"GH": {"from": "env:GH", "hosts": ["api.github.com"], "ttl": "0s"}}, "secrets.GH.ttl"),
        ({"GH": {"from": "env:GH", "hosts": ["api.github.com"], "tll": "1m"}}, "secrets.GH.tll"),
        ({"bad-name": {"from": "env:GH", "hosts": ["api.github.com"]}}, "secrets.bad-name"),
    ]:
        with pytest.raises(PolicyError) as ei:
            policy_from_dict({**base, "secrets": bad})
        assert ei.value.field == field, (bad, ei.value)
    with pytest.raises(PolicyError) as ei:  # a grant without the proxy
        policy_from_dict({"secrets": {"GH": {"from": "env:GH", "hosts": ["api.github.com"]}}})
    assert ei.value.field == "secrets.GH"
    f = tmp_path / "p.toml"  # a file may not carry the value itself
    f.write_text('[network]\nmode = "allow"\nallow = ["api.github.com"]\n'
                 '[secrets.GH]\nvalue = "x"\nhosts = ["api.github.com"]\n')
    with pytest.raises(PolicyError, match="only from the Python API"):
        load_policy(str(f))


def test_fields_are_made_on_first_use_and_then_kept():
    # the run path imports the schema without reading FIELDS (docs/benchmarks.md, session
    # 13); the first `from ... import FIELDS` makes it, and both names stay module globals
    import subprocess
    import sys

    code = ("import corral.cli, corral.runtime.sandbox, corral.backends.namespace\n"
            "import corral.policy.schema as s\n"
            "print(sorted({'FIELDS', 'SPEC_BY_PATH'} & set(vars(s))))\n"
            "from corral.policy import FIELDS\n"
            "print(FIELDS is s.FIELDS, s.SPEC_BY_PATH == {f.path: f for f in FIELDS},\n"
            "      sorted({'FIELDS', 'SPEC_BY_PATH'} & set(vars(s))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.splitlines() == ["[]", "True True ['FIELDS', 'SPEC_BY_PATH']"]
