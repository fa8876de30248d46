"""Tier choice: plan a policy, check every op against a tier, refuse an explicit rule the
tier cannot enforce (naming a tier that could), and turn a default it cannot enforce into
an "unenforced" event. `Sandbox`, `explain` and `doctor` all decide through here."""

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
        return Policy()
    if isinstance(policy, Policy):
        return policy
    from ..policy import load_policy, policy_from_dict  # not for a Policy or None

    if isinstance(policy, dict):
        return policy_from_dict(policy)
    return load_policy(os.fspath(policy))


def _is_explicit(rule: str, plan: Plan) -> bool:
    return bool(rule) and (rule in plan.explicit or any(
        e.startswith(rule + ".") for e in plan.explicit) or (
        rule == "network.mode" and any(e.startswith("network.") for e in plan.explicit)))


def check_tier(tier, plan: Plan):
    """(backend, refusals, unenforced) for a tier (a name, or a Backend instance):
    refusals are the (op, reason) pairs of explicit rules it cannot enforce. Raises
    BackendUnavailable."""
    if isinstance(tier, str):
        from ..backends import get_backend

        backend = get_backend(tier)
    else:
        backend = tier
    missing = backend.check(plan)
    refusals = [(op, why) for op, why in missing if _is_explicit(op.rule, plan)]
    unenforced = [(op, why) for op, why in missing if not _is_explicit(op.rule, plan)]
    return backend, refusals, unenforced


def _tiers_that_could(rule: str, plan: Plan, skip: str) -> list[str]:
    from ..backends import KNOWN

    could = []
    for tier in KNOWN:
        if tier == skip:
            continue
        try:
            _, refusals, _ = check_tier(tier, plan)
        except BackendUnavailable:
            continue
        if not any(op.rule == rule for op, _ in refusals):
            could.append(tier)
    return could


def prepare(policy: Policy, host_env: Mapping[str, str] | None = None, backend=None):
    """Plan the policy and check it against the tier: (backend, plan, standing events).

    A rule the user set explicitly that the tier cannot enforce raises UnsupportedRule
    naming the rule and a tier that could (nothing runs); a default it cannot enforce
    becomes an "unenforced" event. `isolation = "auto"` takes the first tier of
    AUTO_ORDER that is available here and enforces every explicit rule.

    `backend`: a Backend instance to use instead of the policy's tier (tests of the faces
    give a FakeBackend; no policy can name one)."""
    from ..backends import AUTO_ORDER

    plan = build_plan(policy, os.environ if host_env is None else host_env)
    if policy.image != "host":   # the store is read only for a run on an image
        from ..images.resolve import resolve_plan

        plan = resolve_plan(plan)
    if backend is not None:
        plan = plan.replace(tier=backend.name)
        backend, refusals, unenforced = check_tier(backend, plan)
        if refusals:
            op, reason = refusals[0]
            raise UnsupportedRule(f"the {backend.name} tier cannot enforce it: {reason}",
                                  field=op.rule)
    elif plan.tier == "auto":
        reasons = []
        for tier in AUTO_ORDER:
            try:
                backend, refusals, unenforced = check_tier(tier, plan)
            except BackendUnavailable as e:
                reasons.append(f"{tier}: {e.message}")
                continue
            skip = backend.auto_skip()
            if skip:
                reasons.append(f"{tier}: {skip}")
                continue
            if not refusals:
                break
            reasons.append(f"{tier}: cannot enforce {refusals[0][0].rule}")
        else:
            raise BackendUnavailable("no tier here enforces this policy: " + "; ".join(reasons),
                                     field="isolation")
    else:
        backend, refusals, unenforced = check_tier(plan.tier, plan)
        if refusals:
            op, reason = refusals[0]
            could = _tiers_that_could(op.rule, plan, backend.name)
            hint = (f"; isolation = \"{could[0]}\" could" if could
                    else "; no tier available here could")
            raise UnsupportedRule(f"the {backend.name} tier cannot enforce it on this host: "
                                  f"{reason}{hint}", field=op.rule)
    if not unenforced:
        return backend, plan, []
    from ..events import UnenforcedEvent

    events = [UnenforcedEvent(op.rule or type(op).__name__, backend.name, why).to_dict()
              for op, why in unenforced]
    return backend, plan, events
