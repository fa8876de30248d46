"""`corral serve` with live sandboxes behind it, for real: uvicorn in a subprocess on
127.0.0.1, namespace-tier sandboxes, the SDK (corral.client) sync and async, raw sockets
for the disconnects. Background commands, set_timeout/get_info, a dropped client killing
its foreground command, the terminal over a WebSocket, the changes API and who may apply,
events as SSE, SIGTERM's drain and the sweep after a crash."""

import asyncio
import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest
from conftest import procs_of_uid, tier_unavailable
from servefix import Server, procs_with, until

from corral import client
from corral.errors import SandboxClosed, UsageError

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


def _uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError(pid)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-live")
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("hello\n")
    review = tmp / "review.toml"
    review.write_text(f'[filesystem.workspace]\npath = "{ws}"\nmode = "review"\n')
    net = tmp / "net.toml"
    net.write_text('[network]\nmode = "allow"\nallow = ["allowed.invalid"]\n')
    with Server(tmp, tokens=["a", ("net", "--ceiling", str(net)),
                             ("agent", "--ceiling", str(review)),
                             ("human", "--ceiling", str(review), "--apply-changes")]) as s:
        s.ws = ws
        yield s


@pytest.fixture
def sb(server):
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as s:
        yield s


def test_every_new_route_is_in_the_openapi_document_with_its_errors(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    paths = doc["paths"]
    for path, method in [("/sandboxes/{sid}/timeout", "post"),
                         ("/sandboxes/{sid}/commands", "get"),
                         ("/sandboxes/{sid}/commands/{pid}", "get"),
                         ("/sandboxes/{sid}/commands/{pid}/stdin", "post"),
                         ("/sandboxes/{sid}/commands/{pid}/kill", "post"),
                         ("/sandboxes/{sid}/commands/{pid}/wait", "get"),
                         ("/sandboxes/{sid}/commands/{pid}/output", "get"),
                         ("/sandboxes/{sid}/changes", "get"),
                         ("/sandboxes/{sid}/changes/diff", "get"),
                         ("/sandboxes/{sid}/changes/apply", "post"),
                         ("/sandboxes/{sid}/changes/discard", "post"),
                         ("/sandboxes/{sid}/events", "get")]:
        op = paths[path][method]
        assert {"200", "401", "404"} <= set(op["responses"]), (path, op["responses"])
    assert "403" in paths["/sandboxes/{sid}/changes/apply"]["post"]["responses"]
    assert "503" in paths["/sandboxes"]["post"]["responses"]
    assert "/pty" in doc["info"]["description"]


# -- background commands, set_timeout, get_info --------------------------------------------
def test_background_command_stdin_output_wait_and_list(sb):
    seen = []
    h = sb.commands.run("cat; echo done-$((40+2))", background=True, on_stdout=seen.append)
    assert h.pid > 0 and h.running
    assert h.pid in [c.pid for c in sb.commands.list()]
    assert [c.background for c in sb.commands.list() if c.pid == h.pid] == [True]
    h.send_stdin("hello\n")
    h.close_stdin()
    r = h.wait(60)
    assert r.verdict == "ok" and r.stdout == "hello\ndone-42\n", r
    assert b"".join(seen) == b"hello\ndone-42\n"      # bytes, as in-process
    assert not h.running
    assert h.pid not in [c.pid for c in sb.commands.list()]


def test_background_kill_and_wait_timeout(sb):
    h = sb.commands.run(["sleep", "1000"], background=True)
    with pytest.raises(TimeoutError):
        h.wait(0.2)
    assert h.running
    h.kill()
    assert h.wait(60).verdict == "killed"


def test_foreground_env_cwd_stdin_bytes(sb):
    r = sb.commands.run("pwd; echo $GREETING; cat", env={"GREETING": "hi"}, cwd="/tmp",
                        stdin=b"\x00raw")
    assert r.verdict == "ok" and r.stdout == "/tmp\nhi\n\x00raw", r


def test_set_timeout_get_info_and_the_end(server):
    sb = client.Sandbox.create({}, timeout=600, metadata={"who": "test"},
                               api_url=server.url, api_key=server.tokens["a"])
    info = sb.get_info()
    assert info.state == "running" and info.metadata == {"who": "test"}
    assert info.ends > info.created + 500
    assert info.policy_digest.startswith("sha256:")
    sb.set_timeout(1)
    assert sb.get_info().ends < info.ends
    # the sandbox ends by itself: then it is gone from the service
    until(lambda: sb.id not in [d["id"] for d in client.Sandbox.list(
        api_url=server.url, api_key=server.tokens["a"])], "the sandbox ended")
    with pytest.raises(client.NotFound):
        sb.get_info()
    with pytest.raises(client.NotFound):
        client.Sandbox.connect(sb.id, api_url=server.url, api_key=server.tokens["a"])
    sb._http.close()


def test_connect_sees_the_same_sandbox(server, sb):
    sb.files.write("/scratch/mark", "here")
    other = client.Sandbox.connect(sb.id, api_url=server.url, api_key=server.tokens["a"])
    assert other.commands.run("cat /scratch/mark").stdout == "here"
    other._http.close()


def test_sandboxes_of_one_process_share_a_pool_a_kill_leaves_it_open(server):
    """The sync SDK's Sandboxes of one service share one kept-alive pool and one TLS
    context (a Client each made its own: ~25 ms a create); one's kill closes only its
    Client, never the pool the others use."""
    key = server.tokens["a"]
    one = client.Sandbox.create({}, api_url=server.url, api_key=key)
    two = client.Sandbox.create({}, api_url=server.url, api_key=key)
    try:
        assert one._http._transport is two._http._transport
        one.kill()
        assert two.commands.run("echo on").stdout == "on\n"
        three = client.Sandbox.create({}, api_url=server.url, api_key=key)
        assert three.commands.run("echo too").stdout == "too\n"
        three.kill()
    finally:
        two.kill()


def test_a_killed_sandbox_is_gone(server):
    sb = client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"])
    h = sb.commands.run(["sleep", "1001.5"], background=True)
    assert h.pid
    until(lambda: procs_with("1001.5"), "the sleep runs")
    other = client.Sandbox.connect(sb.id, api_url=server.url, api_key=server.tokens["a"])
    sb.kill()
    until(lambda: not procs_with("1001.5"), "the sleep is gone with its sandbox")
    with pytest.raises(client.NotFound):
        other.commands.run("true")
    other._http.close()


def test_a_call_racing_the_end_is_sandbox_closed(server):
    """A command started on a sandbox that ended under the service's hold (its timeout)
    is SandboxClosed (409 closed), or NotFound once the service has forgotten it."""
    sb = client.Sandbox.create({}, timeout=600, api_url=server.url,
                               api_key=server.tokens["a"])
    h = sb.commands.run(["sleep", "1011.5"], background=True)
    sb.set_timeout(0.5)
    r = h.wait(60)
    assert r.verdict == "killed" or any(e.get("kind") == "teardown" for e in r.events), r
    with pytest.raises((SandboxClosed, client.NotFound)):
        sb.commands.run("true")
    sb._http.close()


# -- a client that goes away ----------------------------------------------------------------
def _raw_exec(server, token, sid, body: dict, stream: bool = False) -> socket.socket:
    data = json.dumps(body).encode()
    path = f"/sandboxes/{sid}/exec" + ("?stream=ndjson" if stream else "")
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
              .encode() + data)
    return s


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "ndjson"])
def test_a_disconnect_kills_the_foreground_command(server, sb, stream):
    arg = "1002.5" if stream else "1003.5"
    s = _raw_exec(server, server.tokens["a"], sb.id, {"argv": ["sleep", arg]}, stream)
    try:
        until(lambda: procs_with(arg), "the command runs")
        pid = until(lambda: [c.pid for c in sb.commands.list() if c.cmd[-1] == arg],
                     "the command is listed")[0]
    finally:
        s.close()
    until(lambda: not procs_with(arg), "the command's process is gone")
    with server.http(server.tokens["a"]) as h:
        d = h.get(f"/sandboxes/{sb.id}/commands/{pid}").json()
    assert d["running"] is False and d["result"]["verdict"] == "killed", d
    assert sb.commands.run("echo still-here").stdout == "still-here\n"   # the sandbox lives


