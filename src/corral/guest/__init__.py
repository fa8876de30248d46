"""Code that runs INSIDE a sandbox: standard library only, any python3 >= 3.8, no corral.

The host never imports these modules to run them; it reads their source (`source(name)`)
and ships it in (the interpreter runners are passed whole on the command line, as
`python3 -c SOURCE` or `node -e SOURCE`), so they work on images without corral installed.
"""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def source(name: str) -> str:
    """The text of a guest file (e.g. "runner.py", "runner.js"), read once per call."""
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()
