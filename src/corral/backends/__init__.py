"""Isolation tiers. Each module turns a Plan into a running sandbox its own way."""

from __future__ import annotations

from ..errors import BackendUnavailable


def get_backend(tier: str):
    """The backend for a tier name, imported on demand."""
    if tier in ("namespace", "auto"):
        from .namespace import NamespaceBackend

        return NamespaceBackend()
    raise BackendUnavailable(f"tier {tier!r} is not available in this release; "
                             f"use isolation = \"namespace\"", field="isolation")
