"""corral batch on this machine (no Ray): real namespace-tier sandboxes from a warm pool,
the output file, resume, reuse with scratch wiped, bad job lines, the audit store and the
nodes' receipts. Seconds each; the Ray cluster's tests are test_batch_ray.py (slow)."""

import glob
import json
import os
import subprocess

import pytest
from conftest import CORRAL, PY, tier_unavailable

import corral
from corral.errors import UsageError
from corral.scale import slotcg

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


def batch_cli(tmp_path, jobs, *args, policy=None, env=None, timeout=120):
    jf = tmp_path / "jobs.jsonl"
    if jobs is not None:
        jf.write_text("".join((j if isinstance(j, str) else json.dumps(j)) + "\n"
                              for j in jobs))
    cmd = [CORRAL, "batch", str(jf), "--out", str(tmp_path / "out.jsonl"), *args]
    if policy is not None:
        pf = tmp_path / "policy.toml"
        pf.write_text(policy)
        cmd += ["--policy", str(pf)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def out_lines(tmp_path):
    return [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]


def test_argv_code_stdin_and_files_jobs(tmp_path):
    p = batch_cli(tmp_path, [
        {"id": "argv", "argv": [PY, "-c", "pass"]},
        {"id": "code", "code": "import sys; print(sys.stdin.read().upper())",
         "stdin": "hello"},
        {"id": "files", "argv": ["cat", "sub/a.txt", "b"],
         "files": {"sub/a.txt": "one\n", "b": "two\n"}},
        {"id": 7, "argv": ["sh", "-c", "echo oops >&2; exit 3"]},
    ], "--concurrency", "2")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""          # not a terminal: no progress
    by = {x["id"]: x for x in out_lines(tmp_path)}
    assert set(by) == {"argv", "code", "files", 7}
    assert by["argv"]["verdict"] == "ok" and by["argv"]["isolation"] == "namespace"
    assert by["code"]["stdout"] == "HELLO\n"
    assert by["files"]["stdout"] == "one\ntwo\n"
    assert by[7]["verdict"] == "error" and by[7]["exit_code"] == 3
    assert by[7]["stderr"] == "oops\n"
    for x in by.values():
        assert x["node"] == os.uname().nodename and x["attempt"] == 1
        assert x["run_id"].startswith("r-") and x["ended"] >= x["started"]
        assert x["receipt"]["body"]["run_id"] == x["run_id"]
        assert x["receipt"]["body"]["verdict"] == x["verdict"]
        assert isinstance(x["events"], list) and "usage" in x


def test_resume_skips_recorded_jobs_and_runs_none_twice(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = f'[filesystem.workspace]\npath = "{ws}"\nmode = "rw"\n'
    job = lambda i: {"id": i, "argv": ["sh", "-c", f"mktemp /workspace/ran.{i}.XXXXXX"]}
    assert batch_cli(tmp_path, [job(i) for i in range(3)], policy=policy).returncode == 0
    first = out_lines(tmp_path)
    # the batch was killed mid-write: a torn line, and a job that was never run (its
    # line an error that is not the job's own fault) run again; the rest are skipped
    with open(tmp_path / "out.jsonl", "a") as f:
        f.write(json.dumps({"id": 3, "node": None, "attempt": 1, "error": {
            "kind": "unavailable", "field": "isolation", "message": "no node"}}) + "\n")
        f.write('{"id": 4, "node": "x", "verdict": "o')
    p = batch_cli(tmp_path, [job(i) for i in range(6)], policy=policy)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "out.jsonl").read_text().splitlines()
    assert text[4] == '{"id": 4, "node": "x", "verdict": "o'     # kept, and ended
    lines = [json.loads(x) for i, x in enumerate(text) if i != 4]
    assert lines[:3] == first
    assert sorted(x["id"] for x in lines[4:]) == [3, 4, 5]
    ran = {i: len(glob.glob(str(ws / f"ran.{i}.*"))) for i in range(6)}
    assert ran == {i: 1 for i in range(6)}
    # and once more: everything is recorded, nothing runs
    p = batch_cli(tmp_path, [job(i) for i in range(6)], policy=policy)
    assert p.returncode == 0 and len((tmp_path / "out.jsonl").read_text().splitlines()) == 8
    assert {i: len(glob.glob(str(ws / f"ran.{i}.*"))) for i in range(6)} == ran


SCRIBBLE = ("stat -c %d /scratch; find /scratch /tmp /dev/shm -mindepth 1 | sort | tr '\\n' ' '; echo; "
            "echo x > /scratch/s.$1; echo y > /tmp/t.$1; echo z > /dev/shm/m.$1; "
            "mkdir -p /scratch/d/e && echo w > /scratch/d/e/f; "
            "(sleep 613 >/dev/null 2>&1 &) ; for i in $(seq 100); do "
            "ps -e -o args= | grep -q '^sleep 613' && break; sleep 0.05; done; "
            "ps -e -o args= | grep -c '^sleep 613'")   # its own sleep, started, and no other


def scribble_jobs(n):
    return [{"id": i, "argv": ["sh", "-c", SCRIBBLE, "sh", str(i)]} for i in range(n)]


def test_big_jobs_with_big_output_both_ways_never_block_a_worker(tmp_path):
    """Each job carries 900 kB of stdin and prints it back: its frame to the worker and
    its line back are each several times a socket's buffer. A big job goes only to a
    worker with nothing in flight, so the driver never blocks writing to a worker that is
    itself blocked writing a big line back (which hung this batch)."""
    size = 900_000
    jobs = [{"id": i, "argv": ["cat"], "stdin": chr(ord("a") + i) * size} for i in range(6)]
    jobs[2:2] = [{"id": "small", "argv": ["echo", "hi"]}]
    p = batch_cli(tmp_path, jobs, "--concurrency", "2", timeout=60)
    assert p.returncode == 0, p.stderr
    by = {x["id"]: x for x in out_lines(tmp_path)}
    assert set(by) == {*range(6), "small"}
    assert by["small"]["stdout"] == "hi\n"
    for i in range(6):
        assert by[i]["verdict"] == "ok" and not by[i]["stdout_truncated"], by[i]["events"]
        assert by[i]["stdout"] == chr(ord("a") + i) * size, (i, len(by[i]["stdout"]))
        assert by[i]["attempt"] == 1


@pytest.mark.parametrize("reuse", [False, True])
def test_sandboxes_are_fresh_or_reused_with_scratch_wiped(tmp_path, reuse):
    policy = "[batch]\nreuse = true\n" if reuse else None
    p = batch_cli(tmp_path, scribble_jobs(3), "--concurrency", "1", policy=policy)
    assert p.returncode == 0, p.stderr
    lines = sorted(out_lines(tmp_path), key=lambda x: x["id"])
    assert all(x["verdict"] == "ok" for x in lines), lines
    devs, listings, sleeps = zip(*(x["stdout"].split("\n")[:3] for x in lines))
    # every job sees an empty scratch, and no process an earlier job left running
    assert listings == ("", "", ""), listings
    assert sleeps == ("1", "1", "1"), sleeps
    if reuse:     # one sandbox: its scratch is one tmpfs, emptied between the jobs
        assert len(set(devs)) == 1, devs
    else:         # a new sandbox each: a scratch tmpfs of its own (the next one is made
        # while a job runs, so two jobs in a row never share a device number)
        assert devs[0] != devs[1] != devs[2], devs


@pytest.mark.parametrize("line,where", [
    ('{"argv": ["true"]}', ":2: id: missing"),
    ('{"id": "b", "argv": ["true"], "code": "pass"}', ":2: argv: give exactly one"),
    ('{"id": "b", "argv": "true"}', ":2: argv: expected a non-empty list"),
    ('{"id": "b", "argv": ["true"], "files": {"../x": "y"}}', ":2: files['../x']: "),
    ('{"id": "b", "argv": ["true"], "stdin": 5}', ":2: stdin: expected text"),
    ('{"id": "b", "argv": ["true"], "colour": 1}', ":2: colour: unknown key"),
    ('{"id": "a", "argv": ["true"]}', ":2: id: id 'a' is also on line 1"),
    ('{"id": "b", ', ":2: not a JSON object"),
    ('[1]', ":2: a job is a JSON object"),
])
def test_a_bad_job_line_is_one_line_naming_line_and_field(tmp_path, line, where):
    p = batch_cli(tmp_path, ['{"id": "a", "argv": ["true"]}', line])
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and where in p.stderr, p.stderr
    assert p.stderr.startswith(f"corral: {tmp_path}/jobs.jsonl:2: ")
    assert not (tmp_path / "out.jsonl").exists() or not (tmp_path / "out.jsonl").read_text()


def test_bad_options_and_policy_are_refused_before_anything_runs(tmp_path):
    jobs = [{"id": 1, "argv": ["true"]}]
    p = batch_cli(tmp_path, jobs, "--concurrency", "0")
    assert p.returncode == 2 and "concurrency" in p.stderr
    p = batch_cli(tmp_path, jobs, policy="[limits]\nmemroy = 1\n")
    assert p.returncode == 2 and "limits.memroy: unknown key" in p.stderr
    p = subprocess.run([CORRAL, "batch", str(tmp_path / "jobs.jsonl")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--out" in p.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_widening_override_is_refused_for_that_job_only():
    jobs = [{"id": "wide", "argv": ["true"], "policy": {"limits": {"memory": "1G"}}},
            {"id": "net", "argv": ["true"], "policy": {"network": {
                "mode": "allow", "allow": ["example.com"]}}},
            {"id": "weaker", "argv": ["true"], "policy": {"isolation": "process"}},
            {"id": "narrow", "argv": ["sh", "-c", "ulimit -n"],
             "policy": {"limits": {"memory": "64M", "open_files": 64}}}]
    by = {x["id"]: x for x in corral.batch.map(jobs, {"limits": {"memory": "256M"}},
                                               concurrency=2)}
    assert by["narrow"]["verdict"] == "ok" and by["narrow"]["stdout"] == "64\n"
    assert by["wide"]["error"] == {
        "kind": "policy", "field": "policy.limits.memory",
        "message": "the job's policy widens the batch's: \"1G\" is above the batch's "
                   "\"256M\"; a job may only narrow it"}
    assert by["net"]["error"]["field"] == "policy.network.mode"
    assert by["weaker"]["error"]["field"] == "policy.isolation"
    assert "verdict" not in by["wide"]


def test_map_checks_jobs_first_and_streams_results():
    with pytest.raises(UsageError) as e:
        corral.batch.map([{"id": 1, "argv": ["true"]}, {"id": 1, "argv": ["true"]}])
    assert str(e.value) == "job 1: id: id 1 is also job 0's; ids must be unique"
    it = corral.batch.map(({"id": i, "code": f"print({i} * {i})"} for i in range(4)),
                          corral.Policy(), concurrency=2)
    got = {x["id"]: x["stdout"] for x in it}
    assert got == {i: f"{i * i}\n" for i in range(4)}


def test_results_land_in_this_machines_audit_store(tmp_path, monkeypatch):
    state = str(tmp_path / "state")
    env = {"CORRAL_STATE_DIR": state, "CORRAL_AUDIT": "1"}
    p = batch_cli(tmp_path, [{"id": i, "argv": ["sh", "-c", f"echo {i}"]} for i in range(3)]
                  + [{"id": "w", "argv": ["true"], "policy": {"limits": {"pids": 100000}}}],
                  env=env)
    assert p.returncode == 1, p.stderr       # one job refused
    assert "1 job(s) not run" in p.stderr
    lines = {x["id"]: x for x in out_lines(tmp_path)}
    monkeypatch.setenv("CORRAL_STATE_DIR", state)
    from corral.audit import query

    runs = {r["id"]: r for r in query.runs()}
    assert set(runs) == {lines[i]["run_id"] for i in range(3)}     # only what ran
    for i in range(3):
        r = runs[lines[i]["run_id"]]
        assert r["face"] == "batch" and r["argv"] == ["sh", "-c", f"echo {i}"]
        assert r["verdict"] == "ok" and r["tier"] == "namespace"
    # the node's receipt, stored as it signed it, verifies with the job's output
    rid = lines[0]["run_id"]
    _, _, receipt = query.get_run(rid)
    assert receipt == lines[0]["receipt"]
    rfile, out = tmp_path / "r.json", tmp_path / "stdout"
    rfile.write_text(json.dumps(lines[0]["receipt"]))
    out.write_text(lines[0]["stdout"])
    v = subprocess.run([CORRAL, "verify", str(rfile), "--stdout", str(out)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **env))
    assert v.returncode == 0, v.stderr


def test_a_node_without_advertised_resources_offers_what_its_host_runs():
    """What a Ray node offers when the cluster advertises no corral_* resource."""
    from corral.scale.node import host_tiers

    tiers = host_tiers()
    assert "namespace" in tiers
    assert "microvm" not in tiers      # refuses the default image: never offered
    for t in ("gvisor", "process", "wasm"):
        assert (t in tiers) == (tier_unavailable(t) is None), t


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def children(pid=None):
    kids = set()
    pid = pid or os.getpid()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids |= {int(x) for x in f.read().split()}
    except OSError:
        pass         # it ended
    return kids


PREPARED = """
import json, sys
from corral.scale.node import NodeRunner
base = json.loads(sys.argv[1])
r = NodeRunner("n", slots=1)
r.prepare(base)
before = set(sys.modules)
lines = [r.run({"id": i, "argv": ["sh", "-c", "echo hi > f; cat f"]}, base, 1)
         for i in range(2)]
lines.append(r.run({"id": 2, "argv": ["cat", "a"], "files": {"a": "x"}}, base, 1))
r.close()
print(json.dumps({"new": sorted(set(sys.modules) - before),
                  "out": [x.get("stdout") for x in lines],
                  "signed": [x.get("receipt") is not None for x in lines]}))
"""


@pytest.mark.parametrize("base", [{}, {"batch": {"reuse": True}}])
def test_a_prepared_runner_imports_nothing_for_its_jobs(tmp_path, base):
    """What a local worker inherits from the driver (NodeRunner.prepare, before the fork)
    covers every module a job's run, files, scratch wipe and receipt use: a worker imports
    nothing of its own (importlib.metadata for the receipt's version cost each worker
    ~30 ms of CPU, a batch of 150 jobs ~0.4 ms a job). A fresh interpreter each."""
    import sys

    p = subprocess.run([sys.executable, "-c", PREPARED, json.dumps(base)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, CORRAL_STATE_DIR=str(tmp_path)))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["out"] == ["hi\n", "hi\n", "x"] and all(got["signed"]), got
    assert got["new"] == [], got["new"]


def test_a_worker_killed_mid_batch_hangs_nothing_and_loses_no_job(tmp_path):
    """The local runner's workers are forked processes: one SIGKILLed (the OOM killer)
    fails no job for good: those in flight run again, every job has one line."""
    import signal

    # the workers are forks of this process (its own command line), made by map(); other
    # children of it (an earlier test's zygotes or helpers) are left alone
    before, mine = children(), cmdline(os.getpid())
    jobs = [{"id": i, "argv": ["sleep", "0.3"]} for i in range(8)]
    lines = []
    for line in corral.batch.map(jobs, None, concurrency=2):
        lines.append(line)
        if len(lines) == 1:
            workers = sorted(p for p in children() - before if cmdline(p) == mine)
            assert workers, "no forked batch worker found among this process's children"
            os.kill(workers[0], signal.SIGKILL)
    assert sorted(x["id"] for x in lines) == list(range(8))
    assert all(x.get("verdict") == "ok" for x in lines), lines
    assert any(x["attempt"] == 2 for x in lines)
    home = slotcg._own_cpu_dir()
    if home is not None:   # the killed worker's slot cgroup is swept, the others removed
        left = {p: slotcg._procs(f"{home}/{slotcg.PREFIX}{p}") for p in workers
                if os.path.exists(f"{home}/{slotcg.PREFIX}{p}")}
        assert not left, {p: [(q, cmdline(q)) for q in qs] for p, qs in left.items()}


def test_only_the_dead_workers_started_job_runs_again_and_none_that_finished(tmp_path):
    """Each job leaves a mark in a workspace. One of two workers is killed once the first
    line is in: the one job it had started runs again (attempt 2, in its line), the job
    queued behind it runs once as attempt 1, the other worker's jobs are untouched, and
    no job whose line came back runs again (the old pool re-ran every job in flight on
    every worker)."""
    import signal

    ws = tmp_path / "ws"
    ws.mkdir()
    policy = {"filesystem": {"workspace": {"path": str(ws), "mode": "rw"}}}
    jobs = [{"id": i, "argv": ["sh", "-c", f"mktemp /workspace/ran.{i}.XXXXXX; sleep 0.3"]}
            for i in range(8)]
    before, mine = children(), cmdline(os.getpid())
    lines = []
    for line in corral.batch.map(jobs, policy, concurrency=2):
        lines.append(line)
        if len(lines) == 1:
            workers = sorted(p for p in children() - before if cmdline(p) == mine)
            assert len(workers) == 2, workers
            os.kill(workers[0], signal.SIGKILL)
    assert sorted(x["id"] for x in lines) == list(range(8))
    assert all(x.get("verdict") == "ok" for x in lines), lines
    again = [x["id"] for x in lines if x["attempt"] != 1]
    assert len(again) == 1 and lines[[x["id"] for x in lines].index(again[0])][
        "attempt"] == 2, [(x["id"], x["attempt"]) for x in lines]
    marks = {i: len(glob.glob(str(ws / f"ran.{i}.*"))) for i in range(8)}
    assert {i: n for i, n in marks.items() if i != again[0]} == {
        i: 1 for i in range(8) if i != again[0]}, marks
    assert marks[again[0]] in (1, 2), marks     # killed before or after its mark


def test_a_job_whose_worker_dies_twice_gets_an_error_line_and_the_rest_run():
    """The worker running `sleep 30` is killed, and the next one running it again too:
    its line says why (attempt 2, not run again); the job queued behind it was never
    started by the first worker, so it runs once, as attempt 1. Nothing hangs."""
    import signal
    import threading
    import time

    before, mine = children(), cmdline(os.getpid())
    killed: list[int] = []

    def killer():
        end = time.monotonic() + 60
        while len(killed) < 2 and time.monotonic() < end:
            for w in children() - before - set(killed):
                if cmdline(w) != mine:
                    continue
                if any(b"\0sleep\x0030" in (cmdline(k) or b"") for k in children(w)):
                    os.kill(w, signal.SIGKILL)
                    killed.append(w)
            time.sleep(0.01)

    t = threading.Thread(target=killer)
    t.start()
    try:
        lines = list(corral.batch.map([{"id": "slow", "argv": ["sleep", "30"]},
                                       {"id": "next", "argv": ["echo", "ok"]}], None,
                                      concurrency=1))
    finally:
        t.join(70)
    assert len(killed) == 2, killed
    by = {x["id"]: x for x in lines}
    assert len(lines) == 2 and set(by) == {"slow", "next"}
    assert by["next"]["verdict"] == "ok" and by["next"]["attempt"] == 1
    assert by["slow"]["attempt"] == 2 and "verdict" not in by["slow"]
    assert by["slow"]["error"]["field"] == "job"
    assert "died twice" in by["slow"]["error"]["message"]


def slot_runs(home):
    """{slot cgroup: [run cgroups in it with a process]} below the cpu cgroup `home`."""
    found = {}
    for slot in glob.glob(f"{home}/{slotcg.PREFIX}*"):
        for run in glob.glob(f"{slot}/corral/*/cgroup.procs"):
            try:
                with open(run) as f:
                    if f.read().split():
                        found.setdefault(slot, []).append(os.path.dirname(run))
            except OSError:
                pass
    return found


@pytest.mark.skipif(os.geteuid() != 0 or slotcg._own_cpu_dir() is None,
                    reason="slot cpu cgroups: cgroup v1 and root only")
def test_each_local_slot_weighs_as_one_process_and_leaves_no_cgroup():
    """Every worker moves into a cpu cgroup of its own, below which its sandboxes' run
    cgroups are made (their own limits unchanged): the batch's slots weigh as P processes
    with the scheduler, not all sandboxes of the host as one. Nothing is left after."""
    import threading
    import time

    home = slotcg._own_cpu_dir()
    before = set(glob.glob(f"{home}/{slotcg.PREFIX}*"))
    jobs = [{"id": i, "argv": ["sleep", "1.5"]} for i in range(2)]
    lines, seen = [], {}
    t = threading.Thread(target=lambda: lines.extend(
        corral.batch.map(jobs, {"limits": {"cpus": 0.5}}, concurrency=2)))
    t.start()
    while t.is_alive() and len(seen) < 2:
        for slot, runs in slot_runs(home).items():
            if slot not in before:
                try:        # the policy's cpus, on the run's own cgroup as before
                    with open(f"{runs[0]}/cpu.cfs_quota_us") as f:
                        seen[slot] = (len(runs), int(f.read()))
                except OSError:
                    pass    # it ended in between
        time.sleep(0.02)
    t.join(60)
    assert sorted(x["id"] for x in lines) == [0, 1]
    assert all(x.get("verdict") == "ok" for x in lines), lines
    assert len(seen) == 2, seen       # two slots, each its own cgroup with a running job
    assert set(seen.values()) == {(1, 50_000)}, seen
    assert set(glob.glob(f"{home}/{slotcg.PREFIX}*")) <= before


@pytest.mark.skipif(os.geteuid() != 0 or slotcg._own_cpu_dir() is None,
                    reason="slot cpu cgroups: cgroup v1 and root only")
def test_the_slot_cgroup_of_a_dead_worker_is_swept():
    p = subprocess.Popen(["true"])
    p.wait()                          # a pid nobody has now
    d = f"{slotcg._own_cpu_dir()}/{slotcg.PREFIX}{p.pid}"
    os.makedirs(f"{d}/corral")
    slotcg.sweep()
    assert not os.path.exists(d)


@pytest.mark.skipif(os.geteuid() != 0 or slotcg._own_cpu_dir() is None,
                    reason="slot cpu cgroups: cgroup v1 and root only")
def test_what_still_runs_in_a_dead_workers_slot_is_killed_and_the_slot_removed():
    """A killed worker's helpers (in its slot) and sandbox processes (in a run cgroup below,
    here one no run directory records) may outlive it for a moment: the sweep kills them
    and removes the slot, instead of leaving it because it was busy."""
    p = subprocess.Popen(["true"])
    p.wait()                          # a pid nobody has now: the dead worker's
    d = f"{slotcg._own_cpu_dir()}/{slotcg.PREFIX}{p.pid}"
    os.makedirs(f"{d}/corral/run")
    helper, inner = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        for proc, cg in ((helper, d), (inner, f"{d}/corral/run")):
            with open(f"{cg}/cgroup.procs", "w") as f:
                f.write(str(proc.pid))
        slotcg.sweep()
        assert not os.path.exists(d)
        assert helper.wait(10) == -9 and inner.wait(10) == -9
    finally:
        for proc in (helper, inner):
            proc.kill()
            proc.wait()
        for x in (f"{d}/corral/run", f"{d}/corral", d):
            if os.path.exists(x):
                os.rmdir(x)


def test_an_unreachable_ray_address_is_one_line_at_once(tmp_path):
    p = batch_cli(tmp_path, [{"id": 1, "argv": ["true"]}], "--ray", "127.0.0.1:1")
    assert p.returncode == 3, p.stderr
    assert p.stderr == ("corral: --ray: cannot reach the Ray cluster at '127.0.0.1:1': "
                        "Connection refused; start one with ray start --head "
                        "(docs/scale.md)\n")
    assert (tmp_path / "out.jsonl").read_text() == ""     # nothing ran, nothing written


def test_ray_dispatch_keeps_the_queue_in_order_when_nodes_are_full():
    """The Ray driver's dispatch: jobs it passes over (every node of their tier full) stay
    at the front in their order; a freed slot takes the first; a node gets up to a next
    call queued per slot, each call CHUNK_MAX jobs while the queue is long and fewer as it
    runs short. No cluster: the nodes' actors are stand-ins that record the calls."""
    pytest.importorskip("ray")
    from corral.scale import ray as cray
    from corral.scale.jobs import check_jobs

    calls = []

    class Actor:
        class run:   # noqa: N801 - stand-ins for the actor's methods
            @staticmethod
            def remote(wire, base, attempt):
                calls.append([wire["id"]])
                return object()

        class run_many:   # noqa: N801
            @staticmethod
            def remote(tasks, base):
                calls.append([w["id"] for w, _ in tasks])
                return object()

    k = cray.CHUNK_MAX
    jobs = check_jobs([{"id": i, "argv": ["true"]} for i in range(1000)])
    d = cray._Dispatch(jobs, {}, 1)
    d.nodes["n"] = cray._Node("n", Actor, {"namespace"}, 1)
    assert list(d.dispatch()) == []
    assert calls == [list(range(k)), list(range(k, 2 * k))]   # running, and queued
    assert [j.id for j, _, _ in d.queue] == list(range(2 * k, 1000))
    assert list(d.dispatch()) == [] and len(calls) == 2       # full: nothing moves
    assert [j.id for j, _, _ in d.queue] == list(range(2 * k, 1000))
    d.nodes["n"].busy -= 1
    list(d.dispatch())
    assert calls[2] == list(range(2 * k, 3 * k)) and d.queue[0][0].id == 3 * k
    # the tail: one job a call once fewer are left than the calls the nodes could take
    while d.queue:
        d.nodes["n"].busy = 0
        list(d.dispatch())
    assert [len(c) for c in calls[-3:]] == [1, 1, 1]
    assert sorted(i for c in calls for i in c) == list(range(1000))
