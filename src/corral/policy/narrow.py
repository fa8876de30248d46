"""Whether one policy is within another: a batch job's own policy may narrow the batch's,
never widen it (scale/, docs/scale.md).

    widening(base, job_policy) -> None, or (key, why) of the first rule it widens

Pure: compares two validated Policy objects key by key. A key the job did not change is
never a widening; env.set is free (the job's own variables); every other difference must
make the job's sandbox no larger than the batch's: lower limits, fewer hosts, more denies,
a narrower workspace mode, fewer binds, passed variables and secrets, the same image, and
an isolation tier at least as strong.
"""

from __future__ import annotations

from .schema import SPEC_BY_PATH, Policy

#: tiers by strength of isolation (docs/tiers.md): a job may move up, never down
TIER_RANK = {"process": 0, "namespace": 1, "wasm": 2, "gvisor": 2, "microvm": 3}
#: tiers that run no native code (wasm: Python in a WASI runtime; no shell, no
#: subprocesses, no sockets): a base of one admits that tier only, since every other tier,
#: however strongly isolated, runs native programs it never would
CODE_ONLY = frozenset({"wasm"})
_MODE_RANK = {"ro": 0, "review": 1, "rw": 2}
#: limits a job may lower (idle_timeout is a live sandbox's, never a batch job's)
_LIMITS = ("timeout", "cpu_time", "memory", "cpus", "pids", "scratch", "scratch_inodes",
           "output", "open_files", "file_size")


def widening(base: Policy, job: Policy) -> tuple[str, str] | None:
    """(dotted key, why) of the first rule in which `job` allows more than `base`."""
    if job.isolation != base.isolation and base.isolation != "auto":
        if job.isolation == "auto":
            return "isolation", (f"\"auto\" may pick a tier weaker than the batch's "
                                 f"{base.isolation!r}; name a tier")
        if base.isolation in CODE_ONLY:
            return "isolation", (f"{job.isolation!r} runs native code; the batch's "
                                 f"{base.isolation!r} runs only its own modules")
        if TIER_RANK.get(job.isolation, -1) < TIER_RANK.get(base.isolation, 0):
            return "isolation", (f"{job.isolation!r} isolates less than the batch's "
                                 f"{base.isolation!r}")
    if job.image != base.image:
        return "image", f"the batch runs on image {base.image!r}; a job may not change it"
    if job.install != base.install:
        return "install", "a job may not change the batch's [install]"
    for key in _LIMITS:
        mine, theirs = getattr(job.limits, key), getattr(base.limits, key)
        if mine > theirs:
            from .dump import format_value

            spec = SPEC_BY_PATH[f"limits.{key}"]
            return f"limits.{key}", (f"{format_value(spec, mine)} is above the batch's "
                                     f"{format_value(spec, theirs)}")
    why = _filesystem(base, job)
    if why:
        return why
    extra = sorted(set(job.env.pass_) - set(base.env.pass_))
    if extra:
        return "env.pass", f"{extra[0]} is not passed by the batch's policy"
    why = _network(base, job)
    if why:
        return why
    theirs = {s.name: s for s in base.secrets}
    for s in job.secrets:
        b = theirs.get(s.name)
        if b is None or b.source != s.source or b.value != s.value:
            return f"secrets.{s.name}", "the batch's policy grants no such secret"
        if not set(s.hosts) <= set(b.hosts) or s.ttl > b.ttl or s.plain_http > b.plain_http:
            return f"secrets.{s.name}", "wider than the batch's grant (hosts, ttl, plain_http)"
    if job.batch.reuse and not base.batch.reuse:
        return "batch.reuse", "the batch gives every job a fresh sandbox"
    return None


def _filesystem(base: Policy, job: Policy) -> tuple[str, str] | None:
    ws, bws = job.filesystem.workspace, base.filesystem.workspace
    if ws is not None:
        if bws is None or (ws.path, ws.mount_at) != (bws.path, bws.mount_at):
            return "filesystem.workspace", "the batch's policy mounts no such workspace"
        if _MODE_RANK[ws.mode] > _MODE_RANK[bws.mode]:
            return "filesystem.workspace.mode", (f"{ws.mode!r} writes more than the "
                                                 f"batch's {bws.mode!r}")
    extra = [p for p in job.filesystem.ro_binds if p not in base.filesystem.ro_binds]
    if extra:
        return "filesystem.ro_binds", f"{extra[0]!r} is not bound by the batch's policy"
    return None


def _network(base: Policy, job: Policy) -> tuple[str, str] | None:
    n, b = job.network, base.network
    if n.mode == "none":
        return None
    if b.mode == "none":
        return "network.mode", "the batch's policy has no network"
    for key in ("allow", "allow_private", "nameservers"):
        extra = [r for r in getattr(n, key) if r not in getattr(b, key)]
        if extra:
            return f"network.{key}", f"{extra[0]!r} is not in the batch's network.{key}"
    missing = [r for r in b.deny if r not in n.deny]
    if missing:
        return "network.deny", f"{missing[0]!r} of the batch's deny list is missing"
    if n.upstream_ca != b.upstream_ca:
        return "network.upstream_ca", "a job may not change the batch's upstream CA"
    for key in ("bytes_out", "bytes_in", "requests"):
        if getattr(n.budget, key) > getattr(b.budget, key):
            return f"network.budget.{key}", "above the batch's budget"
    return None


__all__ = ["CODE_ONLY", "TIER_RANK", "widening"]
