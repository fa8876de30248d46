"""`corral mcp` over stdio, driven by the official MCP SDK's client: the tools and their
schemas, code and commands in a real namespace sandbox, a file written and read back, a
request beyond the server's policy refused, and every sandbox gone with the session."""

import asyncio

import pytest
from conftest import CORRAL, procs_mentioning, tier_unavailable

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

TOOLS = {"create_sandbox", "run_command", "run_code", "read_file", "write_file", "list_files",
         "explain_policy", "get_changes", "recent_denials", "kill_sandbox"}


def _session(args, body):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def main():
        async with Client(StdioServerParameters(command=CORRAL, args=["mcp", *args])) as c:
            return await body(c)

    return asyncio.run(asyncio.wait_for(main(), 300))


def test_tools_and_their_schemas():
    async def body(c):
        return {t.name: t for t in (await c.list_tools()).tools}

    tools = _session([], body)
    assert set(tools) == TOOLS
    rc = tools["run_command"].input_schema
    assert rc["required"] == ["command"]
    assert "seconds" in rc["properties"]["timeout"]["description"]
    assert tools["run_code"].input_schema["properties"]["language"]["enum"] == [
        "python", "javascript", "bash"]
    assert tools["list_files"].input_schema["properties"]["depth"]["maximum"] == 8
    for t in tools.values():
        assert len(t.description) > 30, t.name
        assert "ctx" not in t.input_schema.get("properties", {}), t.name
    # nothing that applies changes to the host or widens a policy
    assert not {n for n in tools if "apply" in n or "allow" in n or "widen" in n}


