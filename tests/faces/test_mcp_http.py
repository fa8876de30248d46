"""`corral serve --mcp`: the MCP tools over streamable HTTP at /mcp, driven by the official
SDK's client, behind the bearer tokens and ceilings of the REST API (a real uvicorn
subprocess, real namespace sandboxes)."""

import asyncio

import httpx
import pytest
from conftest import tier_unavailable
from servefix import Serve

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

NET = {"network": {"mode": "allow", "allow": ["allowed.invalid"]}}
FETCH = ("import urllib.request as u, urllib.error as e\n"
         "try:\n    u.urlopen('http://denied.invalid/', timeout=30)\n"
         "except e.HTTPError as x:\n    print(x.code)\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mcp-http")
    ceiling = tmp / "ceiling.toml"
    ceiling.write_text('[network]\nmode = "allow"\nallow = ["allowed.invalid"]\n'
                       '[limits]\nmemory = "256M"\n')
    s = Serve(tmp, "--mcp")
    s.tokens = {"a": s.token("a", "--ceiling", str(ceiling)), "b": s.token("b"),
                "slow": s.token("slow", "--rate", "1/min", "--burst", "2")}
    s.start()
    yield s
    s.stop()


def _session(url, token, body, *, mode="auto"):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
            transport = streamable_http_client(url + "/mcp", http_client=http)
            async with Client(transport, mode=mode) as c:
                return await body(c)

    return asyncio.run(asyncio.wait_for(main(), 300))


def test_tools_code_files_and_a_denial_over_http(server):
    """A session of the handshake era (what today's assistants speak): its own sandbox
    made on the first call, kept between calls, killed at the session's end."""
    async def body(c):
        out = {"tools": {t.name for t in (await c.list_tools()).tools}}
        r = await c.call_tool("run_code", {"code": "x = 6 * 7\nx"})
        out["code"] = r.structured_content
        out["sid"] = r.structured_content["sandbox_id"]
        r = await c.call_tool("run_code", {"code": "x + 1"})
        out["again"] = r.structured_content
        r = await c.call_tool("write_file", {"path": "/scratch/m.txt", "content": "over http"})
        assert not r.is_error, r.content
        r = await c.call_tool("read_file", {"path": "/scratch/m.txt"})
        out["read"] = r.structured_content
        await c.call_tool("write_file", {"path": "/scratch/fetch.py", "content": FETCH})
        r = await c.call_tool("run_command", {"command": "python3 /scratch/fetch.py"})
        out["fetch"] = r.structured_content
        out["fetch_text"] = r.content[0].text
        r = await c.call_tool("recent_denials", {})
        out["denials"] = r.structured_content["denials"]
        r = await c.call_tool("create_sandbox", {"policy": {"limits": {"memory": "1G"}}})
        out["refused"] = (r.is_error, r.content[0].text)
        return out

    def denied_net():
        for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith('corral_denials_total{kind="net"} '):
                return float(line.split()[1])
        return 0.0

    before = denied_net()
    out = _session(server.url, server.tokens["a"], body, mode="legacy")
    assert denied_net() == before + 1       # /metrics counts MCP's commands too
    assert "run_code" in out["tools"] and "get_changes" in out["tools"]
    assert out["code"]["results"][0]["text"] == "42"
    assert out["again"]["results"][0]["text"] == "43"
    assert out["read"]["content"] == "over http"
    assert out["fetch"]["stdout"] == "403\n", out["fetch"]["stderr"]
    assert "recent_denials" in out["fetch_text"]
    (d,) = out["denials"]
    assert (d["kind"], d["host"], d["decision"]) == ("net", "denied.invalid", "deny")
    assert d["would_allow"] == 'network.allow += ["denied.invalid:80"]'
    is_error, text = out["refused"]
    assert is_error and "limits.memory" in text
    # the session's own sandbox went with the session (the client's DELETE at its end)
    with server.http(server.tokens["a"]) as h:
        assert out["sid"] not in [s["id"] for s in h.get("/sandboxes").json()["sandboxes"]]


