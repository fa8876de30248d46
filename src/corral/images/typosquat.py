"""A name that is almost a popular package's is refused before anything is fetched.

Near means, after PEP 503 normalisation (lower case, runs of `-_.` as one `-`): the same
letters once separators are dropped (`python_dateutil`, `pythondateutil`), the same after
homoglyph folding (`0`->o, `1`/`l`/`I`->l, `rn`->m, `vv`->w, ...), a `python-`/`py-`/`py`
prefix or a `-python`/`-py` suffix on a popular name, or an edit distance of 1 (2 for
names of 8 letters or more; swaps of neighbours count 1). The popular names are shipped in
data/popular-pypi.txt with their source and date."""

from __future__ import annotations

import os
import re

from ..errors import ImageError

_HOMOGLYPHS = (("rn", "m"), ("vv", "w"), ("0", "o"), ("1", "l"), ("i", "l"), ("5", "s"),
               ("3", "e"), ("@", "a"))


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def popular() -> list[str]:
    path = os.path.join(os.path.dirname(__file__), "data", "popular-pypi.txt")
    with open(path) as f:
        return [normalise(x.strip()) for x in f if x.strip() and not x.startswith("#")]


def _fold(name: str) -> str:
    s = name.replace("-", "")
    for a, b in _HOMOGLYPHS:
        s = s.replace(a, b)
    return s


def distance(a: str, b: str, cap: int = 3) -> int:
    """Optimal string alignment distance (insert, delete, substitute, swap neighbours)."""
    if abs(len(a) - len(b)) >= cap:
        return cap
    prev2, prev = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if prev2 is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def near(name: str, names: list[str] | None = None) -> tuple[str, str] | None:
    """(popular name, why) when `name` is near one but not one; else None."""
    n = normalise(name)
    names = names if names is not None else popular()
    if n in names:
        return None
    for p in names:
        if n.replace("-", "") == p.replace("-", ""):
            return p, "the same name with other separators"
        if _fold(n) == _fold(p):
            return p, "the same name with look-alike characters"
        for pre in ("python-", "py-", "py"):
            if n == pre + p:
                return p, f"the popular name with a {pre!r} prefix"
        for suf in ("-python", "-py"):
            if n == p + suf:
                return p, f"the popular name with a {suf!r} suffix"
    for p in names:
        limit = 2 if len(p) >= 8 else 1
        if len(p) >= 4 and distance(n, p, limit + 1) <= limit:
            return p, f"{distance(n, p)} edit(s) from it"
    return None


def check(names, allowed=()) -> None:
    """ImageError for the first name near a popular one that `allowed` does not list."""
    ok = {normalise(a) for a in allowed}
    pop = popular()
    for name in names:
        if normalise(name) in ok:
            continue
        hit = near(name, pop)
        if hit:
            raise ImageError(f"{name!r} is close to the popular package {hit[0]!r} ({hit[1]}); "
                             f"a typosquat? If you mean {name!r}, pass --allow-name {name}",
                             field="PACKAGE")
