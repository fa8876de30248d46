"""The images shipped with corral, as corral-image.toml files under data/ (and their locks,
when shipped, beside them as NAME.lock.json)."""

from __future__ import annotations

import os

DATA = os.path.join(os.path.dirname(__file__), "data")
CATALOGUE = ("python", "datascience")


def description(name: str) -> str:
    """The path of a catalogue image's corral-image.toml."""
    return os.path.join(DATA, f"{name}.toml")
