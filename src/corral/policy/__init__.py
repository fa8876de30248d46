"""The policy: one schema (schema.py), loading with clear errors (load.py), TOML out (dump.py)."""

from .load import load_policy, merge, policy_from_dict
from .schema import BASE_ENV, FIELDS, TIERS, Env, Filesystem, Limits, Network, Policy, Workspace


def dump_toml(policy: Policy) -> str:
    """The policy as TOML that --policy reads back (imports json: not on the run path)."""
    from .dump import dump_toml as _dump

    return _dump(policy)


__all__ = ["BASE_ENV", "FIELDS", "TIERS", "Env", "Filesystem", "Limits", "Network", "Policy",
           "Workspace", "dump_toml", "load_policy", "merge", "policy_from_dict"]
