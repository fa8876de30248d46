"""The wire form of file names that are not UTF-8 (service/common.py): every name the
sandbox can make has exactly one written form and comes back from it; near misses of the
quoted form are refused in one line; and termsafe.review shows what reorders or hides
text. Pure: data in, data out."""

import os

import pytest

from corral.runtime.files import FilesError
from corral.service.common import local_name, wire_json, wire_name
from corral.termsafe import neutralise, review

ROUND = [  # (the sandbox's name, surrogate-escaped as os.fsdecode gives it; its wire form)
    ("/scratch/plain.txt", "/scratch/plain.txt"),
    ("/scratch/\udcff\udcfe", '/scratch/"\\xff\\xfe"'),
    ("a\udcffb/c", '"a\\xffb"/c'),
    ("\udcc3/in", '"\\xc3"/in'),                  # half of a UTF-8 character
    ('"q"', '"\\"q\\""'),                          # shaped like the quoted form itself
    ('""', '"\\"\\""'),
    ('"', '"'),                                    # a lone quote is no quoted form
    ('q"uote', 'q"uote'),
    ('"open', '"open'),
    ("back\\slash", "back\\slash"),               # a backslash alone needs nothing
    ("back\\slash\udcff", '"back\\\\slash\\xff"'),
    ("tab\there\nnl", "tab\there\nnl"),           # JSON carries these as they are
    ("\u00e4 b", "\u00e4 b"),
]


@pytest.mark.parametrize("name,wire", ROUND)
def test_each_name_has_one_wire_form_and_comes_back(name, wire):
    assert wire_name(name) == wire
    assert local_name(wire) == name
    wire.encode("utf-8")                          # what any JSON answer can carry


def test_every_byte_comes_back():
    for b in range(1, 256):
        if b == 0x2F:
            continue
        name = os.fsdecode(bytes([b, 0x80, b]))
        assert local_name(wire_name(name)) == name, b


@pytest.mark.parametrize("bad", ['"\\q"', '"a"b"', '"\\x2f"', '"\\x00"', '""', '"\\x0"',
                                 '"\\xg0"', '"tail\\"', "dir/\"\\u00e4\""])
def test_a_malformed_quoted_component_is_refused_naming_the_field(bad):
    with pytest.raises(FilesError) as e:
        local_name(bad, "old")
    assert e.value.field == "old" and "\\xNN" in e.value.message


def test_wire_json_reaches_every_string_holding_a_surrogate_escape():
    got = wire_json({"a": ["x\udcff", {"k\udcfe": 1}], "n": 2, "ok": "plain"})
    assert got == {"a": ['"x\\xff"', {'"k\\xfe"': 1}], "n": 2, "ok": "plain"}


@pytest.mark.parametrize("text,shown", [
    ("x = 1 # \u202e }\u2066if admin:\u2069", "x = 1 # \\u202e }\\u2066if admin:\\u2069"),
    ("ke\u200bep\ufeff", "ke\\u200bep\\ufeff"),
    ("\u200e\u200f\u061c\u2060\u200c\u200d", "\\u200e\\u200f\\u061c\\u2060\\u200c\\u200d"),
    ("\x1b[2J\r", "\\x1b[2J\\x0d"),
    ("n\udcffb", "n\\xffb"),
    ("\u202f\u2065\u206a \u05d0\u05d1", "\u202f\u2065\u206a \u05d0\u05d1"),   # near misses
    ("emoji \U0001f468\u200d\U0001f469", "emoji \U0001f468\\u200d\U0001f469"),
])
def test_review_shows_what_reorders_or_hides_text(text, shown):
    assert review(text) == shown


def test_plain_output_keeps_joiners_and_bidi_text():
    assert neutralise("\U0001f468\u200d\U0001f469 \u05d0\u202e") == \
        "\U0001f468\u200d\U0001f469 \u05d0\u202e"
