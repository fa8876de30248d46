"""Isolation tiers: one module per tier on the contract in `base.py`, found through the
registry below.

A tier module is imported only when that tier is asked for (or by `auto`, `explain` and
`doctor`, which look at every tier). Adding a tier is one module and one row here."""

from __future__ import annotations

from ..errors import BackendUnavailable


class Tier:
    """A row of the registry: the tier's name, where its Backend class lives
    ("module:Class", relative to this package; None for a tier this release does not
    have), its place in `isolation = "auto"`'s order (None: auto never picks it), and
    whether a policy may name it."""

    __slots__ = ("name", "target", "auto", "public")

    def __init__(self, name: str, target: str | None, auto: int | None = None,
                 public: bool = True) -> None:
        self.name, self.target, self.auto, self.public = name, target, auto, public


REGISTRY = (
    Tier("namespace", "namespace:NamespaceBackend", auto=2),
    Tier("gvisor", "gvisor:GvisorBackend", auto=1),
    Tier("process", "process:ProcessBackend", auto=3),
    Tier("microvm", "microvm:MicrovmBackend"),  # own kernel; used when asked for, never by auto
    Tier("wasm", "wasm:WasmBackend"),  # computation only: used when asked for, never by auto
    # scripted results for tests of the faces' own logic; no policy can name it
    Tier("fake", "fake:FakeBackend", public=False),
)
_BY_NAME = {t.name: t for t in REGISTRY}

#: the tiers a policy may name, in the registry's order: the order in which a refusal
#: names "a tier that could" (the default tier first)
KNOWN = tuple(t.name for t in REGISTRY if t.public)
#: the order `isolation = "auto"` tries
AUTO_ORDER = tuple(t.name for t in sorted((t for t in REGISTRY if t.auto is not None),
                                          key=lambda t: t.auto))


def get_backend(tier: str):
    """The backend for a tier name, imported on demand. Raises BackendUnavailable for a
    tier this release does not have."""
    row = _BY_NAME.get(tier)
    if row is None or row.target is None:
        usable = ", ".join(f'"{t.name}"' for t in REGISTRY if t.public and t.target)
        raise BackendUnavailable(f"tier {tier!r} is not available in this release; use "
                                 f"isolation = {usable} or \"auto\"", field="isolation")
    module, _, cls = row.target.partition(":")
    # __import__ rather than importlib.import_module: importlib costs `corral run` ~1 ms
    return getattr(__import__(f"{__name__}.{module}", fromlist=[cls]), cls)()