def test_a_background_command_outlives_its_dropped_output_stream(server, sb):
    h = sb.commands.run(["sh", "-c", "echo up; exec sleep 1004.5"], background=True)
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(f"GET /sandboxes/{sb.id}/commands/{h.pid}/output HTTP/1.1\r\nHost: x\r\n"
              f"Authorization: Bearer {server.tokens['a']}\r\n\r\n".encode())
    got = b""
    while b"up" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    s.close()
    time.sleep(0.5)      # give a (wrong) kill its chance to happen
    assert procs_with("1004.5") and h.running
    h.kill()
    assert h.wait(60).verdict == "killed"


# -- the terminal ---------------------------------------------------------------------------
def test_pty_over_websocket_input_resize_output_exit(sb):
    out = []
    term = sb.pty.create(80, 24, "bash --norc -i", on_data=out.append)
    assert term.pid
    term.send_input("echo hi-$((40+2))\r")
    until(lambda: b"hi-42" in b"".join(out), "the echo shows")
    term.resize(100, 30)
    term.send_input("stty size\r")
    until(lambda: b"30 100" in b"".join(out), "the new size shows")
    term.send_input("exit\r")
    r = term.wait(60)
    assert r.verdict == "ok" and "hi-42" in r.stdout and "30 100" in r.stdout, r


