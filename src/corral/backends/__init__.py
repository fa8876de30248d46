"""Isolation tiers. Each module turns a Plan into a running sandbox its own way.

A tier module is imported only when that tier is asked for (or by `auto`, `explain` and
`doctor`, which look at every tier)."""

from __future__ import annotations

from ..errors import BackendUnavailable

#: the order `isolation = "auto"` tries; wasm is used only when asked for
AUTO_ORDER = ("microvm", "gvisor", "namespace", "process")
KNOWN = ("namespace", "gvisor", "process", "microvm", "wasm")


def get_backend(tier: str):
    """The backend for a tier name, imported on demand. Raises BackendUnavailable for a
    tier this release does not have."""
    if tier == "namespace":
        from .namespace import NamespaceBackend

        return NamespaceBackend()
    if tier == "gvisor":
        from .gvisor import GvisorBackend

        return GvisorBackend()
    if tier == "process":
        from .process import ProcessBackend

        return ProcessBackend()
    raise BackendUnavailable(f"tier {tier!r} is not available in this release; use "
                             f"isolation = \"namespace\", \"gvisor\", \"process\" or "
                             f"\"auto\"", field="isolation")
