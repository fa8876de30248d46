"""The policy: one schema (schema.py), loading with clear errors (load.py), TOML out (dump.py)."""

from .schema import BASE_ENV, TIERS, Env, Filesystem, Limits, Network, Policy, Workspace

_LOADERS = ("load_policy", "merge", "policy_from_dict")


def __getattr__(name: str):
    # load.py (and units.py) are imported when a policy is read: `corral run` with no
    # policy file and no options has nothing to read (Policy() is that policy)
    if name in _LOADERS:
        from . import load

        return getattr(load, name)
    if name == "FIELDS":   # made on first use (schema.py): no run reads it
        from .schema import FIELDS

        return FIELDS
    raise AttributeError(f"module 'corral.policy' has no attribute {name!r}")


def dump_toml(policy: Policy) -> str:
    """The policy as TOML that --policy reads back (imports json: not on the run path)."""
    from .dump import dump_toml as _dump

    return _dump(policy)


__all__ = ["BASE_ENV", "FIELDS", "TIERS", "Env", "Filesystem", "Limits", "Network", "Policy",
           "Workspace", "dump_toml", "load_policy", "merge", "policy_from_dict"]
