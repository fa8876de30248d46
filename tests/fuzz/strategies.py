"""Hypothesis strategies shared by the property tests of tests/fuzz/."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import fuzz_profiles  # noqa: F401  (the ci/long settings profile, by CORRAL_FUZZ)
from hypothesis import strategies as st

#: characters that a near-miss of a name carries: controls, unicode separators and spaces,
#: lookalike dots, zero-width characters, the URL and path metacharacters
HOSTILE_CHARS = st.sampled_from([
    "\x00", "\t", "\n", "\r", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\xa0", "\u1680",
    "\u2000", "\u200b", "\u200c", "\u200d", "\u2028", "\u2029", "\u202e", "\u3000", "\ufeff",
    "\u3002", "\uff0e", "\uff61", " ", "@", "#", "/", "\\", "%", ":", "?", "[", "]", "*",
    "\u0130", "\u212a", "\u00df", "\u03c2",
])

LABEL = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
#: a valid DNS name whose last label is not all digits (those are broken addresses)
NAME = st.builds(lambda labels, tld: ".".join([*labels, tld]),
                 st.lists(LABEL, min_size=1, max_size=4),
                 st.from_regex(r"[a-z][a-z0-9]{0,9}", fullmatch=True))

IPV4 = st.builds(IPv4Address, st.integers(0, 2**32 - 1))
IPV6 = st.builds(IPv6Address, st.integers(0, 2**128 - 1))
#: addresses near the edges of the special ranges, where an off-by-one would show
_EDGES_V4 = [0, 0x0A000000, 0x0AFFFFFF, 0x0B000000, 0x64400000, 0x647FFFFF, 0x7F000000,
             0x7FFFFFFF, 0x80000000, 0xA9FE0000, 0xA9FEA9FE, 0xAC100000, 0xAC1FFFFF,
             0xAC200000, 0xC0A80000, 0xC0A8FFFF, 0xE0000000, 0xEFFFFFFF, 0xF0000000,
             0xFFFFFFFF]
IPV4_EDGY = st.one_of(IPV4, st.builds(lambda e, d: IPv4Address((e + d) % 2**32),
                                      st.sampled_from(_EDGES_V4), st.integers(-2, 2)))
#: IPv6 forms that carry an IPv4 address: mapped, compatible, NAT64, 6to4
IPV6_CARRIER = st.builds(
    lambda kind, v4: IPv6Address({"mapped": (0xFFFF << 32),
                                  "compat": 0,
                                  "nat64": 0x0064FF9B << 96,
                                  "6to4": 0x2002 << 112}[kind]
                                 | (int(v4) << (80 if kind == "6to4" else 0))),
    st.sampled_from(["mapped", "compat", "nat64", "6to4"]), IPV4_EDGY)


def v4_spellings(addr: IPv4Address) -> st.SearchStrategy[str]:
    """Every inet_aton spelling of an address: 1 to 4 parts, each decimal, octal or hex."""
    n = int(addr)

    def spell(parts: int, styles: list[str]) -> str:
        octets = list(n.to_bytes(4, "big"))
        values = octets[:parts - 1] + [int.from_bytes(bytes(octets[parts - 1:]), "big")]
        out = []
        for v, s in zip(values, styles):
            out.append({"d": str(v), "o": "0" + format(v, "o") if v else "0",
                        "x": hex(v), "X": "0X" + format(v, "X")}[s])
        return ".".join(out)

    return st.builds(spell, st.integers(1, 4),
                     st.lists(st.sampled_from("doxX"), min_size=4, max_size=4))


NETWORK_V4 = st.builds(lambda a, p: IPv4Network((int(a) >> (32 - p) << (32 - p), p)),
                       IPV4, st.integers(0, 32))
NETWORK_V6 = st.builds(lambda a, p: IPv6Network((int(a) >> (128 - p) << (128 - p), p)),
                       IPV6, st.integers(0, 128))


def json_values(max_leaves: int = 20) -> st.SearchStrategy:
    """Anything JSON (and a Python dict built from it) can carry, with the awkward corners:
    huge integers, NaN and infinities, lone surrogates, deep nesting."""
    leaf = st.one_of(st.none(), st.booleans(), st.integers(),
                     st.integers(min_value=10**300, max_value=10**400),
                     st.floats(), st.text(max_size=30),
                     st.sampled_from(["\ud800", "a\udfffb", "\x7f", "\n", "\u2028"]))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
        max_leaves=max_leaves)


def split_points(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """`data` cut into non-empty pieces at arbitrary points (b"" is a reader's end of
    stream, not a piece)."""
    return st.lists(st.integers(0, len(data)), max_size=8).map(
        lambda cuts: [p for p in (data[a:b] for a, b in zip([0, *sorted(cuts)],
                                                            [*sorted(cuts), len(data)])) if p])
