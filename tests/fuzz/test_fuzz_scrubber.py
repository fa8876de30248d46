"""The response scrubber (egress/secrets.py ResponseScrubber, egress/forms.py): a secret
value, in every encoding the scrubber claims (forms.py's docstring), never survives a
response body, whatever the read boundaries, identity or gzip; the streamed answer is
the whole-text answer."""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
import string
from urllib.parse import unquote

from hypothesis import assume, example, given
from hypothesis import strategies as st
from strategies import split_points

from corral.egress.config import MIN_SECRET_LEN
from corral.egress.secrets import ResponseScrubber

PLACEHOLDER = "corral_TOKEN_0123456789abcdef0123456789abcdef"
#: what a grant's value may hold: printable ASCII, no space at either end (config.py)
VALUES = st.text(st.sampled_from(string.printable[:95]), min_size=MIN_SECRET_LEN,
                 max_size=24).filter(lambda v: v == v.strip() and v not in PLACEHOLDER
                                     and PLACEHOLDER not in v)
#: text around the value that no spelling uses: the decoded output shows what survived
INERT = st.text(st.sampled_from(" !<>,;()[]{}|~^`'\"\n"), max_size=12)


def _char(c: str, how: str) -> str:
    o = ord(c)
    return {
        "self": c, "pct": f"%{o:02X}", "pct-lower": f"%{o:02x}", "pct2": f"%25{o:02X}",
        "json-u": f"\\u{o:04x}", "json-U": f"\\u{o:04X}", "js-x": f"\\x{o:02x}",
        "html-dec": f"&#{o};", "html-dec0": f"&#{o:04d}", "html-hex": f"&#x{o:x};",
        "html-HEX": f"&#X{o:04X};", "esc": "\\" + c if not c.isalnum() else c,
        "esc2": "\\\\" + c if not c.isalnum() else c,
    }[how]


SPELLINGS = ["self", "pct", "pct-lower", "pct2", "json-u", "json-U", "js-x", "html-dec",
             "html-dec0", "html-hex", "html-HEX", "esc", "esc2"]


@st.composite
def text_spellings(draw, value: str) -> str:
    """The value with each character spelled independently, then maybe the case of all."""
    kind = draw(st.sampled_from(["as-is", "json", "html", "quote", "mixed"]))
    if kind == "json":
        text = json.dumps(value)[1:-1].replace("/", "\\/")
    elif kind == "html":
        text = html.escape(value)
    elif kind == "quote":
        from urllib.parse import quote, quote_plus
        text = draw(st.sampled_from([quote, quote_plus]))(value, safe="")
    elif kind == "mixed":
        text = "".join(_char(c, draw(st.sampled_from(SPELLINGS))) for c in value)
    else:
        text = value
    return draw(st.sampled_from([text, text.upper(), text.lower()]))


def _unescape(text: str) -> str:
    """The backslash escapes of JSON, JS and shells undone, 1 to 3 backslashes deep."""
    for _ in range(3):
        text = re.sub(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)",
                      lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) > 1
                      else m.group(1), text, flags=re.DOTALL)
    return text


