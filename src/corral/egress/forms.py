"""The spellings of a secret value that the response scrubber recognises. Pure: no I/O.

A granted host that reflects what it received may not reflect it verbatim: an API that
returns a config file base64-encodes it, an error page HTML-escapes it, a JSON body escapes
``"`` and ``/``, a URL in a Location header percent-encodes it. `patterns(value,
placeholder)` gives, for one value, a `Pattern` for each family of spellings, each with the
text that replaces it:

- **text**: the value with every character spelled, independently, as itself (either case,
  for letters), ``%hh`` and ``%25hh`` (percent-encoded once or twice, either case), a
  backslash escape ``\\c`` / ``\\\\c`` / ``\\\\\\c`` for punctuation (JSON ``\\"`` and ``\\/``,
  JSON nested in JSON, JS and shell escapes), ``\\u00hh`` and ``\\xhh`` behind 1 to 3
  backslashes, HTML numeric entities (``&#47;``, ``&#047;``, ``&#0047;``, ``&#x2f;``,
  ``&#X002F;``, with or without ``;``), every HTML5 named entity for the character
  (``&sol;``, ``&quot;``, ``&amp``, ...), ``+`` for a space; and each of those upper- or
  lower-cased. That covers the exact echo, JSON/JS escaping, percent-encoding in either case
  (also of every character), HTML escaping and upper- or lower-casing, and mixtures of them.
  Replaced by the placeholder (upper- or lower-cased when the match was): a placeholder is
  ``[A-Za-z0-9_-]`` only, which all of those encoders leave as is.
- **hex**: two hex digits per byte, either case (``value.hex()``, ``.upper()``, mixed).
  Replaced by the placeholder's hex (upper case when the match had an upper-case digit).
- **base64** and **base64url**, at each of the three alignments the value can have inside
  the encoded text (its offset mod 3 in the plain text): the characters that only the
  value's bits decide must match exactly; an edge character, which shares bits with the
  neighbouring bytes, must match in the value's bits (a class of 4 or 16 characters). So
  the base64 of the value alone (with or without ``=`` padding) and the base64 of any text
  that contains it (``user:value``, a JSON document, a JWT payload) are caught. Replaced by
  the same encoding of the placeholder spliced in at the same bit offset, the neighbours'
  bits kept: the whole string still decodes, to the original with the placeholder in place
  of the value (followed by one or two ``_`` when the placeholder's length differs from the
  value's mod 3, which keeps what follows aligned).

Not recognised (docs/secrets.md says so to users): MIME base64 with a line break inside the
value, base32 and other radixes, two transformations stacked across families (the base64 of
the hex, the hex of the upper-cased value, ...), compression (the proxy decodes gzip before
scanning), encryption, hashing, reversal, splitting, and any transformation a server
applies of its own accord.

Each `Pattern` is a sequence of `elements`: sets of strings, one set per position. Its
regular expression is the concatenation of their alternations, so its longest match is
bounded (`max_len`, which decides how much of a streamed body the scrubber holds back) and
its first two characters come from a small, known set (`prefixes`, which lets the scrubber
skip ahead in C rather than trying every pattern at every byte).
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

Elements = tuple[frozenset[bytes], ...]

_B64_STD = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_URL = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@dataclass(frozen=True, slots=True)
class Pattern:
    """One family of spellings of one value (module docstring); `replace(match)` gives the
    text that goes to the sandbox instead."""

    kind: str                                    # "exact" | "text" | "hex" | "base64" ...
    elements: Elements
    replace: Callable[[bytes], bytes]

    @property
    def max_len(self) -> int:
        return sum(max(map(len, e)) for e in self.elements)

    def regex(self) -> bytes:
        return b"".join(_alternation(e) for e in self.elements)

    @property
    def lead(self) -> int:
        """1 when the first element is a wide class of single characters (a base64 edge),
        so `prefixes` describe the text from the second character on: the scrubber tries
        such a pattern one byte before where its prefixes hit. Else 0."""
        first = self.elements[0]
        return int(len(self.elements) >= 3 and len(first) > 2
                   and all(len(s) == 1 for s in first))

    def prefixes(self) -> set[bytes]:
        """Every text a match can begin with (after `lead` characters), cut to two
        characters (to one only for a pattern whose matches can be one character long)."""
        els = self.elements[self.lead:]
        out = {s[:2] for s in els[0] if len(s) >= 2}
        short = [s for s in els[0] if len(s) == 1]
        if short:
            if len(els) == 1:
                out.update(short)
            else:
                seconds = {t[:1] for t in els[1]}
                out.update(s + t for s in short for t in seconds)
        return out

    def __repr__(self) -> str:                  # the elements spell the value
        return f"Pattern({self.kind}, {len(self.elements)} elements)"


def exact(text: bytes, replacement: bytes) -> Pattern:
    """`text` byte for byte (an encoding the proxy produced itself, see secrets.Injection)."""
    return Pattern("exact", tuple(frozenset({bytes([c])}) for c in text),
                   lambda m: replacement)


def patterns(value: bytes, placeholder: bytes) -> list[Pattern]:
    """The text, hex and base64 patterns of one value (module docstring). Identical
    patterns (base64url equals base64 where no edge class holds ``+`` or ``/``) once."""
    out = [_text(value, placeholder), _hex(value, placeholder)]
    seen = set()
    for alphabet, kind in ((_B64_STD, "base64"), (_B64_URL, "base64url")):
        for align in range(3):
            p = _base64(value, placeholder, align, alphabet, kind)
            if p.elements not in seen:
                seen.add(p.elements)
                out.append(p)
    return out


# --- text ------------------------------------------------------------------------------

_ENTITIES: dict[int, tuple[bytes, ...]] | None = None


def _entity_names() -> dict[int, tuple[bytes, ...]]:
    """ASCII character -> its HTML5 named entities (``&sol;``, and the legacy ones without
    ``;``), loaded once."""
    global _ENTITIES
    if _ENTITIES is None:
        import html.entities

        names: dict[int, list[bytes]] = {}
        for name, text in html.entities.html5.items():
            if len(text) == 1 and 0x20 <= ord(text) < 0x7F:
                names.setdefault(ord(text), []).append(b"&" + name.encode("ascii"))
        _ENTITIES = {c: tuple(v) for c, v in names.items()}
    return _ENTITIES


@functools.lru_cache(maxsize=256)
def _char_spellings(c: int) -> frozenset[bytes]:
    ch = bytes([c])
    forms = {ch}
    hexes = {b"%02x" % c, b"%02X" % c}
    for h in hexes:
        forms |= {b"%" + h, b"%25" + h}
        for k in (1, 2, 3):
            forms |= {b"\\" * k + b"u00" + h, b"\\" * k + b"x" + h}
        for digits in (h, b"0" + h, b"00" + h):
            forms |= {b"&#x" + digits + b";", b"&#x" + digits}
    if not ch.isalnum():
        forms |= {b"\\" * k + ch for k in (1, 2, 3)}
    dec = b"%d" % c
    for digits in {dec, dec.rjust(3, b"0"), dec.rjust(4, b"0")}:
        forms |= {b"&#" + digits + b";", b"&#" + digits}
    forms.update(_entity_names().get(c, ()))
    if c == 0x20:
        forms.add(b"+")
    forms |= {f.upper() for f in forms} | {f.lower() for f in forms}
    return frozenset(forms)


def _text(value: bytes, placeholder: bytes) -> Pattern:
    def replace(m: bytes) -> bytes:
        if m != value and m == value.upper():
            return placeholder.upper()
        if m != value and m == value.lower():
            return placeholder.lower()
        return placeholder

    return Pattern("text", tuple(_char_spellings(c) for c in value), replace)


# --- hex -------------------------------------------------------------------------------

def _hex(value: bytes, placeholder: bytes) -> Pattern:
    digits = value.hex().encode("ascii")

    def replace(m: bytes) -> bytes:
        h = placeholder.hex().encode("ascii")
        return h.upper() if m != m.lower() else h

    return Pattern("hex", tuple(frozenset({bytes([d]), bytes([d]).upper()}) for d in digits),
                   replace)


# --- base64 ----------------------------------------------------------------------------

def _b64_digits(data: bytes) -> list[int]:
    """6-bit values of `data`'s base64 (zero bits after the end, no padding)."""
    std = base64.b64encode(data + b"\0" * (-len(data) % 3))
    return [_B64_STD.index(c) for c in std]