def test_pty_kill_and_a_dropped_socket_end_the_command(server, sb):
    term = sb.pty.create(80, 24, "sleep 1005.5")
    until(lambda: procs_with("1005.5"), "the terminal's command runs")
    term.kill()
    assert term.wait(60).verdict == "killed"
    assert not procs_with("1005.5")
    term = sb.pty.create(80, 24, "sleep 1006.5")
    until(lambda: procs_with("1006.5"), "the terminal's command runs")
    term._ws.close()                      # the client goes away without a word
    until(lambda: not procs_with("1006.5"), "the terminal's command is gone")


def test_pty_refusals_are_corrals_errors(server, sb):
    other = client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["human"])
    try:
        stranger = client.Sandbox(other.info, sb._http)    # a token's view of another's
        with pytest.raises(client.NotFound):
            stranger.pty.create(80, 24, "true")
        with pytest.raises(UsageError, match="cols"):
            sb.pty.create(0, 24, "true")
    finally:
        other.kill()


# -- changes ---------------------------------------------------------------------------------
def test_changes_list_diff_discard_and_who_may_apply(server):
    policy = {"filesystem": {"workspace": {"path": str(server.ws), "mode": "review"}}}
    with client.Sandbox.create(policy, api_url=server.url,
                               api_key=server.tokens["agent"]) as sb:
        r = sb.commands.run("echo changed >> README.md; echo new > b.txt")
        assert r.verdict == "ok", r
        got = {c.path: c for c in sb.changes()}
        assert got["README.md"].kind == "modified" and "+changed" in got["README.md"].diff
        assert got["b.txt"].kind == "added"
        patch, omitted = sb.changes_patch()
        assert b"+++ b/README.md" in patch and b"b/b.txt" in patch and omitted == []
        with pytest.raises(client.CeilingError) as e:
            sb.apply_changes()
        assert e.value.field == "changes.apply" and e.value.status == 403
        assert (server.ws / "README.md").read_text() == "hello\n"
        assert not (server.ws / "b.txt").exists()
        sb.discard_changes()
        assert sb.changes() == []
    with client.Sandbox.create(policy, api_url=server.url,
                               api_key=server.tokens["human"]) as sb:
        sb.commands.run("echo applied > c.txt")
        applied = sb.apply_changes(["c.txt"])
        assert applied.applied == ("c.txt",), applied
    assert (server.ws / "c.txt").read_text() == "applied\n"


def test_changes_without_review_mode_is_a_usage_error(sb):
    with pytest.raises(UsageError, match="review") as e:
        sb.changes()
    assert e.value.field == "filesystem.workspace.mode"


