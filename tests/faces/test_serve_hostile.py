"""Holes a red-team pass found in `corral serve`, each held here against real parts: uvicorn
in a subprocess on 127.0.0.1, live namespace-tier sandboxes, tokens made with
`corral token`. A token revoked and made again under the same name is a new token that
never reaches the old one's sandboxes; file names that are not UTF-8 (the sandbox made
them) are listed, read and removed through their escaped form on REST, MCP and E2B,
never a 500 or a broken stream; a run_code frame with a lone surrogate ends no stream."""

import asyncio
import json
import subprocess

import pytest
from conftest import CORRAL, tier_unavailable
from servefix import Serve
from servefix import api_error as _err

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Serve(tmp_path_factory.mktemp("serve-hostile"), "--mcp")
    s.tokens = {"a": s.token("a")}
    s.start()
    yield s
    s.stop()


def _mcp(url, token, body):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=120) as http:
            async with Client(streamable_http_client(url + "/mcp", http_client=http)) as c:
                return await body(c)

    return asyncio.run(asyncio.wait_for(main(), 300))


# -- tokens: owned by the token, not its name -----------------------------------------------
def test_a_token_made_again_under_a_revoked_name_never_reaches_the_old_sandboxes(server):
    old = server.token("reused")
    with server.http(old) as h:
        r = h.post("/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert h.post(f"/sandboxes/{sid}/exec", json={"argv": [
            "sh", "-c", "echo mine > /scratch/f"]}).json()["verdict"] == "ok"
    out = subprocess.run([CORRAL, "token", "revoke", "reused", "--state-dir", server.state],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    new = server.token("reused")
    assert new != old
    with server.http(new) as h:
        assert h.get("/sandboxes").json()["sandboxes"] == []
        for method, path, body in (
                ("GET", f"/sandboxes/{sid}", None),
                ("POST", f"/sandboxes/{sid}/exec", {"argv": ["cat", "/scratch/f"]}),
                ("GET", f"/sandboxes/{sid}/files", None),
                ("DELETE", f"/sandboxes/{sid}", None)):
            r = h.request(method, path, json=body, params={"path": "/scratch/f"})
            _err(r, 404, "not_found")
        # its own sandboxes are its own, as any token's
        r = h.post("/sandboxes", json={})
        assert r.status_code == 201, r.text
        mine = r.json()["id"]
        assert [s["id"] for s in h.get("/sandboxes").json()["sandboxes"]] == [mine]
        assert h.delete(f"/sandboxes/{mine}").status_code == 200

    async def body(c):
        r = await c.call_tool("read_file", {"path": "/scratch/f", "sandbox_id": sid})
        k = await c.call_tool("kill_sandbox", {"sandbox_id": sid})
        return r, k
    r, k = _mcp(server.url, new, body)
    assert r.is_error and "no sandbox" in r.content[0].text, r.content
    assert k.is_error, k.content
    # the old sandbox still runs, untouched (its token is revoked: no one reaches it
    # until its timeout ends it)
    with server.http(server.tokens["a"]) as h:
        assert h.get("/health").json()["sandboxes"] >= 1


# -- run_code: a lone surrogate from the interpreter --------------------------------------
#: a frame written straight to the runner's own stream (sandboxed code can find it), its
#: text a lone surrogate in a JSON escape; and node's own output, which has them as is
FORGED = r'''
import gc, os, struct
out = [o for o in gc.get_objects() if isinstance(o, type) and o.__name__ == "State"
       and hasattr(o, "out_fd")][0].out_fd
b = b'{"type":"stdout","text":"forged \\udcff \\ud800 end\\n"}'
os.write(out, struct.pack(">I", len(b)) + b)
print("after")
'''
NODE = "console.log('a\\udcffb'); throw new Error('bad \\udcff name')"


def _strict(text: str) -> str:
    text.encode("utf-8")          # raises on a lone surrogate
    return text


@pytest.mark.parametrize("language,code", [("python", FORGED), ("javascript", NODE)])
def test_a_lone_surrogate_from_the_interpreter_is_replaced_never_a_500(server, language,
                                                                        code):
    with server.http(server.tokens["a"]) as h:
        sid = h.post("/sandboxes", json={}).json()["id"]
        try:
            body = {"code": code, "language": language}
            r = h.post(f"/sandboxes/{sid}/run_code", json=body)
            assert r.status_code == 200, r.text
            _strict(r.content.decode("utf-8"))
            ex = r.json()
            out = "".join(ex["logs"]["stdout"])
            assert _strict(out) == ("forged \ufffd \ufffd end\nafter\n" if language == "python"
                                    else "a\ufffdb\n"), out
            # streamed: every line whole, the end line last
            r = h.post(f"/sandboxes/{sid}/run_code", json=body, params={"stream": "ndjson"})
            lines = [json.loads(_strict(x)) for x in r.content.decode("utf-8").splitlines()]
            assert lines[-1]["type"] == "end", lines
            if language == "javascript":
                assert lines[-1]["data"]["error"]["value"] == "bad \ufffd name"
            # the context lives on
            r = h.post(f"/sandboxes/{sid}/run_code", json={"code": "1 + 1",
                                                          "language": language})
            assert r.json()["results"][0]["text"] == "2", r.text
        finally:
            h.delete(f"/sandboxes/{sid}")
