"""The host and rule grammar (policy/hosts.py, policy/rules.py) under arbitrary text: one
canonical form or HostError/PolicyError, fullmatch semantics (a near miss with a control
character, a separator or a URL metacharacter is never the name), every inet_aton spelling
of an address is that address, and the address classes agree with `ipaddress`."""

from __future__ import annotations

import socket
import unicodedata
from ipaddress import IPv4Address, IPv6Address, IPv6Network

from hypothesis import assume, example, given
from hypothesis import strategies as st
from strategies import (
    HOSTILE_CHARS,
    IPV4_EDGY,
    IPV6,
    IPV6_CARRIER,
    NAME,
    NETWORK_V4,
    NETWORK_V6,
    v4_spellings,
)

from corral.errors import PolicyError
from corral.policy.hosts import HostError, classify_ip, embedded_ipv4, parse_host
from corral.policy.rules import DEFAULT_PORTS, admits, parse_cidr, parse_rule

_LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")
HOST_TEXT = st.one_of(st.text(max_size=40),
                      st.text(st.sampled_from("0123456789abcdefxX.:[]%-_"), max_size=30),
                      NAME, st.builds(lambda a, b: a + b, NAME, st.text(max_size=3)))


def _canonical_ok(h) -> None:
    if isinstance(h, str):
        assert h and h.isascii() and len(h) <= 253, h
        for label in h.split("."):
            assert label and set(label) <= _LABEL_CHARS, h
            assert not label.startswith("-") and not label.endswith("-"), h
        assert not h.split(".")[-1].isdigit(), h
    else:
        assert isinstance(h, IPv4Address | IPv6Address)
        assert not (isinstance(h, IPv6Address) and h.ipv4_mapped), h


@given(HOST_TEXT)
@example("xn--")                     # a punycode prefix with nothing after it
@example("a\u3002b")                 # an ideographic full stop
@example("\u212aexample.com")        # KELVIN SIGN: nameprep makes it "k"
def test_parse_host_is_canonical_or_host_error(text):
    try:
        h = parse_host(text)
    except HostError as e:
        assert str(e) and "\n" not in str(e)
        return
    _canonical_ok(h)
    assert parse_host(str(h)) == h                       # canonical is a fixed point


def _is_hostile(c: str) -> bool:
    return unicodedata.category(c) in ("Cc", "Zs", "Zl", "Zp") or c in "@#/\\%?[]*"


@given(NAME, st.integers(0, 80), HOSTILE_CHARS)
@example("example.com", 11, "\n")
@example("example.com", 0, "\u3000")
def test_near_miss_is_never_the_name(name, at, c):
    at = at % (len(name) + 1)
    near = name[:at] + c + name[at:]
    try:
        h = parse_host(near)
    except HostError:
        return
    assert not _is_hostile(c), f"{near!r} was taken as {h!r}"
    # what is left: characters IDNA maps (lookalike dots, zero-width ones, a Kelvin sign,
    # a dotted capital I): then the canonical name is one the proxy resolves itself, and
    # a rule sees that name, never the raw text
    _canonical_ok(h)
    rule = parse_rule(name, "network.allow[0]")
    if h != name:
        assert admits([rule], [], h, 443) is None if isinstance(h, str) else True


@given(IPV4_EDGY, st.data())
def test_every_inet_aton_spelling_is_the_address(addr, data):
    text = data.draw(v4_spellings(addr))
    assert parse_host(text) == addr
    assert parse_host(text + ".") == addr                  # the URL parser's trailing dot


@given(st.text(st.sampled_from("0123456789xX.abcdef"), min_size=1, max_size=20))
@example("0x")
@example("1.0x")
@example("08.1.1.1")
def test_what_inet_aton_takes_for_an_address_is_never_a_name(text):
    try:
        packed = socket.inet_aton(text)
    except OSError:
        packed = None
    try:
        h = parse_host(text)
    except HostError:
        assert packed is None, f"{text!r} is {socket.inet_ntoa(packed)} to inet_aton"
        return
    if packed is not None:
        assert h == IPv4Address(packed), text
    if isinstance(h, str):
        assert packed is None


