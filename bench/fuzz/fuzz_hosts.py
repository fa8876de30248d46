"""atheris target: the host and rule grammar (policy/hosts.py, rules.py). Any text is a
canonical host (a fixed point) or HostError; any rule text is a Rule or a one-line
PolicyError; a name never keeps a control character or a separator."""

from _common import run

from corral.errors import PolicyError
from corral.policy.hosts import HostError, classify_ip, parse_host
from corral.policy.rules import parse_rule

_OK = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def one_input(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        h = parse_host(text)
    except HostError as e:
        assert "\n" not in str(e)
    else:
        if isinstance(h, str):
            assert set(h) <= _OK and ".." not in h and len(h) <= 253, h
        else:
            classify_ip(h)
        assert parse_host(str(h)) == h
    try:
        rule = parse_rule(text, "network.allow[0]")
    except PolicyError as e:
        assert str(e).isprintable(), repr(str(e))
    else:
        assert rule.kind in ("host", "suffix", "net")
        if rule.kind != "net":
            assert set(rule.name) <= _OK, rule.name


if __name__ == "__main__":
    run(one_input)