def test_a_sessionless_client_shares_the_tokens_own_sandbox(server):
    """Protocol 2026-07-28 (the SDK's default): no session, each call stands alone; calls
    without a sandbox_id share the token's own sandbox, until kill_sandbox."""
    async def first(c):
        r = await c.call_tool("run_code", {"code": "y = 'kept'\ny"})
        return r.structured_content

    async def second(c):
        r = await c.call_tool("run_code", {"code": "y"})
        sid = r.structured_content["sandbox_id"]
        out = (r.structured_content, sid)
        await c.call_tool("kill_sandbox", {"sandbox_id": sid})
        r = await c.call_tool("run_code", {"code": "y"})
        return out + (r.structured_content,)

    one = _session(server.url, server.tokens["b"], first)
    two, sid, after = _session(server.url, server.tokens["b"], second)
    assert one["results"][0]["text"] == two["results"][0]["text"] == "'kept'"
    assert one["sandbox_id"] == sid
    assert after["sandbox_id"] != sid and after["error"]["name"] == "NameError"
    with server.http(server.tokens["b"]) as h:
        h.delete(f"/sandboxes/{after['sandbox_id']}")


def test_mcp_and_rest_share_a_tokens_sandboxes(server):
    async def body(c):
        r = await c.call_tool("create_sandbox", {})
        sid = r.structured_content["sandbox_id"]
        await c.call_tool("write_file", {"path": "/scratch/shared", "content": "both",
                                         "sandbox_id": sid})
        return sid

    sid = _session(server.url, server.tokens["a"], body)
    try:     # made over MCP, read over REST with the same token; another token: 404
        with server.http(server.tokens["a"]) as h:
            got = h.get(f"/sandboxes/{sid}/files", params={"path": "/scratch/shared"})
            assert got.json()["content"] == "both"
        with server.http(server.tokens["b"]) as h:
            assert h.get(f"/sandboxes/{sid}").status_code == 404

        async def other(c):
            r = await c.call_tool("run_command", {"command": "true", "sandbox_id": sid})
            return r.is_error, r.content[0].text

        is_error, text = _session(server.url, server.tokens["b"], other)
        assert is_error and "no sandbox" in text
    finally:
        with server.http(server.tokens["a"]) as h:
            h.delete(f"/sandboxes/{sid}")


def _initialize():
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}}


MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}


@pytest.mark.parametrize("auth", [None, "Bearer corral_wrong", "Basic abc"])
def test_mcp_without_a_valid_token_is_401(server, auth):
    headers = {**MCP_HEADERS, **({"Authorization": auth} if auth else {})}
    r = httpx.post(server.url + "/mcp", json=_initialize(), headers=headers, timeout=30)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["kind"] == "auth"
    assert r.headers["www-authenticate"] == "Bearer"


def test_a_session_is_bound_to_its_token(server):
    with server.http(server.tokens["a"]) as h:
        r = h.post("/mcp", json=_initialize(), headers=MCP_HEADERS)
        assert r.status_code == 200, r.text
        session = r.headers["mcp-session-id"]
    with server.http(server.tokens["b"]) as h:      # b does not get a's session
        r = h.post("/mcp", headers={**MCP_HEADERS, "mcp-session-id": session,
                                    "mcp-protocol-version": "2025-06-18"},
                   json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert r.status_code == 404, r.text
    with server.http(server.tokens["a"]) as h:
        h.delete("/mcp", headers={"mcp-session-id": session,
                                  "mcp-protocol-version": "2025-06-18"})


def test_mcp_requests_count_against_the_tokens_rate(server):
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {server.tokens['slow']}"}
    got = [httpx.post(server.url + "/mcp", json=_initialize(), headers=headers, timeout=30)
           for _ in range(4)]
    assert [r.status_code for r in got] == [200, 200, 429, 429]
    assert int(got[2].headers["retry-after"]) >= 1 and got[2].json()["error"]["kind"] == "rate"


def test_a_revoked_token_loses_mcp(server):
    import subprocess

    from conftest import CORRAL

    tok = server.token("gone")

    async def body(c):
        return len((await c.list_tools()).tools)

    assert _session(server.url, tok, body) > 5
    subprocess.run([CORRAL, "token", "revoke", "gone", "--state-dir", server.state],
                   check=True, capture_output=True)
    r = httpx.post(server.url + "/mcp", json=_initialize(), timeout=30,
                   headers={**MCP_HEADERS, "Authorization": f"Bearer {tok}"})
    assert r.status_code == 401
