"""The policy loader under arbitrary input: TOML text and dicts give a Policy or a
PolicyError with a one-line message, never another exception; every valid policy
round-trips through `dump_toml` (what `corral policy show` prints) and back."""

from __future__ import annotations

import os
import string
import tempfile
import tomllib

from hypothesis import example, given
from hypothesis import strategies as st
from strategies import NAME, json_values

from corral.errors import PolicyError
from corral.policy import FIELDS, TIERS, dump_toml, load_policy, policy_from_dict
from corral.policy.schema import SECTIONS, SPEC_BY_PATH

#: the keys below each table, so generated dicts reach the converters, not just "unknown key"
_KEYS: dict[str, list[str]] = {}
for _spec in FIELDS:
    _table, _, _key = _spec.path.rpartition(".")
    _KEYS.setdefault(_table, []).append(_key)
for _table in list(_KEYS):
    if "." in _table:
        _parent, _, _sub = _table.rpartition(".")
        _KEYS.setdefault(_parent, []).append(_sub)


def one_line(err: PolicyError) -> None:
    text = str(err)
    assert text and text.isprintable(), f"not one printable line: {text!r}"
    assert err.field is None or err.field.isprintable(), repr(err.field)


def _table(name: str, depth: int = 0) -> st.SearchStrategy:
    keys = st.one_of(st.sampled_from(_KEYS.get(name, ["x"])), st.text(max_size=8))
    values = st.one_of(json_values(8), _table(f"{name}.budget", depth + 1)) if depth == 0 \
        else json_values(8)
    return st.dictionaries(keys, values, max_size=5)


POLICY_DICTS = st.one_of(
    st.fixed_dictionaries({}, optional={
        "isolation": st.one_of(st.sampled_from(TIERS), json_values(3)),
        "image": st.one_of(st.just("python"), json_values(3)),
        **{s: st.one_of(_table(s), json_values(4)) for s in SECTIONS},
        "secrets": st.one_of(
            st.dictionaries(st.text(max_size=6), st.one_of(
                st.fixed_dictionaries({}, optional={
                    "from": st.one_of(st.just("env:TOKEN"), json_values(2)),
                    "value": json_values(2), "hosts": json_values(4),
                    "ttl": json_values(2), "plain_http": json_values(2)}),
                json_values(2)), max_size=2),
            json_values(3)),
    }),
    json_values(10),
)


@given(POLICY_DICTS)
@example({"limits": {"timeout": 10**400}})                       # float() of a huge int
@example({"limits": {"cpus": 10**400}})
@example({"network": {"budget": {"bytes_in": 10**400}}})
@example({"limits": {"a\nb": 1}})                                # the key is the field
@example({"env": {"set": {"A\nB": "x"}}})
@example({"network": {"mode": "allow", "allow": ["http://a\nb/"]}})
@example({"network": {"mode": "allow", "allow_private": ["10.0.0.1\n2"]}})
@example({"network": {"mode": "allow", "nameservers": ["10.0.0.1\u2028"]}})
@example({"secrets": {"A": {"from": "env:A", "hosts": ["x"], "ttl": 10**400}}})
def test_dict_gives_policy_or_policy_error(data):
    try:
        p = policy_from_dict(data)
    except PolicyError as e:
        one_line(e)
        return
    assert dump_toml(p)


TOML_ALPHABET = st.sampled_from([*"[]{}=\"'.,#\n \t\\", *string.ascii_letters[:8],
                                 *string.digits[:4], "limits", "network", "timeout", "allow",
                                 "memory", "true", "\x00", "\x7f", "\u2028", "é"])


@given(st.one_of(st.binary(max_size=200),
                 st.lists(TOML_ALPHABET, max_size=60).map("".join).map(str.encode)))
@example(b"\xff\xfe")
@example(b"[limits]\ntimeout = 1e999\n")
@example(b"[limits]\nmemory = 99999999999999999999\n")
@example(b"[[limits]]\n")
def test_toml_file_gives_policy_or_policy_error(text):
    fd, path = tempfile.mkstemp(suffix=".toml")
    try:
        os.write(fd, text)
        os.close(fd)
        try:
            load_policy(path)
        except PolicyError as e:
            one_line(e)
    finally:
        os.unlink(path)


# --- valid policies round-trip -----------------------------------------------------------