# -- events ----------------------------------------------------------------------------------
def test_events_stream_as_sse_until_the_sandbox_ends(server):
    sb = client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"])
    got, done = [], threading.Event()

    def listen():
        for ev in sb.stream_events():
            got.append(ev)
        done.set()

    threading.Thread(target=listen, daemon=True).start()
    sb.commands.run("exit 3")
    until(lambda: any(e["kind"] == "command.ended" for e in got), "command.ended")
    kinds = [e["kind"] for e in got]
    assert kinds[:3] == ["sandbox.created", "command.started", "command.ended"], kinds
    assert got[2]["data"]["exit_code"] == 3
    assert [e["id"] for e in got] == list(range(len(got)))
    past = list(sb.stream_events(follow=False))      # those so far, without following
    assert [e["kind"] for e in past][:3] == kinds[:3]
    sb.kill()
    assert done.wait(60), "the stream did not end with the sandbox"
    assert got[-1]["kind"] in ("sandbox.ended", "sandbox"), got[-1]


def test_a_denied_connection_is_a_network_event(server):
    policy = {"network": {"mode": "allow", "allow": ["allowed.invalid"]}}
    with client.Sandbox.create(policy, api_url=server.url,
                               api_key=server.tokens["net"]) as sb:
        r = sb.commands.run("curl -s -m 20 http://denied.invalid/", timeout=60)
        assert "blocked" in r.stdout, r
        net = until(lambda: [e for e in sb.stream_events(follow=False)
                              if e["kind"] == "network"],
                     "the proxy's event arrives")
        assert net[0]["data"]["host"] == "denied.invalid"
        assert net[0]["data"]["decision"] == "deny" and "network.allow" in \
            net[0]["data"]["reason"]


# -- async -----------------------------------------------------------------------------------
def test_async_sdk_background_pty_changes_events(server):
    async def main():
        async with await client.AsyncSandbox.create(
                {}, api_url=server.url, api_key=server.tokens["a"]) as sb:
            h = await sb.commands.run("cat", background=True)
            await h.send_stdin(b"abc")
            await h.close_stdin()
            assert (await h.wait(60)).stdout == "abc"
            assert [c.pid for c in await sb.commands.list()] == []
            out = []
            term = await sb.pty.create(80, 24, "echo hi-$((40+2))", on_data=out.append)
            r = await term.wait(60)
            assert "hi-42" in r.stdout and b"hi-42" in b"".join(out)
            info = await sb.get_info()
            await sb.set_timeout(900)
            assert (await sb.get_info()).ends > info.ends
            kinds = [e["kind"] async for e in sb.stream_events(follow=False)]
            assert "command.ended" in kinds and "pty.started" in kinds
            with pytest.raises(UsageError, match="review"):
                await sb.changes()
            sid = sb.id
        with pytest.raises(client.NotFound):
            await client.AsyncSandbox.connect(sid, api_url=server.url,
                                              api_key=server.tokens["a"])
    asyncio.run(main())


# -- SIGTERM's drain, and the sweep after a crash ---------------------------------------------
def _serve(tmp_path, *extra):
    return Server(tmp_path, *extra, tokens=["a"]).start()