def test_run_code_files_and_a_refusal(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[limits]\nmemory = "256M"\n')
    marker = f"corral-mcp-{tmp_path.name}"

    async def body(c):
        out = {}
        r = await c.call_tool("run_code", {"code": "import sys\nx = 6 * 7\nx"})
        out["code"] = r.structured_content
        r = await c.call_tool("run_code", {"code": "x + 1"})
        out["again"] = r.structured_content
        r = await c.call_tool("write_file", {"path": "/scratch/m.txt", "content": marker})
        assert not r.is_error, r.content
        r = await c.call_tool("run_command", {"command": "cat /scratch/m.txt; echo; id -u"})
        out["cmd"] = r.structured_content
        r = await c.call_tool("read_file", {"path": "/scratch/m.txt"})
        out["read"] = r.structured_content
        r = await c.call_tool("list_files", {"path": "/scratch"})
        out["ls"] = r.structured_content
        r = await c.call_tool("create_sandbox", {"policy": {"limits": {"memory": "1G"}}})
        out["refused"] = (r.is_error, r.content[0].text)
        r = await c.call_tool("create_sandbox", {"policy": {"network": {
            "mode": "allow", "allow": ["example.com"]}}})
        out["refused_net"] = (r.is_error, r.content[0].text)
        r = await c.call_tool("explain_policy", {})
        out["explain"] = r.structured_content
        r = await c.call_tool("create_sandbox", {})
        sid = r.structured_content["sandbox_id"]
        r = await c.call_tool("run_command", {"command": "cat /scratch/m.txt",
                                              "sandbox_id": sid})
        out["other"] = r.structured_content
        r = await c.call_tool("kill_sandbox", {"sandbox_id": sid})
        r = await c.call_tool("run_command", {"command": "true", "sandbox_id": sid})
        out["killed"] = r.is_error
        # a command that lingers, to see the session's end end it
        r = await c.call_tool("run_command", {"command": f"echo {marker}-live"})
        return out

    out = _session(["--policy", str(policy)], body)
    assert out["code"]["results"][0]["text"] == "42" and out["code"]["error"] is None
    assert out["again"]["results"][0]["text"] == "43"
    assert out["cmd"]["stdout"].split()[0] == marker
    assert out["cmd"]["verdict"] == "ok"
    assert out["read"]["content"] == marker
    assert [e["name"] for e in out["ls"]["entries"]] == ["m.txt"]
    is_error, text = out["refused"]
    assert is_error and "limits.memory" in text
    is_error, text = out["refused_net"]
    assert is_error and "network.mode" in text
    assert out["explain"]["runs"] is True
    assert out["other"]["verdict"] == "error"          # another sandbox: not the file
    assert out["killed"] is True
    assert procs_mentioning(marker) == []


PNG_CELL = """import struct, zlib
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
PNG = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 0, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(b'\\x00\\x00')) + chunk(b'IEND', b''))
class Picture:
    def _repr_png_(self):
        return PNG
Picture()
"""

FETCH = ("import urllib.request as u, urllib.error as e\n"
         "try:\n    u.urlopen('http://denied.invalid/', timeout=30)\n"
         "except e.HTTPError as x:\n    print(x.code)\n")


def test_images_changes_and_denials(tmp_path):
    """run_code's image results come back as MCP image content; get_changes shows the
    workspace's changes for review (the host's files untouched); recent_denials names
    what the policy refused and the rule that would allow it."""
    import base64

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    policy = tmp_path / "p.toml"
    policy.write_text(f'[filesystem]\nworkspace = {{ path = "{ws}", mode = "review" }}\n'
                      '[network]\nmode = "allow"\nallow = ["allowed.invalid"]\n')
    pol = {"filesystem": {"workspace": {"path": str(ws), "mode": "review"}},
           "network": {"mode": "allow", "allow": ["allowed.invalid"]}}
    if tier_unavailable("namespace", pol):
        pytest.skip(tier_unavailable("namespace", pol))

    async def body(c):
        out = {}
        r = await c.call_tool("run_code", {"code": PNG_CELL})
        out["image"] = [(x.type, getattr(x, "mime_type", None), getattr(x, "data", None))
                        for x in r.content]
        out["png"] = r.structured_content["results"][0].get("png")
        r = await c.call_tool("run_command", {"command": (
            "echo new > /workspace/a.txt; echo hi > /workspace/b.txt")})
        assert r.structured_content["verdict"] == "ok", r.structured_content
        r = await c.call_tool("get_changes", {})
        out["changes"] = r.structured_content["changes"]
        out["changes_text"] = r.content[0].text
        await c.call_tool("write_file", {"path": "/scratch/fetch.py", "content": FETCH})
        r = await c.call_tool("run_command", {"command": "python3 /scratch/fetch.py"})
        out["fetch"] = r.structured_content["stdout"]
        r = await c.call_tool("recent_denials", {})
        out["denials"] = r.structured_content["denials"]
        # the session's own sandbox, seen from the host: its scratch, while it lives
        await c.call_tool("write_file", {"path": f"/scratch/{owned}", "content": "x"})
        out["scratch"] = glob.glob(f"{base_dir()}/*/scratch/home/{owned}")
        return out

    import glob

    from corral.linux.rundir import base_dir

    owned = f"owned-{tmp_path.name}"
    out = _session(["--policy", str(policy)], body)
    assert len(out["scratch"]) == 1, out["scratch"]
    assert glob.glob(f"{base_dir()}/*/scratch/home/{owned}") == []   # gone with the session
    kinds = [k for k, _, _ in out["image"]]
    assert kinds == ["text", "image"], out["image"]
    _, mime, data = out["image"][1]
    assert mime == "image/png" and base64.b64decode(data).startswith(b"\x89PNG")
    assert data == out["png"]
    got = {c["path"]: c for c in out["changes"]}
    assert got["a.txt"]["kind"] == "modified" and "+new" in got["a.txt"]["diff"]
    assert got["b.txt"]["kind"] == "added"
    assert "modified a.txt" in out["changes_text"]
    assert (ws / "a.txt").read_text() == "old\n" and not (ws / "b.txt").exists()
    assert out["fetch"] == "403\n"
    (d,) = out["denials"]
    assert (d["kind"], d["host"]) == ("net", "denied.invalid")
    assert d["would_allow"] == 'network.allow += ["denied.invalid:80"]'


def test_get_changes_without_a_review_workspace_says_how(tmp_path):
    async def body(c):
        r = await c.call_tool("get_changes", {})
        return r.is_error, r.content[0].text

    is_error, text = _session([], body)
    assert is_error and "review" in text


def test_a_stdio_session_holds_at_most_max_sandboxes(tmp_path):
    """`corral mcp --max-sandboxes 2`: the session's own sandbox and one more; a third
    create_sandbox is refused naming the option, and after a kill there is room again."""
    async def body(c):
        out = {}
        r = await c.call_tool("run_command", {"command": "true"})   # the session's own
        out["own"] = r.structured_content["verdict"]
        r = await c.call_tool("create_sandbox", {})
        second = r.structured_content["sandbox_id"]
        r = await c.call_tool("create_sandbox", {})
        out["third"] = (r.is_error, r.content[0].text)
        await c.call_tool("kill_sandbox", {"sandbox_id": second})
        r = await c.call_tool("create_sandbox", {})
        out["after_kill"] = (r.is_error, (r.structured_content or {}).get("sandbox_id"))
        return out

    out = _session(["--max-sandboxes", "2"], body)
    assert out["own"] == "ok"
    is_error, text = out["third"]
    assert is_error and "max_sandboxes" in text and "--max-sandboxes" in text, text
    assert out["after_kill"][0] is False and out["after_kill"][1]


@pytest.mark.parametrize("value", ["0", "-3", "many", "100001"])
def test_a_bad_max_sandboxes_is_one_line_naming_it(value):
    import subprocess

    p = subprocess.run([CORRAL, "mcp", "--max-sandboxes", value], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-sandboxes" in lines[0], p.stderr


@pytest.mark.slow
def test_a_call_on_an_existing_sandbox_needs_no_worker_thread():
    """run_command and run_code on a sandbox that exists look it up on the event loop
    (service/mcp.py, existing) and run in a thread of their own: with every one of anyio's
    shared worker threads held (by other sync work), they still answer. Before, each call
    first waited for one of those threads for the lookup. In-process server, real sandbox."""
    import anyio
    from mcp import Client

    from corral.service.mcp import build

    server, registry = build()

    async def main():
        async with Client(server) as c:
            r = await c.call_tool("run_command", {"command": "true"})   # makes the sandbox
            assert not r.is_error, r.content
            (sid,) = [e.id for e in registry.all()]
            limiter = anyio.to_thread.current_default_thread_limiter()
            holders = [object() for _ in range(int(limiter.total_tokens))]
            for h in holders:
                await limiter.acquire_on_behalf_of(h)
            try:
                got = []
                for args in ({"command": "echo 1"}, {"command": "echo 2", "sandbox_id": sid}):
                    r = await asyncio.wait_for(c.call_tool("run_command", args), 20)
                    got.append(r.structured_content["stdout"].strip())
            finally:
                for h in holders:
                    limiter.release_on_behalf_of(h)
            return got

    try:
        assert asyncio.run(asyncio.wait_for(main(), 120)) == ["1", "2"]
    finally:
        registry.close_all()
