"""The text forms of a review's changes: unified diffs of text files, and the pieces of a
git-style patch (quoted names, modes, blob ids, base85 binary literals) that
runtime/changes.py assembles into one `git apply` accepts. Pure: bytes in, text out."""

from __future__ import annotations


def _range(start: int, stop: int) -> str:
    """A unified diff hunk's range (as difflib and diff write it)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def hunks(old: bytes, new: bytes) -> bytes:
    """The @@ hunks of a unified diff (3 lines of context) of two byte strings, with
    git's "\\ No newline at end of file" after a last line that has none."""
    import difflib

    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out: list[bytes] = []

    def line(prefix: bytes, text: bytes) -> None:
        out.append(prefix + text)
        if not text.endswith(b"\n"):
            out.append(b"\n\\ No newline at end of file\n")

    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n".encode())
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                for t in a[x1:x2]:
                    line(b" ", t)
                continue
            for t in a[x1:x2]:
                line(b"-", t)
            for t in b[y1:y2]:
                line(b"+", t)
    return b"".join(out)


def unified(old: bytes, new: bytes, old_path: str | None, new_path: str | None) -> bytes:
    """A unified diff with ---/+++ headers (None: /dev/null), each name quoted as git
    quotes it (a newline in a name cannot start a header line of its own)."""
    head = (b"--- " + (_git_name("a/", old_path) if old_path is not None else b"/dev/null")
            + b"\n+++ " + (_git_name("b/", new_path) if new_path is not None
                           else b"/dev/null") + b"\n")
    return head + hunks(old, new)


_ESCAPES = {0x07: "a", 0x08: "b", 0x09: "t", 0x0A: "n", 0x0B: "v", 0x0C: "f", 0x0D: "r",
            0x22: '"', 0x5C: "\\"}


def git_quote(name: str) -> bytes:
    """A path as git writes it in a patch: as is, or C-quoted if it has a control
    character, a quote, a backslash or a byte past ASCII (core.quotePath)."""
    raw = name.encode("utf-8", "surrogateescape")
    if all(0x20 <= c < 0x7F and c not in (0x22, 0x5C) for c in raw):
        return raw
    out = ['"']
    for c in raw:
        if c in _ESCAPES:
            out.append("\\" + _ESCAPES[c])
        elif 0x20 <= c < 0x7F:
            out.append(chr(c))
        else:
            out.append(f"\\{c:03o}")
    out.append('"')
    return "".join(out).encode()


def _git_name(prefix: str, path: str) -> bytes:
    q = git_quote(path)
    return b'"' + prefix.encode() + q[1:] if q.startswith(b'"') else prefix.encode() + q


def _git_mode(kind: str, mode: int) -> str:
    if kind == "symlink":
        return "120000"
    return "100755" if mode & 0o100 else "100644"


def _blob_id(data: bytes) -> str:
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _base85_lines(data: bytes) -> bytes:
    """git's binary patch body: zlib data in lines of up to 52 bytes, each base85 with a
    length letter (A-Z: 1-26, a-z: 27-52)."""
    import base64
    import zlib

    z = zlib.compress(data, 9)
    out = []
    for i in range(0, len(z), 52):
        chunk = z[i:i + 52]
        n = len(chunk)
        letter = chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)
        out.append(letter.encode() + base64.b85encode(chunk, pad=True) + b"\n")
    return b"".join(out)