def test_sigterm_drains_then_kills_everything(tmp_path):
    s = _serve(tmp_path, "--drain-timeout", "60")
    sb = client.Sandbox.create({}, api_url=s.url, api_key=s.tokens["a"])
    bg = sb.commands.run(["sleep", "1007.5"], background=True)
    assert bg.pid
    fg: dict = {}

    def foreground():
        fg["r"] = sb.commands.run("sleep 1008.5 & wait; echo finished", timeout=120)

    # the foreground command ends on its own only when its sleep is killed from the host:
    # it is still running when SIGTERM comes, and the drain lets it finish
    t = threading.Thread(target=foreground, daemon=True)
    t.start()
    pids = until(lambda: procs_with("1008.5"), "the foreground command runs")
    uid = _uid_of(until(lambda: procs_with("1007.5"), "the background command runs")[0])
    s.proc.send_signal(signal.SIGTERM)
    until(lambda: b"draining" in s.log.read_bytes(), "the drain is logged")
    # no new sandboxes: the listening socket is closed (or a 503 on a kept connection)
    with pytest.raises((httpx.TransportError, client.ApiError)):
        client.Sandbox.create({}, api_url=s.url, api_key=s.tokens["a"])
    assert s.proc.poll() is None          # still draining: the foreground command runs
    for p in pids:
        os.kill(p, signal.SIGKILL)        # now it finishes
    t.join(60)
    assert fg["r"].stdout == "finished\n", fg
    assert s.proc.wait(60) in (0, -signal.SIGTERM)   # uvicorn re-raises the signal
    s.logf.close()
    log = s.log.read_text()
    assert "1 sandbox(es) killed" in log, log
    assert not procs_with("1007.5") and not procs_of_uid(uid)


def test_sigterm_kills_a_foreground_command_at_the_deadline(tmp_path):
    s = _serve(tmp_path, "--drain-timeout", "1")
    sb = client.Sandbox.create({}, api_url=s.url, api_key=s.tokens["a"])
    err: dict = {}

    def foreground():
        try:
            sb.commands.run(["sleep", "1009.5"], timeout=600)
        except Exception as e:  # noqa: BLE001 - the connection closes under it
            err["e"] = e

    t = threading.Thread(target=foreground, daemon=True)
    t.start()
    uid = _uid_of(until(lambda: procs_with("1009.5"), "the command runs")[0])
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(60) in (0, -signal.SIGTERM)   # uvicorn re-raises the signal
    t.join(60)
    s.logf.close()
    sb._http.close()                      # its service is gone
    assert "e" in err
    assert not procs_with("1009.5") and not procs_of_uid(uid)
    assert "1 sandbox(es) killed" in s.log.read_text()


def test_a_restart_sweeps_what_a_killed_service_left(tmp_path):
    from corral.linux.rundir import base_dir

    s = _serve(tmp_path)
    sb = client.Sandbox.create({}, api_url=s.url, api_key=s.tokens["a"])
    sb.commands.run(["sleep", "1010.5"], background=True)
    until(lambda: procs_with("1010.5"), "the command runs")
    run_dir = os.path.join(base_dir(), sb.id)
    assert os.path.isdir(run_dir)
    s.proc.kill()                         # no drain, no end: what is left is the sweep's
    s.proc.wait(60)
    s.logf.close()
    sb._http.close()                      # its service is gone
    left = os.path.isdir(run_dir)         # (any process opening a sandbox sweeps too)
    (tmp_path / "again").mkdir()
    again = Server(tmp_path / "again")
    again.state = s.state
    again.tokens = s.tokens
    again.start()
    try:
        log = until(lambda: b"sweep:" in again.log.read_bytes() and again.log.read_text(),
                     "the sweep is logged")
        if left and "nothing left over" in log:
            # another process on this machine opened a sandbox between our look and the
            # restart, and swept it first: the directory must be gone all the same
            assert not os.path.isdir(run_dir)
        elif left:
            assert "removed" in log and sb.id in log, log
        assert not os.path.isdir(run_dir)
        assert not procs_with("1010.5")
    finally:
        again.stop()


def test_the_drain_refuses_new_sandboxes_on_a_kept_connection(tmp_path):
    s = _serve(tmp_path, "--drain-timeout", "60")
    with s.http(s.tokens["a"]) as http:
        sid = http.post("/sandboxes", json={}).json()["id"]
        s.proc.send_signal(signal.SIGTERM)
        until(lambda: b"draining" in s.log.read_bytes(), "the drain is logged")
        try:
            r = http.post("/sandboxes", json={})
        except httpx.TransportError:
            r = None          # uvicorn closed the idle connection first: refused as well
        if r is not None:
            assert r.status_code == 503 and r.json()["error"]["kind"] == "draining", r.text
        assert sid
    assert s.proc.wait(60) in (0, -signal.SIGTERM)   # uvicorn re-raises the signal
    s.logf.close()
