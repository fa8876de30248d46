"""The policy: one schema (schema.py), loading with clear errors (load.py), TOML out (dump.py)."""

from .dump import dump_toml
from .load import load_policy, merge, policy_from_dict
from .schema import (BASE_ENV, FIELDS, TIERS, Env, Filesystem, Limits, Network, Policy,
                     Workspace)

__all__ = ["BASE_ENV", "FIELDS", "TIERS", "Env", "Filesystem", "Limits", "Network", "Policy",
           "Workspace", "dump_toml", "load_policy", "merge", "policy_from_dict"]
