"""Neutralising control and escape sequences in output shown on a terminal.

Sandboxed output must not drive the user's terminal: no cursor moves that hide lines, no
title or clipboard escapes (OSC 52), no fake prompts via carriage return. Every C0 control
character except newline and tab, DEL, and every C1 control is shown as a visible escape
such as "\\x1b"."""

from __future__ import annotations

import codecs

_KEEP = {0x0A, 0x09}
_TABLE = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in _KEEP}


def neutralise(text: str) -> str:
    return text.translate(_TABLE)


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
