"""Batch runs from Python: many jobs in sandboxes of one policy, here or on a Ray cluster.

    import corral.batch
    jobs = [{"id": i, "code": f"print({i} * {i})"} for i in range(100)]
    for r in corral.batch.map(jobs, {"limits": {"timeout": "5s"}}, concurrency=4):
        print(r["id"], r["node"], r.get("verdict"), r.get("stdout") or r.get("error"))

Each job is {id, argv | code, stdin?, files?, policy?} (scale/jobs.py); each result is a
dict of the Result's JSON fields plus `id`, `node`, `attempt`, `run_id` and the node's
signed `receipt`, or `id`, `node` and `error` for a job that was refused. Results come as
jobs finish, not in the jobs' order. docs/scale.md.
"""

from __future__ import annotations


def map(jobs, policy=None, *, ray_address: str | None = None,
        concurrency: int | None = None):
    """An iterator of result dicts as the jobs finish. `policy`: a dict (the TOML layout),
    a TOML file path, a corral.Policy or None. `ray_address`: a Ray cluster's address
    ("auto" for the one this machine belongs to); None runs here. `concurrency`: jobs at
    once here, or on each node of the cluster. A malformed job or policy raises
    (UsageError, PolicyError) before anything runs."""
    from .scale.driver import check_concurrency, run_batch
    from .scale.jobs import base_policy, check_jobs

    check_concurrency(concurrency)
    base = base_policy(policy)
    checked = check_jobs(jobs)
    return run_batch(checked, base, ray_address=ray_address, concurrency=concurrency)


__all__ = ["map"]