def _base64(value: bytes, placeholder: bytes, align: int, alphabet: bytes,
            kind: str) -> Pattern:
    n = len(value)
    start, end = 8 * align, 8 * (align + n)              # the value's bits in the frame
    first, stop = start // 6, -(-end // 6)               # the characters they touch
    digits = _b64_digits(b"\0" * align + value)
    elements = []
    for i in range(first, stop):
        lo, hi = max(start, 6 * i), min(end, 6 * i + 6)  # this character's value bits
        mask = ((1 << (hi - lo)) - 1) << (6 * i + 6 - hi)
        elements.append(frozenset(bytes([alphabet[x]]) for x in range(64)
                                  if x & mask == digits[i] & mask))
    left = start - 6 * first                             # neighbour bits kept, each side
    right = 6 * stop - end
    pad = placeholder + b"_" * ((n - len(placeholder)) % 3)

    def replace(m: bytes) -> bytes:
        bits = 0
        for c in m:
            bits = bits << 6 | alphabet.index(c)
        total = 6 * len(m)
        keep_left = bits >> (total - left)
        keep_right = bits & ((1 << right) - 1)
        new = keep_left
        for b in pad:
            new = new << 8 | b
        new = new << right | keep_right
        count = (left + 8 * len(pad) + right) // 6
        return bytes(alphabet[(new >> (6 * (count - 1 - j))) & 63] for j in range(count))

    return Pattern(f"{kind}@{align}", tuple(elements), replace)


