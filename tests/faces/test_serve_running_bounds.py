"""What commands and cells may hold of the server, for real: `corral serve` under uvicorn
in a subprocess, namespace-tier live sandboxes on the host's root, the SDK and E2B's SDKs.
A command (foreground or background) or code cell holds a thread of the server's own until
it ends, which the sandbox's code decides; a token without max_concurrent must not be able
to start them without end, so the whole server holds at most `[server] max_running` of
them (every token's and both faces' together), and gives each place back at its end."""

import asyncio
import json
import struct

import httpx
import pytest
from conftest import tier_unavailable
from servefix import mcp_session, procs_with, until

from corral import client

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

MOST = 3
#: a cell that runs until /tmp/go-cell is there
GO = ("import os, time\n"
      "while not os.path.exists('/tmp/go-cell'):\n    time.sleep(0.05)")


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A server running at most MOST commands and cells, its tokens without
    max_concurrent; its E2B template `base` the host's root (nothing to build)."""
    from e2bfix import e2b_serve

    tmp = tmp_path_factory.mktemp("serve-run-cap")
    (tmp / "corral.toml").write_text(f"[server]\nmax_running = {MOST}\n")
    s = e2b_serve(tmp, {"a": [], "b": []}, "[base]\n",
                  args=("--config", str(tmp / "corral.toml"), "--mcp"))
    yield s
    s.stop()


def running(server, token: str) -> int:
    with server.http(token) as http:
        text = http.get("/metrics").text
    return int(text.split("\ncorral_running ", 1)[1].split("\n", 1)[0])


def gives_up(server, token: str, path: str, body: dict) -> None:
    """POST `body` to `path` as a client that goes away after a second."""
    try:
        httpx.post(f"{server.url}{path}", json=body, timeout=1,
                   headers={"Authorization": f"Bearer {token}"})
    except httpx.TimeoutException:
        pass


