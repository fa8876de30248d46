"""atheris target: the policy loader (policy/load.py, dump.py). TOML text or JSON gives a
Policy, which round-trips through dump_toml, or a PolicyError of one printable line."""

import json
import tomllib

from _common import run

from corral.errors import PolicyError
from corral.policy import dump_toml, policy_from_dict


def one_input(data: bytes) -> None:
    text = data[1:].decode("utf-8", "replace")
    try:
        d = tomllib.loads(text) if data[:1] < b"\x80" else json.loads(text)
    except (ValueError, RecursionError):    # TOMLDecodeError is a ValueError
        return
    try:
        p = policy_from_dict(d, allow_literal=data[:1] < b"\x40")
    except PolicyError as e:
        assert str(e).isprintable(), repr(str(e))
        return
    if p.secrets and any(s.source == "literal" for s in p.secrets):
        return                              # a literal value is not written back
    again = policy_from_dict(tomllib.loads(dump_toml(p)), allow_literal=False)
    assert dump_toml(again) == dump_toml(p)


if __name__ == "__main__":
    run(one_input)