def decoded_views(out: bytes) -> list[bytes]:
    """The output read back through every decoding the spellings used: a value that
    survived shows up in one of them."""
    text = out.decode("latin-1")
    views = [text, html.unescape(text), unquote(unquote(text)),
             unquote(unquote(text.replace("+", " "))), _unescape(text),
             _unescape(html.unescape(text))]
    views = [v.lower() for v in views]
    for run in re.findall(r"[0-9a-fA-F]{2,}", text):
        for start in (0, 1):
            piece = run[start:]
            views.append(bytes.fromhex(piece[:len(piece) // 2 * 2]).decode("latin-1"))
    for alphabet in (r"[A-Za-z0-9+/]", r"[A-Za-z0-9_-]"):
        for run in re.findall(alphabet + r"{4,}", text):
            run = run.replace("-", "+").replace("_", "/")
            for start in range(4):
                piece = run[start:]
                piece = piece[:len(piece) // 4 * 4]
                try:
                    views.append(base64.b64decode(piece).decode("latin-1"))
                except ValueError:
                    pass
    return [v.encode("latin-1", "replace") for v in views]


def scrub_stream(value: bytes, body: bytes, pieces: list[bytes], coding: str) -> bytes:
    s = ResponseScrubber({value: PLACEHOLDER.encode()})
    headers = [(b"content-type", b"text/plain")]
    if coding == "gzip":
        headers.append((b"content-encoding", b"gzip"))
    sent = s.start(headers, has_body=True)
    assert all(k.lower() != b"content-encoding" for k, _ in sent) or coding != "gzip"
    return b"".join(b"".join(s.feed(p)) for p in pieces) + s.end()


def check_gone(value: str, out: bytes) -> None:
    low = value.lower().encode()
    for view in decoded_views(out):
        assert low not in view.lower(), f"the value survived: {out!r}"


@given(VALUES, INERT, INERT, st.data())
@example("s3cr3t-token", "", "", None)
def test_text_spellings_never_survive(value, before, after, data):
    spelled = data.draw(text_spellings(value)) if data is not None else value
    body = (before + spelled + after).encode()
    pieces = data.draw(split_points(body)) if data is not None else [body]
    out = scrub_stream(value.encode(), body, pieces, "identity")
    check_gone(value, out)
    assert out == ResponseScrubber({value: PLACEHOLDER}).scrub(body)  # streamed == whole


@given(VALUES, st.text(st.sampled_from(string.printable[:95]), max_size=7),
       st.text(st.sampled_from(string.printable[:95]), max_size=7),
       st.sampled_from(["std", "std-nopad", "url", "url-nopad"]), INERT, INERT, st.data())
def test_base64_at_every_alignment_never_survives(value, left, right, kind, before, after,
                                                 data):
    assume(value.lower() not in (left + value + right).lower().replace(value.lower(), "", 1))
    assume(value.lower() not in (before + after).lower())   # the run below is the encoding
    enc = (base64.b64encode if kind.startswith("std") else base64.urlsafe_b64encode)(
        (left + value + right).encode()).decode()
    if kind.endswith("nopad"):
        enc = enc.rstrip("=")
    body = (before + enc + after).encode()
    out = scrub_stream(value.encode(), body, data.draw(split_points(body)), "identity")
    check_gone(value, out)
    # and the replacement still decodes: the placeholder where the value was
    run = re.search(r"[A-Za-z0-9+/_-]{4,}=*", out.decode())
    assert run is not None
    fixed = run.group().replace("-", "+").replace("_", "/")
    decoded = base64.b64decode(fixed + "=" * (-len(fixed) % 4))
    assert PLACEHOLDER.encode() in decoded


@given(VALUES, st.booleans(), INERT, INERT, st.data())
def test_hex_never_survives(value, upper, before, after, data):
    h = value.encode().hex()
    body = (before + (h.upper() if upper else h) + after).encode()
    out = scrub_stream(value.encode(), body, data.draw(split_points(body)), "identity")
    check_gone(value, out)


@given(VALUES, INERT, INERT, st.data())
def test_gzip_bodies_are_scrubbed_across_reads(value, before, after, data):
    spelled = data.draw(text_spellings(value))
    body = (before + spelled + after).encode()
    packed = gzip.compress(body)
    out = scrub_stream(value.encode(), packed, data.draw(split_points(packed)), "gzip")
    check_gone(value, out)
    assert out == ResponseScrubber({value: PLACEHOLDER}).scrub(body)


@given(VALUES, st.lists(st.sampled_from(["self", "pct", "html-dec", "json-u", "b64", "hex"]),
                        min_size=2, max_size=5), st.data())
def test_many_copies_in_one_body_never_survive(value, kinds, data):
    parts = []
    for k in kinds:
        if k == "b64":
            parts.append(base64.b64encode(value.encode()).decode())
        elif k == "hex":
            parts.append(value.encode().hex())
        else:
            parts.append("".join(_char(c, k) for c in value))
    body = " | ".join(parts).encode()
    out = scrub_stream(value.encode(), body, data.draw(split_points(body)), "identity")
    check_gone(value, out)