def _number(spec, integral: bool):
    lo = spec.minimum if spec.minimum is not None else 0
    hi = spec.maximum if spec.maximum is not None else 2**40
    if integral:
        return st.integers(int(lo), int(min(hi, 2**62)))
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _spelled(spec):
    if spec.kind == "duration":
        return st.one_of(_number(spec, False),
                         st.integers(int(spec.minimum * 1000) or 1,
                                     int(min(spec.maximum or 86400, 86400) * 1000))
                         .map(lambda ms: f"{ms}ms"))
    if spec.kind == "size":
        return st.one_of(_number(spec, True),
                         st.integers(max(1, int(spec.minimum or 0) >> 10),
                                     int(min(spec.maximum or 2**40, 2**40)) >> 10)
                         .map(lambda k: f"{k}K"))
    return _number(spec, spec.kind == "int")


ENV_NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True)
RULE = st.one_of(
    NAME, NAME.map(lambda n: "*." + n),
    st.builds(lambda n, p: f"{n}:{p}", NAME, st.integers(1, 65535)),
    st.sampled_from(["10.0.0.0/8", "[::1]:8443", "127.0.0.9:8080", "fd00::/8"]))


@st.composite
def valid_policies(draw) -> dict:
    d: dict = {"isolation": draw(st.sampled_from(TIERS))}
    limits = {}
    for spec in FIELDS:
        if spec.path.startswith("limits.") and draw(st.booleans()):
            limits[spec.path.split(".")[1]] = draw(_spelled(spec))
    d["limits"] = limits
    d["env"] = {"set": draw(st.dictionaries(
                    ENV_NAME, st.text(st.characters(exclude_characters="\x00"), max_size=12),
                    max_size=3)),
                "pass": draw(st.lists(ENV_NAME, max_size=3))}
    if draw(st.booleans()):
        d["network"] = {
            "mode": "allow",
            "allow": draw(st.lists(RULE, max_size=4)),
            "deny": draw(st.lists(RULE, max_size=2)),
            "allow_private": draw(st.lists(st.sampled_from(
                ["10.0.0.0/8", "127.0.0.1", "fd00::/8", "[::1]"]), max_size=2)),
            "nameservers": draw(st.lists(st.sampled_from(
                ["127.0.0.1", "127.0.0.53:5353", "[::1]:53", "::1"]), max_size=2)),
            "budget": {k: draw(_spelled(SPEC_BY_PATH[f"network.budget.{k}"]))
                       for k in ("bytes_out", "bytes_in", "requests") if draw(st.booleans())},
        }
    return d


def _fields(p) -> dict:
    from corral.policy.dump import get_value
    return {s.path: get_value(p, s.path) for s in FIELDS}


@given(valid_policies())
@example({"env": {"set": {"A": "\x7f"}}})                 # DEL: TOML wants it escaped
@example({"env": {"set": {"A": "\x1f\t\u2028\\\"'"}}})
def test_valid_policy_round_trips_through_dump(d):
    p = policy_from_dict(d)
    text = dump_toml(p)
    again = policy_from_dict(tomllib.loads(text), allow_literal=False)
    assert _fields(again) == _fields(p)
    assert dump_toml(again) == text


def test_corral_policy_show_prints_what_reads_back(tmp_path):
    """The installed `corral policy show` on the round-trip's regression examples (and a
    few more): its output, given back with --policy, prints the same text again."""
    import subprocess

    corral = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), ".venv", "bin", "corral")
    cases = [
        '[env.set]\nA = "\\u007f"\n',
        '[limits]\nidle_timeout = 3.217877989194166e-166\ntimeout = "1500ms"\n',
        '[limits]\ncpu_time = 0.30000000000000004\n',
        '[network]\nmode = "allow"\nallow = ["*.example.com:443", "[::1]:8443"]\n',
    ]
    for i, text in enumerate(cases):
        first = tmp_path / f"p{i}.toml"
        first.write_text(text)
        shown = subprocess.run([corral, "policy", "show", "--policy", str(first)],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        again = tmp_path / f"p{i}-again.toml"
        again.write_text(shown.stdout)
        back = subprocess.run([corral, "policy", "show", "--policy", str(again)],
                              capture_output=True, text=True, timeout=60)
        assert back.returncode == 0, back.stderr
        assert back.stdout == shown.stdout


@given(valid_policies())
@example({"env": {"set": {"A": "\x7f", "B": "\u2028\"\\"}}})
def test_the_spool_form_prints_the_same_toml(d):
    """`corral run` writes its policy in the cheap form (audit/record.py) and ingest prints
    it: through the JSON line, the same text as dump_toml (hence the same digest)."""
    import json

    from corral.audit.record import dumps, policy_form
    from corral.policy.dump import dump_form

    p = policy_from_dict(d)
    assert dump_form(json.loads(dumps(policy_form(p)))) == dump_toml(p)
