"""errors.option_values: the one walk of a command line's `NAME VALUE` / `NAME=VALUE`
options that the faces' parsers (probe, learn, batch, audit) share."""

import pytest

from corral.errors import UsageError, option_values


def test_values_inline_and_separate_and_the_rest_in_order():
    got = list(option_values(["a", "--x", "1", "--y=2", "--x=", "--z", "b"], ("--x", "--y")))
    assert got == [(None, "a"), ("--x", "1"), ("--y", "2"), ("--x", ""), (None, "--z"),
                   (None, "b")]


def test_a_value_is_taken_even_when_it_looks_like_an_option():
    assert list(option_values(["--x", "--y"], ("--x", "--y"))) == [("--x", "--y")]


def test_a_missing_value_is_a_usage_error_naming_the_option():
    with pytest.raises(UsageError, match="--x needs a value") as e:
        list(option_values(["a", "--x"], ("--x",)))
    assert e.value.field == "--x"


def test_after_the_end_marker_nothing_is_an_option():
    got = list(option_values(["--x=1", "--", "--x", "2"], ("--x",), end="--"))
    assert got == [("--x", "1"), (None, "--"), (None, "--x"), (None, "2")]
    # without an end marker `--` is an argument like any other
    assert list(option_values(["--", "--x", "2"], ("--x",))) == [(None, "--"), ("--x", "2")]
