"""Tier choice: plan a policy, check it against a tier (the tier's TierCheck, see
backends/base.py), refuse an explicit rule the tier cannot enforce (naming a tier that
could), and hand the check on: the defaults it leaves unenforced become "unenforced"
events in every Result. `Sandbox` and `explain` decide through here."""

from __future__ import annotations

import os

from ..errors import BackendUnavailable, UnsupportedRule
from ..plan import Plan, build_plan
from ..policy import Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def coerce_policy(policy: Policy | dict | str | os.PathLike | None) -> Policy:
    """A Policy from a Policy, a dict in the TOML layout, or a TOML file path."""
    if policy is None:
        if _DEFAULT[0] is None:
            _DEFAULT[0] = Policy()
        return _DEFAULT[0]
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, dict):
        key = _dict_key(policy)
        made = _FROM_DICT.get(key) if key is not None else None
        if made is not None:
            return made
        from ..policy import policy_from_dict  # not for a Policy, None or a made one

        made = policy_from_dict(policy)
        if key is not None:
            if len(_FROM_DICT) >= FROM_DICT_MAX:
                del _FROM_DICT[next(iter(_FROM_DICT))]   # the oldest
            _FROM_DICT[key] = made
        return made
    from ..policy import load_policy

    return load_policy(os.fspath(policy))


#: the Plans made lately: id(policy) -> (policy, learn, the env.pass values, plan).
#: build_plan is a function of the policy, `learn` and the host variables env.pass names
#: (policy.sandbox_env), so a run with the same Policy object (the default one, one made
#: from the same dict, the caller's own) and the same values takes the same frozen Plan.
#: At most PLANS_MAX, the oldest dropped first.
PLANS_MAX = 32
_PLANS: dict = {}


def _plan(policy: Policy, host_env, learn: bool) -> Plan:
    env = tuple((n in host_env, host_env.get(n)) for n in policy.env.pass_)
    hit = _PLANS.get(id(policy))
    if hit is not None and hit[0] is policy and hit[1] == learn and hit[2] == env:
        return hit[3]
    plan = build_plan(policy, host_env, learn=learn)
    if len(_PLANS) >= PLANS_MAX:
        del _PLANS[next(iter(_PLANS))]
    _PLANS[id(policy)] = (policy, learn, env, plan)
    return plan


#: the default Policy (frozen: one is shared), made on first use
_DEFAULT: list = [None]
#: Policies made from dicts (frozen: one is shared safely), by the dict's content:
#: validating a dict costs ~0.1 ms of each corral.run(argv, policy) and most callers pass
#: the same few. Only dicts whose Policy depends on nothing but their content are kept:
#: plain data, no section that names a host path (checked against the host each time) or
#: holds secret values. At most FROM_DICT_MAX, the oldest dropped first.
FROM_DICT_MAX = 32
_FROM_DICT: dict = {}
_CACHEABLE = frozenset(("isolation", "image", "limits", "env", "network", "audit", "batch"))


def _dict_key(policy: dict):
    """A hashable copy of a policy dict's content, with each value's type (True and 1
    differ), or None when its Policy must be made afresh (see _FROM_DICT)."""
    if not _CACHEABLE.issuperset(policy):
        return None
    net = policy.get("network")
    if isinstance(net, dict) and "upstream_ca" in net:
        return None
    try:
        return _frozen(policy, 0)
    except (TypeError, RecursionError):
        return None


def _frozen(v, depth: int):
    t = type(v)
    if t in (str, int, float, bool) or v is None:
        return (t, v)
    if depth > 8:
        raise TypeError("too deep")
    if t is dict:
        return (dict, tuple((_frozen(k, depth + 1), _frozen(x, depth + 1))
                            for k, x in v.items()))
    if t is list or t is tuple:
        return (t, tuple(_frozen(x, depth + 1) for x in v))
    raise TypeError(f"not plain data: {t.__name__}")


def check_tier(tier, plan: Plan):
    """(backend, its TierCheck of the plan) for a tier (a name, or a Backend instance).
    Raises BackendUnavailable."""
    if isinstance(tier, str):
        from ..backends import get_backend

        backend = get_backend(tier)
    else:
        backend = tier
    return backend, backend.check(plan)


def tiers_that_could(rule: str, plan: Plan, skip: str) -> tuple[str, ...]:
    """The tiers available here, other than `skip`, that would not refuse this rule of
    the plan, in the registry's order."""
    from ..backends import KNOWN

    could = []
    for tier in KNOWN:
        if tier == skip:
            continue
        try:
            _, check = check_tier(tier, plan)
        except BackendUnavailable:
            continue
        if not any(g.rule == rule for g in check.refused):
            could.append(tier)
    return tuple(could)


def prepare(policy: Policy, host_env: Mapping[str, str] | None = None, backend=None, *,
            learn: bool = False):
    """Plan the policy and check it against the tier: (backend, plan, its TierCheck, which
    the backend's open() takes).

    A rule the user set explicitly that the tier cannot enforce raises UnsupportedRule
    naming the rule and a tier that could (nothing runs); a default it cannot enforce
    becomes an "unenforced" event. `isolation = "auto"` takes the first tier of
    AUTO_ORDER that is available here and enforces every explicit rule.

    `backend`: a Backend instance to use instead of the policy's tier (tests of the faces
    give a FakeBackend; no policy can name one). `learn`: the proxy in learn mode
    (runtime/learn.py)."""
    from ..backends import AUTO_ORDER

    plan = _plan(policy, os.environ if host_env is None else host_env, learn)
    if policy.image != "host":   # the store is read only for a run on an image
        from ..images.resolve import resolve_plan

        plan = resolve_plan(plan)
    if backend is not None:
        plan = plan.replace(tier=backend.name)
        backend, check = check_tier(backend, plan)
        if check.refused:
            gap = check.refused[0]
            raise UnsupportedRule(f"the {backend.name} tier cannot enforce it: {gap.reason}",
                                  field=gap.op.rule)
    elif plan.tier == "auto":
        reasons = []
        for tier in AUTO_ORDER:
            try:
                backend, check = check_tier(tier, plan)
            except BackendUnavailable as e:
                reasons.append(f"{tier}: {e.message}")
                continue
            skip = backend.auto_skip()
            if skip:
                reasons.append(f"{tier}: {skip}")
                continue
            if not check.refused:
                break
            reasons.append(f"{tier}: cannot enforce {check.refused[0].op.rule}")
        else:
            raise BackendUnavailable("no tier here enforces this policy: " + "; ".join(reasons),
                                     field="isolation")
    else:
        backend, check = check_tier(plan.tier, plan)
        if check.refused:
            gap = check.refused[0]
            gap = gap.replace(could=tiers_that_could(gap.rule, plan, backend.name))
            hint = (f"; isolation = \"{gap.could[0]}\" could" if gap.could
                    else "; no tier available here could")
            raise UnsupportedRule(f"the {backend.name} tier cannot enforce it on this host: "
                                  f"{gap.reason}{hint}", field=gap.op.rule)
    return backend, plan, check
