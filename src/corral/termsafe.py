"""Neutralising control and escape sequences in output shown on a terminal.

Sandboxed output must not drive the user's terminal: no cursor moves that hide lines, no
title or clipboard escapes (OSC 52), no fake prompts via carriage return. Every C0 control
character except newline and tab, DEL, and every C1 control is shown as a visible escape
such as "\\x1b".

What a person reviews (`review`: the names and diff lines of a review's changes) must
also show the text as it is stored, not as it renders: the bidirectional controls
(U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C) reorder what follows them
("Trojan Source", CVE-2021-42574) and the zero-width characters (U+200B-U+200D, U+2060,
U+FEFF) hide between letters, so each is shown as a visible escape such as "\\u202e";
so is a lone surrogate (an undecodable byte of a name: "\\xff"). Plain output keeps
them (a zero-width joiner belongs in an emoji; right-to-left text needs no controls to
be shown rightly, and an escape there would garble it)."""

from __future__ import annotations

import codecs

_KEEP = {0x0A, 0x09}
_TABLE = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in _KEEP}

#: the characters that reorder or hide text: escaped in what a person reviews
INVISIBLE = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C,
             *range(0x200B, 0x200E), 0x2060, 0xFEFF)
_REVIEW = {**_TABLE, **{c: f"\\u{c:04x}" for c in INVISIBLE},
           **{c: f"\\x{c & 0xFF:02x}" for c in range(0xDC80, 0xDD00)},
           **{c: "\\ufffd" for c in (*range(0xD800, 0xDC80), *range(0xDD00, 0xE000))}}


def neutralise(text: str) -> str:
    return text.translate(_TABLE)


def review(text: str) -> str:
    """`text` as neutralise() shows it, and with every bidirectional control, zero-width
    character and lone surrogate shown as a visible escape: for names and diff lines a
    person judges."""
    return text.translate(_REVIEW)


class SafeWriter:
    """Decodes a byte stream incrementally (UTF-8, errors replaced) and writes it to a
    text stream with control characters neutralised."""

    def __init__(self, out) -> None:
        self.out = out
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, data: bytes) -> None:
        self.out.write(neutralise(self.decoder.decode(data)))
        self.out.flush()

    def finish(self) -> None:
        rest = self.decoder.decode(b"", final=True)
        if rest:
            self.out.write(neutralise(rest))
            self.out.flush()