# --- regular expressions ---------------------------------------------------------------

def warm() -> None:
    """Build the spellings of every printable ASCII character and their regexes now: they
    do not depend on any value, and both are kept (`_char_spellings`, `_alternation`), so
    that a proxy forked from the zygote (which calls this) compiles its grants' patterns
    without building them again: about half of that compile's CPU time, which every proxy
    with a grant spent at its start, beside the sandbox's own start."""
    for p in patterns(bytes(range(0x20, 0x7f)), b"corral_warm"):
        p.regex()


@functools.lru_cache(maxsize=1024)
def _alternation(strings: frozenset[bytes]) -> bytes:
    """A regex matching exactly one of `strings`: a character class when they are all one
    byte, else a trie of non-capturing groups (compact, longest alternative first where one
    is a prefix of another). Kept (bounded): a text pattern's elements are one character's
    spellings, the same for every value."""
    if all(len(s) == 1 for s in strings):
        if len(strings) == 1:
            return re.escape(next(iter(strings)))
        return _class(strings)
    return _trie(sorted(strings))


def _class(chars) -> bytes:
    return b"[" + b"".join(_class_char(s[0]) for s in sorted(chars)) + b"]"


def _class_char(c: int) -> bytes:
    ch = bytes([c])
    return b"\\" + ch if ch in b"\\]^-[" else ch


def _trie(strings: list[bytes]) -> bytes:
    """Strings with a common first character share a branch; first characters whose rests
    are the same regex share a character class (``%2[fF]``, ``&#[xX]``)."""
    groups: dict[int, list[bytes]] = {}
    end = False
    for s in strings:
        if s:
            groups.setdefault(s[0], []).append(s[1:])
        else:
            end = True
    by_rest: dict[bytes, list[int]] = {}
    for c, rest in sorted(groups.items()):
        by_rest.setdefault(_trie(rest), []).append(c)
    alts = [(_class([bytes([c]) for c in cs]) if len(cs) > 1 else re.escape(bytes(cs))) + rest
            for rest, cs in by_rest.items()]
    if not alts:
        return b""
    if end:                         # greedy: the longer spelling first, then none
        return b"(?:" + b"|".join(alts) + b")?"
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"
