"""`corral explain`: the article's three questions for a policy on a tier, on this host,
then a line per rule saying what enforces it. Reads the very plan `corral run` would run
(tiers.prepare), so the two cannot disagree."""

from __future__ import annotations

from ..errors import BackendUnavailable, UnsupportedRule
from ..plan import EgressProxy, Plan
from ..policy import Policy

OP_RULE_NAMES = {"Namespaces": "isolation", "SystemRoot": "filesystem (root)",
                 "ImageRoot": "image",
                 "Seccomp": "kernel surface (seccomp)", "NoNetwork": "network (namespace)"}

#: how the sandbox's traffic leaves, per tier, with network.mode = "allow": the one way out
NETWORK_PATHS = {
    "namespace": ("the sandbox's network namespace has only loopback; corral opens a listener "
                  "on 127.0.0.1:3128 inside it and hands it to the egress proxy, which runs "
                  "outside: HTTP_PROXY -> 127.0.0.1:3128 in the sandbox's namespace -> the "
                  "proxy -> the allowed host"),
    "gvisor": ("gVisor's netstack has one link, a veth whose far end is a network namespace of "
               "corral's holding nothing but the egress proxy's listener: HTTP_PROXY -> "
               "{proxy} over the veth -> the proxy -> the allowed host"),
    "process": ("no network namespace: the egress proxy listens on the host's 127.0.0.1 at a "
                "port P of its own per command and admits only the sandbox's uid; cgroup "
                "socket programs (bpf), Landlock and seccomp let the command connect to that "
                "port only: HTTP_PROXY -> host 127.0.0.1:P -> the proxy -> the allowed host"),
}


def explain(policy: Policy, tier: str | None = None) -> dict:
    from .tiers import check_tier, prepare

    if tier is not None:
        policy = policy.replace(isolation=tier)
    install = None
    if policy.install.requested():   # explain never installs: it says what a run would do
        from ..images.policy_install import describe

        policy, install = describe(policy)
    refused = None
    try:
        backend, plan, check = prepare(policy)
    except UnsupportedRule as e:  # explain still describes what would happen, and why not
        refused = e
        import os

        from ..plan import build_plan

        plan = build_plan(policy, dict(os.environ))
        backend, check = check_tier(plan.tier if plan.tier != "auto" else "namespace", plan)
    rules = []
    for op in plan.ops:
        rule = op.rule or OP_RULE_NAMES.get(type(op).__name__, type(op).__name__)
        if not op.rule and getattr(op, "name", None) == "core":
            rule = "core dumps"
        gap = check.gap(op)
        if gap is not None:
            rules.append({"rule": rule, "enforced_by": "none", "note": gap.reason})
        else:
            by, note = backend.describe(op)
            rules.append({"rule": rule, "enforced_by": by, "note": note})
    out = {
        "tier": backend.name,
        "mechanism": backend.mechanism,
        "own_kernel": backend.own_kernel,
        "network": _network(plan, policy, backend),
        "workspace": _workspace(policy, backend.name),
        "credentials": _credentials(plan, policy),
        "root": dict(_root(plan), **({"install": install} if install else {})),
        "rules": rules,
        "properties": dict(backend.properties),
        "runs": refused is None,
    }
    if getattr(backend, "kernel_note", None):   # a tier whose guest reaches no kernel (wasm)
        out["kernel_note"] = backend.kernel_note
    if hasattr(backend, "guest_info"):          # what the wasm guest is granted
        out["guest"] = backend.guest_info(plan)
    if refused is not None:
        out["refused"] = refused.to_dict()
    return out


def _network(plan: Plan, policy: Policy, backend) -> dict:
    proxy = plan.find(EgressProxy)
    if not proxy:
        from ..plan import NoNetwork

        _, note = backend.describe(plan.find(NoNetwork)[0])
        return {"default_closed": True, "reachable": [], "note": note}
    n = policy.network
    return {"default_closed": True,
            "reachable": [f"{r} (via the egress proxy)" for r in n.allow],
            "denied": list(n.deny), "private_allowed": list(n.allow_private),
            "path": _network_path(backend.name),
            "note": backend.egress_note}


def _network_path(tier: str) -> str:
    path = NETWORK_PATHS.get(tier, "through the egress proxy (HTTP_PROXY)")
    if "{proxy}" in path:
        from ..backends.gvisor_net import PROXY_URL

        path = path.format(proxy=PROXY_URL.removeprefix("http://"))
    return path


