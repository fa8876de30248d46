"""The audit store and signed receipts (docs/audit.md), with real SQLite and real
namespace-tier sandboxes: records from the CLI, the Python API, live sandboxes, the
service and the probe; a locked database never fails a run; queries, gc, receipts."""

import base64
import json
import os
import sqlite3
import subprocess
import time

import pytest
from conftest import CORRAL, tier_unavailable

import corral
from corral.audit import query, record

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

DENY_POLICY = {"network": {"mode": "allow", "allow": ["allowed.test"],
                           "nameservers": ["127.0.0.1:9"]}}


@pytest.fixture
def state(tmp_path, monkeypatch):
    d = str(tmp_path / "state")
    monkeypatch.setenv("CORRAL_STATE_DIR", d)
    monkeypatch.setenv("CORRAL_AUDIT", "1")      # the suite's conftest turns it off
    monkeypatch.delenv("CORRAL_AUDIT_FACE", raising=False)
    return d


def db(state):
    return os.path.join(state, "audit", "audit.db")


def cli(state, *args, stdin=None, env=None):
    e = dict(os.environ, CORRAL_STATE_DIR=state)
    e.pop("CORRAL_AUDIT_FACE", None)
    e.update(env or {})
    return subprocess.run([CORRAL, *args], capture_output=True, env=e, input=stdin,
                          timeout=120)


def test_api_run_is_recorded_with_its_events(state):
    r = corral.run(["/bin/sh", "-c", "curl -sS -m 5 http://denied.test/; exit 3"],
                   DENY_POLICY)
    assert r.verdict == "error"
    assert record.flush(5)
    assert not [e for e in r.events if e["kind"] == "audit"], r.events
    (run,) = query.runs()
    assert run["argv"][-1].endswith("exit 3") and run["verdict"] == "error"
    assert run["exit_code"] == 3 and run["tier"] == "namespace" and run["face"] == "api"
    assert run["actor"].startswith("user:") and run["policy_digest"].startswith("sha256:")
    assert run["usage"]["wall_s"] > 0
    events = query.events(run["id"])
    assert [(e["kind"], e["host"], e["decision"]) for e in events if e["kind"] == "net"] \
        == [("net", "denied.test", "deny")]
    st = os.stat(os.path.dirname(db(state)))
    assert st.st_mode & 0o777 == 0o700 and os.stat(db(state)).st_mode & 0o777 == 0o600
    conn = sqlite3.connect(db(state))
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