def refused(server, token: str, sb, es) -> None:
    """Each way of starting one more, over both faces, is refused naming max_running."""
    with pytest.raises(client.RateLimited, match="max_running") as ei:
        sb.run_code("1 + 1", timeout=60)
    assert ei.value.field == "max_running" and ei.value.retry_after >= 1
    with pytest.raises(client.RateLimited, match="max_running"):
        sb.commands.run("echo no")
    with pytest.raises(client.RateLimited, match="max_running"):
        sb.commands.run("sleep 1799.5", background=True)
    r = httpx.post(f"{server.url}/sandboxes/{sb.id}/run_code", json={"code": "1"},
                   params={"stream": "ndjson"},
                   headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["field"] == "max_running"
    with pytest.raises(Exception, match="max_running"):
        es.commands.run("sleep 1798.5", background=True)
    # the E2B envd face's Connect stream says when to try again, as REST's 429 does
    msg = json.dumps({"process": {"cmd": "/bin/echo", "args": ["no"]}}).encode()
    r = httpx.post(f"{server.url}/process.Process/Start",
                   content=struct.pack(">BI", 0, len(msg)) + msg, timeout=60,
                   headers={"E2b-Sandbox-Id": es.sandbox_id, "E2b-Sandbox-Port": "49983",
                            "X-Access-Token": es._envd_access_token,
                            "Content-Type": "application/connect+json"})
    end = json.loads(r.content[5:])
    assert end["error"]["code"] == "resource_exhausted", end
    assert "max_running" in end["error"]["message"] and int(r.headers["Retry-After"]) >= 1
    ci = pytest.importorskip("e2b_code_interpreter")
    with pytest.raises(Exception, match="max_running"):     # E2B's /execute: its cells
        ci.Sandbox.connect(es.sandbox_id).run_code("1 + 1")
    assert not procs_with("1799.5") and not procs_with("1798.5")


def test_commands_and_cells_are_bounded_for_the_whole_server(capped, monkeypatch):
    """Token a fills the server's max_running with a background command, a cell whose
    client went away, and an E2B background command; token b is refused every way (429,
    field max_running, Retry-After). Each end gives its place back: a kill, the cell's
    own timeout, the sandbox's end; a foreground command whose client goes away is killed
    and its place given back. After MOST ended, MOST more start, and no more."""
    e2b = pytest.importorskip("e2b")
    from e2bfix import e2b_env

    a, b = capped.tokens["a"], capped.tokens["b"]
    e2b_env(capped, monkeypatch, "a")
    with client.Sandbox.create({}, api_url=capped.url, api_key=a) as sa, \
            client.Sandbox.create({}, api_url=capped.url, api_key=b) as sb:
        es = e2b.Sandbox.create(timeout=300)
        try:
            bg = sa.commands.run("exec sleep 1701.5", background=True)
            gives_up(capped, a, f"/sandboxes/{sa.id}/run_code", {"code": GO, "timeout": 120})
            es.commands.run("sleep 1702.5", background=True)
            until(lambda: procs_with("1701.5") and procs_with("1702.5"), "both run")
            assert running(capped, a) == MOST
            e2b_env(capped, monkeypatch, "b")
            with e2b.Sandbox.create(timeout=120) as esb:
                refused(capped, b, sb, esb)
                bg.kill()                                 # a kill gives its place back
                until(lambda: running(capped, b) == MOST - 1, "the killed one's place")
                assert "yes" in sb.commands.run("echo yes").stdout
                sa.files.write("/tmp/go-cell", "")   # the gone client's cell ends: its place
                until(lambda: running(capped, b) == MOST - 2, "the cell's place")
                es.kill()                  # the sandbox's end ends its command: its place
                until(lambda: running(capped, b) == 0, "every place given back")
                # a foreground command whose client goes away: killed, its place back
                gives_up(capped, b, f"/sandboxes/{sb.id}/exec", {"cmd": "sleep 1703.5"})
                until(lambda: not procs_with("1703.5"), "the gone client's command ends")
                until(lambda: running(capped, b) == 0, "its place given back")
                # MOST ended; MOST more start (both faces), and one more is refused
                more = [sb.commands.run(f"exec sleep 1704.{i}", background=True)
                        for i in range(MOST - 1)]
                more.append(esb.commands.run("sleep 1705.5", background=True))
                assert running(capped, b) == MOST
                refused(capped, b, sb, esb)
                for h in more[:-1]:
                    h.kill()
                more[-1].kill()
                until(lambda: running(capped, b) == 0, "none counted running")
                assert sb.run_code("2 + 2", timeout=60).text == "4"
        finally:
            es.kill()


def test_mcp_commands_and_cells_count_too(capped):
    """/mcp's run_command and run_code hold a place while they run: past max_running
    they are refused naming it, and the places are given back."""
    a = capped.tokens["a"]
    with client.Sandbox.create({}, api_url=capped.url, api_key=a) as sa:
        hs = [sa.commands.run(f"exec sleep 1710.{i}", background=True) for i in range(MOST)]

        async def full(c):
            return [await c.call_tool(t, {k: "1", "sandbox_id": sa.id})
                    for t, k in (("run_code", "code"), ("run_command", "command"))]
        for r in mcp_session(capped, a, full):
            assert r.is_error and "max_running" in r.content[0].text, r
        for h in hs:
            h.kill()
        until(lambda: running(capped, a) == 0, "every place given back")

        async def free(c):
            return await c.call_tool("run_code", {"code": "6 * 7", "sandbox_id": sa.id})
        assert mcp_session(capped, a, free).structured_content["results"][0]["text"] == "42"
        assert running(capped, a) == 0


#: anyio's default thread limiter: the worker threads every sync route shares
POOL = 40


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory):
    from servefix import Server

    with Server(tmp_path_factory.mktemp("serve-run-mcp"), "--mcp",
                tokens=["a", "other"]) as s:
        yield s


def test_mcp_cells_leave_the_servers_worker_threads_to_others(mcp_server):
    """POOL + 1 /mcp run_code calls at once on one sandbox (they wait for its lock, the
    first for a file that is not there yet): another token's sync route (GET /metrics)
    still answers meanwhile; the cells then all end."""
    s = mcp_server
    with client.Sandbox.create({}, api_url=s.url, api_key=s.tokens["a"]) as sb:
        code = ("import os, time\n"
                "while not os.path.exists('/tmp/go-mcp'):\n    time.sleep(0.05)\n'done'")

        def others() -> bool:
            try:
                with httpx.Client(headers={"Authorization": f"Bearer {s.tokens['other']}"},
                                  timeout=20) as h:
                    return h.get(f"{s.url}/metrics").status_code == 200
            except httpx.TimeoutException:
                return False

        async def body(c):
            calls = [asyncio.create_task(c.call_tool("run_code", {
                "code": code, "sandbox_id": sb.id, "timeout": 120}))
                for _ in range(POOL + 1)]
            await asyncio.sleep(3)            # the calls reach the server
            answered = await asyncio.to_thread(others)
            # a foreground exec waits in no worker of the pool: it always gets through
            await asyncio.to_thread(sb.commands.run, "touch /tmp/go-mcp")
            return answered, await asyncio.gather(*calls)

        answered, results = mcp_session(s, s.tokens["a"], body)
        assert answered, "GET /metrics did not answer while /mcp cells ran"
        assert all(not r.is_error and r.structured_content["results"][0]["text"] == "'done'"
                   for r in results)
