"""Durations and sizes as the policy spells them. Pure functions, no I/O.

Durations: "500ms", "60s", "2m", "1h", or a bare number of seconds (int, float or a string
of digits). Sizes: a whole number of bytes, or a number with K, M, G or T (binary: 1M is
1 MiB); "KiB"/"MiB" spellings and a trailing "B" are accepted too.
"""

from __future__ import annotations

_DIGITS = frozenset("0123456789")


def _number_and_unit(text: str) -> tuple[float, str] | None:
    """("1.5", "ms") from "1.5ms": digits, an optional fraction, then letters. (No `re`:
    this is on the start-up path of every run.)"""
    t = text.strip()
    i = 0
    while i < len(t) and t[i] in _DIGITS:
        i += 1
    if i == 0:
        return None
    if i < len(t) and t[i] == ".":
        j = i + 1
        while j < len(t) and t[j] in _DIGITS:
            j += 1
        if j == i + 1:
            return None
        i = j
    return float(t[:i]), t[i:].strip()
_DUR_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
_SIZE_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_duration(value: object) -> float:
    """Seconds as a float. Raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as \"500ms\", \"60s\" or \"2m\"")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:           # an int past a float's range (JSON, a dict)
            raise ValueError("a duration must be a finite number of seconds") from None
    elif isinstance(value, str):
        parsed = _number_and_unit(value)
        if parsed is None or parsed[1] not in _DUR_SCALE:
            raise ValueError(f"{value!r} is not a duration; write \"500ms\", \"60s\" or \"2m\"")
        seconds = parsed[0] * _DUR_SCALE[parsed[1]]
    else:
        raise ValueError("expected a duration such as \"500ms\", \"60s\" or \"2m\"")
    if not (seconds == seconds) or seconds in (float("inf"), float("-inf")):
        raise ValueError("a duration must be a finite number of seconds")
    return seconds


def parse_size(value: object) -> int:
    """Bytes as an int. Raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 4096, \"64K\", \"512M\" or \"1G\"")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        parsed = _number_and_unit(value)
        unit = parsed[1].upper() if parsed else ""
        if unit.endswith("IB"):
            unit = unit[:-2]
        elif unit.endswith("B"):
            unit = unit[:-1]
        if parsed and unit in _SIZE_SCALE:
            n = parsed[0] * _SIZE_SCALE[unit]
            if n.is_integer():
                return int(n)
            raise ValueError(f"{value!r} is not a whole number of bytes")
        raise ValueError(f"{value!r} is not a size; write bytes or \"64K\", \"512M\", \"1G\"")
    raise ValueError("expected a size such as 4096, \"64K\", \"512M\" or \"1G\"")


def format_duration(seconds: float) -> str:
    """The shortest spelling that parse_duration reads back exactly (a finite, non-negative
    number of seconds)."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    ms = seconds * 1000
    if ms == int(ms) and int(ms) * 0.001 == seconds:   # how parse_duration reads "NNNms"
        return f"{int(ms)}ms"
    text = repr(float(seconds))
    if "e" in text:   # 3.2e-166 or 1e+20: parse_duration reads digits and one point only
        from decimal import Decimal

        text = format(Decimal(text), "f")
    return f"{text}s"


def format_size(n: int) -> str:
    for suffix, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n and n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)