def test_a_locked_database_does_not_fail_the_run_and_the_result_says_so(state):
    corral.run(["/bin/true"])            # the database exists
    assert record.flush(5)
    holder = sqlite3.connect(db(state), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")    # another process holding the write lock
    try:
        r = corral.run(["/bin/sh", "-c", "echo still ran"])
        assert r.verdict == "ok" and r.stdout == "still ran\n"
        assert record.flush(5)
        lost = [e for e in r.events if e["kind"] == "audit"]
        assert len(lost) == 1 and "lost" in lost[0]["message"], r.events
        assert "locked" in lost[0]["message"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    r2 = corral.run(["/bin/echo", "after"])
    assert record.flush(5)
    assert not [e for e in r2.events if e["kind"] == "audit"]
    assert [x["argv"] for x in query.runs()] == [["/bin/echo", "after"], ["/bin/true"]]


def test_the_switch_turns_recording_off(state, monkeypatch):
    monkeypatch.setenv("CORRAL_AUDIT", "0")
    corral.run(["/bin/true"])
    assert record.flush(5)
    assert not os.path.exists(db(state))


def test_live_sandbox_and_its_commands_are_recorded(state):
    sb = corral.Sandbox.create(timeout=60)
    try:
        sb.commands.run("echo one")
        sb.commands.run(["/bin/sh", "-c", "exit 4"])
    finally:
        sb.kill()
    assert record.flush(5)
    runs = query.runs()
    assert [(r["kind"], r["sandbox"], r["verdict"]) for r in runs] == [
        ("command", sb.id, "error"), ("command", sb.id, "ok")]
    conn = sqlite3.connect(db(state))
    (row,) = conn.execute("SELECT id, ended_by, tier FROM sandboxes").fetchall()
    conn.close()
    assert row == (sb.id, "killed", "namespace")
    assert [e["kind"] for e in query.events(sb.id)] == ["teardown"]


def test_cli_runs_logs_denials_and_filters(state):
    assert cli(state, "run", "--", "/bin/sh", "-c", "exit 2").returncode == 2
    p = cli(state, "run", "--net", "allow", "--allow-domain", "allowed.test", "--nameserver",
            "127.0.0.1:9", "--", "/bin/sh", "-c",
            "curl -sS -m 5 http://denied.test/ >/dev/null; curl -sS -m 5 "
            "http://denied.test/ >/dev/null; true")
    assert p.returncode == 0, p.stderr
    out = cli(state, "runs", "--json")
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [x["verdict"] for x in lines] == ["ok", "error"]        # newest first
    assert all({"id", "argv", "verdict", "tier", "started"} <= set(x) for x in lines)
    assert {x["face"] for x in lines} == {"cli"}
    only = [json.loads(x) for x in cli(state, "runs", "--json", "--verdict",
                                       "error").stdout.splitlines()]
    assert [x["argv"] for x in only] == [["/bin/sh", "-c", "exit 2"]]
    assert cli(state, "runs", "--json", "--tier", "gvisor").stdout == b""
    assert len(cli(state, "runs", "--json", "--since", "1h").stdout.splitlines()) == 2
    logs = cli(state, "logs", lines[0]["id"], "--json")
    nets = [json.loads(x) for x in logs.stdout.splitlines()]
    assert [(e["kind"], e["host"]) for e in nets if e["kind"] == "net"] == [
        ("net", "denied.test")] * 2
    human = cli(state, "logs", lines[0]["id"]).stdout.decode()
    assert "net: host=denied.test" in human
    d = [json.loads(x) for x in cli(state, "denials", "--json", "--kind",
                                    "net").stdout.splitlines()]
    assert d == [{"kind": "net", "what": "denied.test:80", "count": 2, "runs": 1,
                  "reason": d[0]["reason"], "rule": 'network.allow += "denied.test"',
                  "last": d[0]["last"]}]
    assert "allow with: network.allow += \"denied.test\"" in cli(
        state, "denials").stdout.decode()
    bad = cli(state, "runs", "--since", "yesterday")
    assert bad.returncode == 2 and b"--since" in bad.stderr
    assert cli(state, "logs", "r-nope").returncode == 2
    exported = [json.loads(x) for x in cli(state, "audit", "export").stdout.splitlines()]
    assert [x["verdict"] for x in exported] == ["error", "ok"]      # oldest first
    assert exported[1]["policy"].startswith("isolation") and exported[1]["events"]


def test_gc_removes_old_rows_only(state):
    corral.run(["/bin/echo", "old"], DENY_POLICY)
    corral.run(["/bin/echo", "new"])
    assert record.flush(5)
    conn = sqlite3.connect(db(state), isolation_level=None)
    conn.execute("UPDATE runs SET started = started - 40 * 86400 WHERE argv LIKE '%old%'")
    conn.close()
    p = cli(state, "gc", "--older-than", "30d")
    assert p.returncode == 0 and b"removed 1 run(s)" in p.stdout, p.stdout
    assert [r["argv"] for r in query.runs()] == [["/bin/echo", "new"]]
    conn = sqlite3.connect(db(state))
    assert conn.execute("SELECT COUNT(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM runs "
                        "r WHERE r.id = e.run_id)").fetchone() == (0,)
    conn.close()
    assert cli(state, "gc").returncode == 2


def test_probe_runs_are_recorded_as_the_probe(state):
    """The probe drives `corral run` in subprocesses, recorded with the face "probe"."""
    p = cli(state, "probe", "--isolation", "namespace", "--case", "res.file-size", "--json")
    assert p.returncode == 0, p.stderr
    runs = query.runs()
    assert runs and {r["face"] for r in runs} == {"probe"}
    assert all(r["tier"] == "namespace" for r in runs)


# -- receipts ------------------------------------------------------------------------------

def _load(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def receipt(state, tmp_path):
    rfile, out, err, inp = (str(tmp_path / n) for n in ("r.json", "out", "err", "in"))
    with open(inp, "wb") as f:
        f.write(b"input bytes\n")
    p = cli(state, "run", "--stdin", "--receipt", rfile, "--", "/bin/sh", "-c",
            "cat; echo out; echo err >&2", stdin=b"input bytes\n")
    assert p.returncode == 0, p.stderr
    with open(out, "wb") as f:
        f.write(p.stdout)
    with open(err, "wb") as f:
        f.write(p.stderr)
    return rfile, out, err, inp


def test_a_receipt_verifies_with_its_outputs(state, receipt):
    rfile, out, err, inp = receipt
    p = cli(state, "verify", rfile, "--stdout", out, "--stderr", err, "--stdin", inp)
    assert p.returncode == 0 and b"OK" in p.stdout, p.stderr
    key = cli(state, "key", "show").stdout.decode().strip()
    assert key.startswith("ed25519:") and len(base64.b64decode(key[8:])) == 32
    body = _load(rfile)["body"]
    assert body["argv"] == ["/bin/sh", "-c", "cat; echo out; echo err >&2"]
    assert body["verdict"] == "ok" and body["run_id"].startswith("r-")
    assert body["stdout_sha256"].startswith("sha256:") and body["policy_sha256"]
    st = os.stat(os.path.join(state, "audit", "receipt.key"))
    assert st.st_mode & 0o777 == 0o600
    # a third party: another state directory, the key given
    other = os.path.join(os.path.dirname(state), "other")
    p = cli(other, "verify", rfile, "--key", key, "--stdout", out)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("field,value", [
    ("verdict", "error"), ("exit_code", 1), ("argv", ["/bin/true"]),
    ("stdout_sha256", "sha256:" + "0" * 64), ("policy_sha256", "sha256:" + "1" * 64),
    ("image", "sha256:" + "2" * 64), ("egress_sha256", "sha256:" + "3" * 64),
    ("usage", {"wall_s": 0.0}), ("host", "elsewhere"), ("stdin_sha256", "x")])
def test_each_tampered_field_fails_with_the_signature_code(state, receipt, field, value):
    rfile = receipt[0]
    r = _load(rfile)
    assert r["body"][field] != value
    r["body"][field] = value
    with open(rfile, "w") as f:
        json.dump(r, f)
    p = cli(state, "verify", rfile)
    assert p.returncode == 11, p.stderr
    assert p.stderr.count(b"\n") == 1 and b"altered" in p.stderr


def test_a_tampered_signature_a_wrong_key_a_mismatch_and_junk_each_have_their_code(
        state, receipt, tmp_path):
    rfile, out, err, inp = receipt
    r = _load(rfile)
    sig = bytearray(base64.b64decode(r["signature"]))
    sig[0] ^= 1
    bad = tmp_path / "sig.json"
    bad.write_text(json.dumps({**r, "signature": base64.b64encode(bytes(sig)).decode()}))
    assert cli(state, "verify", str(bad)).returncode == 11
    other = os.path.join(os.path.dirname(state), "other")
    other_key = cli(other, "key", "show").stdout.decode().strip()
    p = cli(state, "verify", rfile, "--key", other_key)
    assert p.returncode == 12 and b"another key" not in p.stderr and b"signed by" in p.stderr
    swapped = tmp_path / "swapped.json"        # the body re-signed claims the other key
    swapped.write_text(json.dumps({**r, "key": other_key}))
    assert cli(state, "verify", str(swapped)).returncode == 12
    p = cli(state, "verify", rfile, "--stdout", err)
    assert p.returncode == 13 and b"--stdout" in p.stderr
    assert cli(state, "verify", rfile, "--stdin", out).returncode == 13
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    assert cli(state, "verify", str(junk)).returncode == 10
    assert cli(state, "verify", str(tmp_path / "missing")).returncode == 2


# -- the service ---------------------------------------------------------------------------

def _wait_runs(http, n=1):
    for _ in range(200):
        runs = http.get("/runs").json()["runs"]
        if len(runs) >= n:
            return runs
        time.sleep(0.05)
    return runs


def test_service_runs_are_recorded_per_token_with_a_stored_receipt(tmp_path, monkeypatch):
    from servefix import Server

    monkeypatch.setenv("CORRAL_AUDIT", "1")

    s = Server(tmp_path, tokens=["a", "b"]).start()
    try:
        a, b = s.http(s.tokens["a"]), s.http(s.tokens["b"])
        sid = a.post("/sandboxes", json={"policy": {}}).json()["id"]
        r = a.post(f"/sandboxes/{sid}/exec", json={"argv": ["/bin/sh", "-c", "cat; echo svc"],
                                                   "stdin": "in\n"})
        assert r.status_code == 200 and r.json()["stdout"] == "in\nsvc\n", r.text
        (run,) = _wait_runs(a)
        assert run["actor"] == "token:a" and run["face"] == "service"
        assert run["kind"] == "command" and run["sandbox"] == sid and run["receipt"] is True
        assert b.get("/runs").json() == {"runs": []}             # only its own
        assert b.get(f"/runs/{run['id']}/events").status_code == 404
        assert b.get(f"/runs/{run['id']}/receipt").status_code == 404
        assert a.get(f"/runs/{run['id']}/events").status_code == 200
        assert a.get(f"/runs/{run['id']}").json()["policy"].startswith("isolation")
        assert a.get("/runs", params={"verdict": "error"}).json() == {"runs": []}
        assert a.get("/runs", params={"since": "soon"}).status_code == 400
        assert a.get("/denials").json() == {"denials": []}
        rec = a.get(f"/runs/{run['id']}/receipt")
        assert rec.status_code == 200
        rfile, out, inp = tmp_path / "r.json", tmp_path / "out", tmp_path / "in"
        rfile.write_text(rec.text)
        out.write_bytes(b"in\nsvc\n")
        inp.write_bytes(b"in\n")
        p = cli(s.state, "verify", str(rfile), "--stdout", str(out), "--stdin", str(inp))
        assert p.returncode == 0, p.stderr
        out.write_bytes(b"other\n")
        assert cli(s.state, "verify", str(rfile), "--stdout", str(out)).returncode == 13
    finally:
        s.stop()


def test_an_unusable_state_directory_does_not_fail_the_run(tmp_path, monkeypatch):
    """A link planted where the audit directory goes is refused, never followed: the run
    goes on and says its record was lost."""
    state = tmp_path / "state"
    state.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, state / "audit")
    monkeypatch.setenv("CORRAL_STATE_DIR", str(state))
    monkeypatch.setenv("CORRAL_AUDIT", "1")
    r = corral.run(["/bin/echo", "ran"])
    assert r.verdict == "ok" and r.stdout == "ran\n"
    assert record.flush(5)
    (lost,) = [e for e in r.events if e["kind"] == "audit"]
    assert "refused" in lost["message"]
    assert os.listdir(elsewhere) == []


def test_a_review_mode_receipt_hashes_the_changes(state, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    rfile = tmp_path / "r.json"
    p = cli(state, "run", "--json", "--workspace", f"{ws}:review", "--discard", "--receipt",
            str(rfile), "--", "/bin/sh", "-c", "echo two > a.txt; echo new > b.txt")
    assert p.returncode == 0, p.stderr
    changes = json.loads(p.stdout)["review"]["changes"]
    assert sorted(c["path"] for c in changes) == ["a.txt", "b.txt"]
    from corral.audit.receipt import canonical, sha

    body = _load(rfile)["body"]
    assert body["changes_sha256"] == sha(canonical(changes))
    assert (ws / "a.txt").read_text() == "one\n"
    assert cli(state, "verify", str(rfile)).returncode == 0


def test_mcp_commands_are_recorded_as_mcp(state):
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def main():
        params = StdioServerParameters(command=CORRAL, args=["mcp"], env=dict(os.environ))
        async with Client(params) as c:
            r = await c.call_tool("run_command", {"command": "echo from-mcp"})
            assert not r.is_error, r.content

            r = await c.call_tool("create_sandbox", {"policy": {"limits": {"pids": 0}}})
            assert r.is_error, r.content

    asyncio.run(asyncio.wait_for(main(), 300))
    runs = [r for r in query.runs() if r["kind"] == "command"]
    assert [(r["argv"][-1], r["face"]) for r in runs] == [("echo from-mcp", "mcp")]
    assert runs[0]["actor"].startswith("user:")
    (refused,) = query.runs(verdict="refused")        # the bad policy: recorded, as mcp
    assert refused["face"] == "mcp" and refused["actor"].startswith("user:")


def test_since_and_kind_leave_out_what_they_should(state):
    corral.run(["/bin/sh", "-c", "curl -sS -m 5 http://denied.test/ >/dev/null"], DENY_POLICY)
    corral.run(["/bin/sh", "-c", "head -c 5000 /dev/zero"], {"limits": {"output": "1K"}})
    assert record.flush(5)
    assert {g["kind"] for g in query.denials()} == {"net", "limit"}
    assert [g["kind"] for g in query.denials(kind="limit")] == ["limit"]
    conn = sqlite3.connect(db(state), isolation_level=None)
    conn.execute("UPDATE runs SET started = started - 7200 WHERE argv LIKE '%curl%'")
    conn.close()
    assert [r["argv"][-1] for r in query.runs(since=3600)] == ["head -c 5000 /dev/zero"]
    assert len(query.runs(since=3 * 3600)) == 2
    assert [g["kind"] for g in query.denials(since=3600)] == ["limit"]
    assert [g["what"] for g in query.denials(since=3 * 3600, kind="net")] == ["denied.test:80"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
def test_a_full_disk_does_not_fail_the_run_and_the_result_says_so(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(state)],
                   check=True)
    try:
        monkeypatch.setenv("CORRAL_STATE_DIR", str(state))
        monkeypatch.setenv("CORRAL_AUDIT", "1")
        corral.run(["/bin/true"])
        assert record.flush(5)
        with open(state / "filler", "wb") as f:     # the rest of the disk
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        r = corral.run(["/bin/sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x"])
        assert r.verdict == "ok" and len(r.stdout) == 200000
        assert record.flush(5)
        lost = [e for e in r.events if e["kind"] == "audit"]
        assert len(lost) == 1 and "full" in lost[0]["message"], r.events
    finally:
        record.flush(5)
        subprocess.run(["umount", "-l", str(state)], check=False)


# -- the spool: `corral run` appends one line, the store ingests it when opened -----------

def spool_file(state, name="runs.jsonl"):
    return os.path.join(state, "audit", "spool", name)


def test_a_cli_run_is_spooled_and_found_by_runs(state):
    p = cli(state, "run", "--", "/bin/sh", "-c", "echo hi; exit 4")
    assert p.returncode == 4 and p.stdout == b"hi\n"
    assert not os.path.exists(db(state))           # no SQLite in `corral run`
    with open(spool_file(state), "rb") as f:
        (line,) = f.read().splitlines()
    assert json.loads(line)["exit_code"] == 4
    st = os.stat(spool_file(state))
    assert st.st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(spool_file(state))).st_mode & 0o777 == 0o700
    assert os.stat(os.path.dirname(db(state))).st_mode & 0o777 == 0o700
    (run,) = [json.loads(x) for x in cli(state, "runs", "--json").stdout.splitlines()]
    assert run["face"] == "cli" and run["exit_code"] == 4 and run["argv"][0] == "/bin/sh"
    assert os.listdir(os.path.dirname(spool_file(state))) == []   # taken and removed
    assert len(cli(state, "runs", "--json").stdout.splitlines()) == 1


def test_a_cli_record_holds_the_policy_text_and_digest_printed_at_ingest(state, tmp_path):
    """`corral run` spools its policy's form, not its TOML (audit/record.py); after ingest
    the record holds the same text and digest as dump_toml of the policy that ran, and a
    --receipt's policy_sha256; a line of another corral version says so in an event."""
    from corral.audit.spool import digest
    from corral.cli import effective_policy, parse_run_args
    from corral.policy import Policy, dump_toml

    pfile = tmp_path / "p.toml"
    pfile.write_text('[limits]\nmemory = "300m"\ntimeout = "1500ms"\n[env.set]\nA = "é\\""\n')
    flags = ["--policy", str(pfile), "--workspace", f"{tmp_path}:review", "--env", "B=2",
             "--net", "allow", "--allow-domain", "example.test"]
    assert cli(state, "run", "--", "/bin/true").returncode == 0
    assert cli(state, "run", *flags, "--", "/bin/true").returncode == 0, "flags"
    rfile = str(tmp_path / "r.json")
    assert cli(state, "run", *flags, "--receipt", rfile, "--", "/bin/true").returncode == 0
    with open(spool_file(state), "rb") as f:
        lines = [json.loads(x) for x in f.read().splitlines()]
    assert [x["policy"] == "" for x in lines] == [True, True, False]   # --receipt: made
    assert lines[0]["policy_form"] == {} and "version" in lines[1]
    ran = effective_policy(parse_run_args([*flags, "--", "/bin/true"], want_command=True))
    assert cli(state, "runs").returncode == 0          # ingest
    conn = sqlite3.connect(db(state))
    got = conn.execute("SELECT policy, policy_digest FROM runs ORDER BY started").fetchall()
    notes = conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'audit'").fetchone()
    conn.close()
    want = [dump_toml(Policy()), dump_toml(ran), dump_toml(ran)]
    assert got == [(t, digest(t.encode())) for t in want] and notes == (0,)
    assert _load(rfile)["body"]["policy_sha256"] == got[2][1]
    lines[1]["id"], lines[1]["version"] = "r-otherversion", "0.0.0-old"
    with open(spool_file(state), "w") as f:
        f.write(json.dumps(lines[1]) + "\n")
    assert cli(state, "runs").returncode == 0
    (note,) = [e for e in query.events("r-otherversion") if e["kind"] == "audit"]
    assert "0.0.0-old" in note["message"]


@pytest.mark.parametrize("planted", ["link", "fifo", "directory"])
def test_an_unwritable_spool_file_gives_the_lost_event_and_follows_no_link(state, tmp_path,
                                                                           planted):
    os.makedirs(os.path.dirname(spool_file(state)), mode=0o700)
    target = tmp_path / "target"
    target.write_bytes(b"keep\n")
    if planted == "link":
        os.symlink(target, spool_file(state))
    elif planted == "fifo":
        os.mkfifo(spool_file(state), 0o600)
    else:
        os.mkdir(spool_file(state))
    p = cli(state, "run", "--json", "--", "/bin/echo", "ran")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["stdout"] == "ran\n" and res["verdict"] == "ok"
    (lost,) = [e for e in res["events"] if e["kind"] == "audit"]
    assert "lost" in lost["message"] and "spool" in lost["message"]
    human = cli(state, "run", "--", "/bin/echo", "ran")      # the CLI shows it
    assert human.returncode == 0 and b"audit record of this run was lost" in human.stderr
    q = cli(state, "runs", "--json")
    assert q.returncode == 0 and q.stdout == b"", q.stderr
    assert target.read_bytes() == b"keep\n"                # nothing behind the link
    p = cli(state, "run", "--", "/bin/true")               # the planted file was cleared
    assert b"lost" not in p.stderr
    assert len(cli(state, "runs", "--json").stdout.splitlines()) == 1


def test_an_interrupted_ingest_is_taken_once(state):
    assert cli(state, "run", "--net", "allow", "--allow-domain", "allowed.test",
               "--nameserver", "127.0.0.1:9", "--", "/bin/sh", "-c",
               "curl -sS -m 5 http://denied.test/; exit 0").returncode == 0
    with open(spool_file(state), "rb") as f:
        saved = f.read()
    (first,) = [json.loads(x) for x in cli(state, "runs", "--json").stdout.splitlines()]
    events = cli(state, "logs", first["id"], "--json").stdout.splitlines()
    assert any(json.loads(e)["kind"] == "net" for e in events)
    # a crash after the commit, before the unlink: the renamed-aside file is left over
    with open(spool_file(state, "ingest-0123456789abcdef.jsonl"), "wb") as f:
        f.write(saved)
    # and a crash before the commit, in another state: the next ingest takes it
    assert cli(state, "run", "--", "/bin/true").returncode == 0
    os.rename(spool_file(state), spool_file(state, "ingest-fedcba9876543210.jsonl"))
    runs = [json.loads(x) for x in cli(state, "runs", "--json").stdout.splitlines()]
    assert sorted(r["argv"][0] for r in runs) == ["/bin/sh", "/bin/true"]
    assert cli(state, "logs", first["id"], "--json").stdout.splitlines() == events
    assert os.listdir(os.path.dirname(spool_file(state))) == []


def test_a_malformed_spool_line_is_skipped_and_counted(state):
    assert cli(state, "run", "--", "/bin/sh", "-c", "exit 5").returncode == 5
    with open(spool_file(state), "rb") as f:
        good = json.loads(f.read())
    wrong_type = dict(good, id="r-other", exit_code="5")
    extra_key = dict(good, id="r-extra", sneaky=1)
    with open(spool_file(state), "ab") as f:
        f.write(b"not json\n{}\n" + json.dumps(wrong_type).encode() + b"\n"
                + json.dumps(extra_key).encode() + b"\n"
                + b"[" * 100000 + b"\n"                      # deeper than json goes
                + b'{"id": "' + b"x" * (2 << 20) + b'"}\n' + b'{"truncated": ')
    p = cli(state, "runs", "--json")
    assert p.returncode == 0
    (run,) = [json.loads(x) for x in p.stdout.splitlines()]
    assert run["id"] == good["id"] and run["exit_code"] == 5
    assert b"7 malformed line(s)" in p.stderr, p.stderr
    assert os.listdir(os.path.dirname(spool_file(state))) == []


def test_an_oversized_record_keeps_its_essentials_within_the_line_bound():
    from corral.audit import spool

    f = {"id": "r-big", "kind": "run", "sandbox": None, "started": 1.0, "ended": 2.0,
         "tier": "namespace", "image": "host", "image_digest": "host",
         "policy_digest": "sha256:x", "policy": "", "argv": ["a" * 3000] * 600,
         "verdict": "ok", "exit_code": 0, "signal": None, "usage": {"wall_s": 1.0},
         "actor": "user:root", "face": "cli",
         "events": [{"kind": "net", "host": "h" * 200}] * 10000}
    line = spool.line_of(f)
    assert len(line) <= spool.LINE_MAX and line.endswith(b"\n")
    got = json.loads(line)
    assert got["id"] == "r-big" and got["exit_code"] == 0 and got["argv"] == ["a" * 3000]
    (note,) = got["events"]
    assert note["kind"] == "audit" and "10000 events" in note["message"]
    assert spool._valid(got)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
def test_a_full_disk_under_the_spool_gives_the_cli_the_lost_event(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRAL_AUDIT", "1")
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(state)],
                   check=True)
    try:
        assert cli(str(state), "run", "--", "/bin/true").returncode == 0
        assert len(cli(str(state), "runs", "--json").stdout.splitlines()) == 1   # ingested
        with open(state / "filler", "wb", buffering=0) as f:     # the rest of the disk
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        p = cli(str(state), "run", "--json", "--", "/bin/echo", "ran")
        assert p.returncode == 0, p.stderr
        res = json.loads(p.stdout)
        assert res["stdout"] == "ran\n"
        (lost,) = [e for e in res["events"] if e["kind"] == "audit"]
        assert "No space left" in lost["message"], lost
        os.unlink(state / "filler")
        runs = [json.loads(x) for x in cli(str(state), "runs", "--json").stdout.splitlines()]
        assert [r["argv"] for r in runs] == [["/bin/true"]]
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


# -- runs refused before they start (verdict "refused") ------------------------------------

def test_runs_refused_before_they_start_are_recorded(state, tmp_path):
    # the CLI: a policy error (a flag) and a rule the tier cannot enforce (review mode on
    # the process tier); a bad flag is a usage error, not a run, and is not recorded
    p = cli(state, "run", "--memory", "lots", "--", "/bin/echo", "x")
    assert p.returncode == 2, p.stderr
    ws = tmp_path / "ws"
    ws.mkdir()
    p = cli(state, "run", "--isolation", "process", "--workspace", f"{ws}:review", "--",
            "/bin/echo", "y")
    assert p.returncode == 3, p.stderr
    assert cli(state, "run", "--no-such-flag", "--", "/bin/true").returncode == 2
    # the API: a bad policy, refused by corral.run
    with pytest.raises(corral.PolicyError):
        corral.run(["/bin/echo", "z"], {"limits": {"pids": 0}})
    record.flush()
    rows = [json.loads(x) for x in cli(state, "runs", "--json", "--verdict",
                                       "refused").stdout.splitlines()]
    assert [(r["argv"], r["face"]) for r in rows] == [
        (["/bin/echo", "z"], "api"), (["/bin/echo", "y"], "cli"), (["/bin/echo", "x"], "cli")]
    assert all(r["exit_code"] is None for r in rows)
    ev = [json.loads(x) for x in cli(state, "logs", rows[1]["id"], "--json").stdout.splitlines()]
    assert len(ev) == 1 and ev[0]["kind"] == "refused", ev
    assert ev[0]["error"] == "unsupported" and ev[0]["field"] == "filesystem.workspace"
    assert "process" in ev[0]["message"]
    assert cli(state, "runs", "--json").stdout.count(b"\n") == 3    # nothing else recorded
    d = [json.loads(x) for x in cli(state, "denials", "--json", "--kind",
                                    "refused").stdout.splitlines()]
    assert {(g["what"], g["count"], g["rule"]) for g in d} == {
        ("policy: limits.memory", 1, "fix limits.memory"),
        ("unsupported: filesystem.workspace", 1, "fix filesystem.workspace"),
        ("policy: limits.pids", 1, "fix limits.pids")}, d
    assert "refused" in cli(state, "denials").stdout.decode()


def test_a_ceiling_refusal_in_the_service_is_recorded_for_its_token(tmp_path, monkeypatch):
    from servefix import Server

    monkeypatch.setenv("CORRAL_AUDIT", "1")
    ceiling = tmp_path / "ceiling.toml"
    ceiling.write_text('[limits]\nmemory = "256M"\n')
    s = Server(tmp_path, tokens=[("a", "--ceiling", str(ceiling)), "b"]).start()
    try:
        a, b = s.http(s.tokens["a"]), s.http(s.tokens["b"])
        r = a.post("/sandboxes", json={"policy": {"limits": {"memory": "1G"}}})
        assert r.status_code == 403, r.text
        (run,) = _wait_runs(a)
        assert run["verdict"] == "refused" and run["actor"] == "token:a", run
        (e,) = a.get(f"/runs/{run['id']}/events").json()["events"]
        assert e["kind"] == "refused" and e["error"] == "ceiling"
        assert e["field"] == "limits.memory"
        assert a.get("/denials", params={"kind": "refused"}).json()["denials"][0]["what"] == \
            "ceiling: limits.memory"
        assert b.get("/runs").json() == {"runs": []}
    finally:
        s.stop()


def _key_after_barrier(directory, barrier, out):
    from corral.audit import receipt

    barrier.wait()
    try:
        out.put(receipt.public_key_text(directory))
    except Exception as e:  # noqa: BLE001 - the parent asserts on what came back
        out.put(f"error: {type(e).__name__}: {e}")


def test_processes_making_the_host_key_at_once_all_sign_with_the_same_whole_key(tmp_path):
    """Ray nodes on one machine share its key: the first use by several at once once left
    one reading the key file before its creator had written it (no receipt, CI failure)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        d = str(tmp_path / f"state{round_}")
        n = 12
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_key_after_barrier, args=(d, barrier, out))
                 for _ in range(n)]
        for p in procs:
            p.start()
        got = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        assert len(set(got)) == 1 and got[0].startswith("ed25519:"), got
        assert sorted(os.listdir(d)) == ["receipt.key"], os.listdir(d)
        assert os.stat(os.path.join(d, "receipt.key")).st_mode & 0o777 == 0o600