def _workspace(policy: Policy, tier: str) -> dict | None:
    """The host directory the sandbox sees, its mode, and where it appears inside."""
    ws = policy.filesystem.workspace
    if ws is None:
        return None
    from ..plan import WORKSPACE

    # the process tier has no mount namespace: the workspace is at its host path
    same = tier == "process" or getattr(ws, "mount_at", None) == "same"
    return {"path": ws.path, "mode": ws.mode, "inside": ws.path if same else WORKSPACE}


def _root(plan: Plan) -> dict:
    """Which root the run sees, and whether the policy pins it."""
    from ..plan import ImageRoot

    for op in plan.find(ImageRoot):
        return {"kind": "image", "ref": op.ref, "digest": op.digest, "pinned": op.pinned}
    return {"kind": "host", "ref": "host", "digest": "", "pinned": False}


def _credentials(plan: Plan, policy: Policy) -> list[dict]:
    creds = []
    for name in policy.env.pass_:
        creds.append({"name": name, "how": "env.pass: the real value is in the sandbox's "
                                           "environment; the code can read and send it"})
    for s in policy.secrets:
        creds.append({"name": s.name, "how": "secret grant: the sandbox sees a placeholder; "
                      f"the proxy sends the value only to {', '.join(s.hosts)} for "
                      f"{s.ttl:g}s" + (" (plain HTTP too)" if s.plain_http else "")})
    return creds


def render(d: dict) -> str:
    own = {True: "yes", False: "no: it shares the host's kernel",
           "user-space": "a user-space kernel (gVisor) between it and the host's"}
    lines = [f"tier: {d['tier']} ({d['mechanism']})"]
    if not d["runs"]:
        lines.append(f"REFUSED: {d['refused']['field']}: {d['refused']['message']}")
    note = d.get("kernel_note")
    yes_no = "yes" if d["own_kernel"] is True else "no"
    lines.append("1. its own kernel? " + (f"{yes_no}; {note}" if note
                                          else own.get(d["own_kernel"], d["own_kernel"])))
    net = d["network"]
    reach = ", ".join(net["reachable"]) or "nothing"
    lines.append(f"2. network closed by default? {'yes' if net['default_closed'] else 'NO'}; "
                 f"reachable: {reach}")
    if "path" in net:
        private = ", ".join(net["private_allowed"]) or "none (the proxy refuses them)"
        lines.append(f"   private ranges the proxy may reach: {private}")
        lines.append(f"   network path ({d['tier']} tier): {net['path']}")
    creds = d["credentials"]
    lines.append("3. credentials it can reach: " + (
        "none" if not creds else "; ".join(f"{c['name']} ({c['how']})" for c in creds)))
    ws = d.get("workspace")
    lines.append("workspace: " + ("none" if ws is None else
                                  f"{ws['path']} ({'read-write' if ws['mode'] == 'rw' else 'read-only'}"
                                  f", {ws['mode']}) at {ws['inside']}"))
    root = d.get("root") or {}
    guest = d.get("guest")
    if guest:
        lines.append("root: none for the guest: " + guest["root"])
        lines.append("preopened: " + ", ".join(f"{p['path']} ({p['mode']})"
                                               for p in guest["preopens"]))
        lines.append(f"native extensions: {guest['native_extensions']}")
        lines.append(f"run_code sessions: {guest['sessions']}")
        if guest.get("live"):
            lines.append(f"live sandboxes: {guest['live']}")
    elif root.get("kind") == "image":
        pin = "pinned by digest" if root["pinned"] else "by name, not pinned (the name can " \
            "move)"
        lines.append(f"root: image {root['ref']} ({root['digest'] or 'unresolved'}), "
                     f"read-only; {pin}")
        if root.get("install"):
            lines.append(f"install: {root['install']['note']}")
    else:
        lines.append("root: the host's /usr and a minimal /etc, read-only; not pinned "
                     "(whatever the host has installed)")
    lines.append("rules:")
    width = max(len(r["rule"]) for r in d["rules"])
    for r in d["rules"]:
        lines.append(f"  {r['rule']:<{width}}  {r['enforced_by']:<10}  {r['note']}")
    return "\n".join(lines) + "\n"


__all__ = ["explain", "render", "BackendUnavailable"]
