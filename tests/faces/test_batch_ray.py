"""corral batch on a real local Ray cluster (ray.cluster_utils.Cluster): a head that runs
no jobs and two nodes advertising corral_namespace and corral_process, each with one CPU.

Slow (a cluster takes ~20 s to start on 2 cores, a lost node ~3 s to notice with the
pinned health checks below): marked `slow` and `ray`; scripts/test.sh runs the slow group.
The node-loss test runs last: it removes a node from the shared cluster.
"""

import glob
import os
import shutil
import tempfile
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

ray = pytest.importorskip("ray")

TIERS = {"corral_namespace": 100, "corral_process": 100}
#: a lost node is declared dead after 3 missed health checks a second apart (Ray's
#: default is ~30 s); pinned so the node-loss test waits seconds, not minutes
SYSTEM_CONFIG = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                 "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")   # a short path: Ray's socket names
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "CORRAL_STATE_DIR")}
    os.environ["RAY_TMPDIR"] = tmp
    os.environ["CORRAL_STATE_DIR"] = os.path.join(tmp, "state")  # the nodes' receipt keys
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "_system_config": SYSTEM_CONFIG})
    try:
        nodes = [c.add_node(num_cpus=1, resources=TIERS) for _ in range(2)]
        c.wait_for_nodes(timeout=120)
        yield c, nodes
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


def worker_ids(c) -> set[str]:
    import ray

    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    try:
        return {n["NodeID"] for n in ray.nodes()
                if n["Alive"] and n["Resources"].get("corral_namespace")}
    finally:
        ray.shutdown()


def batch(c, jobs, policy=None, concurrency=2):
    import corral.batch

    return list(corral.batch.map(jobs, policy, ray_address=c.address,
                                 concurrency=concurrency))


def test_jobs_spread_over_both_nodes(cluster, monkeypatch):
    c, _ = cluster
    monkeypatch.setenv("CORRAL_AUDIT", "1")    # the driver's records (conftest turns it off)
    workers = worker_ids(c)
    assert len(workers) == 2
    jobs = [{"id": i, "argv": ["sh", "-c", f"sleep 0.3; echo {i}"]} for i in range(8)]
    lines = batch(c, jobs)
    assert sorted(x["id"] for x in lines) == list(range(8))
    assert all(x["verdict"] == "ok" and x["stdout"] == f"{x['id']}\n" for x in lines), lines
    assert {x["node"] for x in lines} == workers      # both, and never the head
    for x in lines:       # each node signed its own receipt of what it ran
        assert x["receipt"] is not None, x["events"]
        assert x["receipt"]["body"]["run_id"] == x["run_id"]
        assert x["receipt"]["body"]["argv"] == jobs[x["id"]]["argv"]
    # and the driver's machine keeps every run, with the node's receipt, in its audit
    # store (CORRAL_STATE_DIR, set by the fixture)
    from corral.audit import query, record

    assert record.flush(30)
    for x in lines:
        got = query.get_run(x["run_id"])
        assert got is not None, x["run_id"]
        run, _, receipt = got
        assert run["face"] == "batch" and run["verdict"] == "ok", run
        assert receipt == x["receipt"]


def test_a_tier_no_node_has_is_reported_not_hung(cluster):
    c, _ = cluster
    t0 = time.monotonic()
    lines = batch(c, [{"id": "g", "argv": ["true"], "policy": {"isolation": "gvisor"}},
                      {"id": "n", "argv": ["true"]}])
    by = {x["id"]: x for x in lines}
    assert by["n"]["verdict"] == "ok"
    err = by["g"]["error"]
    assert err["kind"] == "unavailable" and err["field"] == "isolation"
    assert "corral_gvisor" in err["message"] and "verdict" not in by["g"]
    assert time.monotonic() - t0 < 60


def test_a_policy_violation_is_refused_on_the_node(cluster, tmp_path):
    c, _ = cluster
    workers = worker_ids(c)
    # a job's override wider than the batch's policy
    lines = batch(c, [{"id": "wide", "argv": ["true"],
                       "policy": {"limits": {"memory": "4G"}}},
                      {"id": "narrow", "argv": ["true"],
                       "policy": {"limits": {"memory": "64M"}}}],
                  {"limits": {"memory": "256M"}})
    by = {x["id"]: x for x in lines}
    assert by["narrow"]["verdict"] == "ok"
    assert by["wide"]["error"]["kind"] == "policy"
    assert by["wide"]["error"]["field"] == "policy.limits.memory"
    assert by["wide"]["node"] in workers               # refused there, not by the driver
    # a rule the node's tier cannot enforce: the process tier, as root, cannot give a
    # writable workspace to the command's dedicated uid (it refuses; never runs weaker)
    ws = tmp_path / "ws"
    ws.mkdir()
    lines = batch(c, [{"id": "p", "argv": ["sh", "-c", "touch /proc/self/x; echo ran"]}],
                  {"isolation": "process",
                   "filesystem": {"workspace": {"path": str(ws), "mode": "rw"}}})
    (line,) = lines
    assert line["error"]["kind"] == "unsupported", line
    assert line["error"]["field"] == "filesystem.workspace"
    assert "process tier" in line["error"]["message"] and line["node"] in workers
    assert list(ws.iterdir()) == []


def test_a_node_killed_mid_batch_loses_no_job_and_runs_none_twice(cluster, tmp_path):
    import corral.batch

    c, nodes = cluster
    workers = worker_ids(c)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o777)
    n = 16
    jobs = [{"id": i, "argv": ["sh", "-c", f"mktemp /workspace/ran.{i}.XXXXXX && sleep 1"]}
            for i in range(n)]
    policy = {"filesystem": {"workspace": {"path": str(ws), "mode": "rw"}}}
    lines, killed = [], None
    for line in corral.batch.map(jobs, policy, ray_address=c.address, concurrency=2):
        lines.append(line)
        if killed is None and len(lines) == 3:
            # remove the node that ran the third job: it has jobs in flight right now
            victim = next(x for x in nodes if x.node_id == line["node"])
            c.remove_node(victim, allow_graceful=False)
            killed = line["node"]
    assert killed in workers
    ids = [x["id"] for x in lines]
    assert sorted(ids) == list(range(n)), "a job was lost or written twice"
    assert all(x.get("verdict") == "ok" for x in lines), [x for x in lines if "error" in x]
    ran = {i: len(glob.glob(str(ws / f"ran.{i}.*"))) for i in range(n)}
    retried = [x for x in lines if x["attempt"] > 1]
    assert retried, "no job was in flight on the killed node"
    for x in lines:
        # every run of a job left a mark: never more runs than the attempts the driver
        # made, and a job that finished on its first attempt ran exactly once
        assert 1 <= ran[x["id"]] <= x["attempt"], (x["id"], ran[x["id"]], x["attempt"])
        if x["attempt"] > 1:
            assert x["node"] != killed
    assert {x["node"] for x in lines} == workers