@given(st.one_of(IPV4_EDGY, IPV6, IPV6_CARRIER))
def test_classification_agrees_with_ipaddress(addr):
    why = classify_ip(addr)
    v4 = addr if isinstance(addr, IPv4Address) else embedded_ipv4(addr)
    if isinstance(addr, IPv6Address) and v4 is not None and int(addr) > 1:
        assert why == classify_ip(v4)                        # the address it reaches
        return
    if why == "public":
        assert not (addr.is_loopback or addr.is_link_local or addr.is_multicast
                    or addr.is_unspecified or addr.is_reserved), addr
        if isinstance(addr, IPv4Address):
            assert addr.is_global, addr
        else:
            assert addr in IPv6Network("2000::/3") and not addr.is_site_local, addr
            # 2001::/23 (IETF protocol assignments) is "private" to ipaddress, which
            # lists its global parts as exceptions; corral refuses the parts named in
            # its table and treats the rest of 2001::/23 as global unicast
            assert addr.is_global or addr in IPv6Network("2001::/23"), addr
    else:
        assert not (isinstance(addr, IPv4Address) and addr.is_global
                    and why in ("private", "loopback", "link-local")), (addr, why)
        if why == "loopback":
            assert addr.is_loopback
        if why == "multicast":
            assert addr.is_multicast
        if why == "link-local":
            assert addr.is_link_local


@given(st.one_of(NETWORK_V4, NETWORK_V6), st.data())
def test_cidr_rules_hold_exactly_their_addresses(net, data):
    rule = parse_rule(str(net) if isinstance(net.network_address, IPv4Address)
                      else f"[{net}]:443", "network.allow[0]")
    assert rule.kind == "net" and rule.net == net
    assert parse_cidr(str(net), "network.allow_private[0]") == net
    inside = net.network_address + data.draw(st.integers(0, net.num_addresses - 1))
    assert rule.matches_ip(inside)
    outside = data.draw(st.one_of(IPV4_EDGY, IPV6))
    assert rule.matches_ip(outside) == (outside in net)
    if net.num_addresses > 1:                     # host bits set: refused, with the fix
        bad = f"{net.broadcast_address}/{net.prefixlen}"
        try:
            parse_rule(bad, "network.allow[0]")
        except PolicyError as e:
            assert str(net) in str(e)
        else:
            raise AssertionError(f"{bad} has host bits set and was taken")


@given(NAME, st.text(max_size=12), st.integers(1, 65535))
@example("example.com", "a", 443)
def test_rules_match_by_whole_labels(suffix, prefix, port):
    host_rule = parse_rule(suffix, "network.allow[0]")
    wild = parse_rule("*." + suffix, "network.allow[1]")
    try:
        cand = parse_host(prefix + suffix)
    except HostError:
        return
    assume(isinstance(cand, str))
    assert host_rule.matches_name(cand) == (cand == suffix)
    assert wild.matches_name(cand) == cand.endswith("." + suffix)
    assert (admits([host_rule], [], cand, port) is not None) == (
        cand == suffix and port in DEFAULT_PORTS)
    # deny wins, and a deny rule without a port covers every port
    assert admits([host_rule], [host_rule], suffix, port)[0] == "deny"


@given(st.text(max_size=40))
@example("example.com:0")
@example("[::1]")
@example("*.1.2.3.4")
@example("http://x\ny")
def test_parse_rule_gives_rule_or_policy_error(text):
    try:
        rule = parse_rule(text, "network.allow[0]")
    except PolicyError as e:
        assert str(e).isprintable(), repr(str(e))
        return
    assert rule.kind in ("host", "suffix", "net")
    if rule.kind != "net":
        _canonical_ok(rule.name)
    assert rule.ports is None or all(1 <= p <= 65535 for p in rule.ports)
