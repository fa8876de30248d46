"""Holes a red-team pass found in `corral serve`, each held here against real parts: uvicorn
in a subprocess on 127.0.0.1, live namespace-tier sandboxes, tokens made with
`corral token`. A token revoked and made again under the same name is a new token that
never reaches the old one's sandboxes; file names that are not UTF-8 (the sandbox made
them) are listed, read and removed through their escaped form on REST, MCP and E2B,
never a 500 or a broken stream; a run_code frame with a lone surrogate ends no stream."""

import asyncio
import json
import os
import subprocess

import httpx
import pytest
from conftest import CORRAL, tier_unavailable
from servefix import Server
from servefix import api_error as _err

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-hostile")
    (tmp / "ws").mkdir()
    (tmp / "review.toml").write_text(f'[filesystem.workspace]\npath = "{tmp / "ws"}"\n'
                                     'mode = "review"\n')
    with Server(tmp, "--mcp", tokens=["a", ("human", "--ceiling", str(tmp / "review.toml"),
                                            "--apply-changes")]) as s:
        s.ws = tmp / "ws"
        yield s


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


# -- file names that are not UTF-8 ----------------------------------------------------------
#: made by the sandbox: the bytes 0xff 0xfe; "a", 0xff, "b"; a name shaped like the quoted
#: form itself; a directory named with 0xc3 (half of a UTF-8 character) holding a file
MAKE = ("mkdir -p /scratch/d && cd /scratch/d && printf 1 > $'\\xff\\xfe' && "
        "printf 2 > $'a\\xffb' && printf 3 > '\"q\"' && mkdir $'\\xc3' && "
        "printf 4 > $'\\xc3/in'")
WIRE = {'"\\xff\\xfe"': "1", '"a\\xffb"': "2", '"\\"q\\""': "3", '"\\xc3"/in': "4"}


@pytest.fixture
def odd(server):
    """A sandbox whose /scratch/d holds names that are not UTF-8; its id."""
    with server.http(server.tokens["a"]) as h:
        sid = h.post("/sandboxes", json={}).json()["id"]
        r = h.post(f"/sandboxes/{sid}/exec", json={"argv": ["bash", "-c", MAKE]})
        assert r.json()["verdict"] == "ok", r.text
        yield h, sid
        h.delete(f"/sandboxes/{sid}")


def test_rest_lists_reads_and_removes_names_that_are_not_utf8(odd):
    h, sid = odd
    base = f"/sandboxes/{sid}/files"
    r = h.get(base + "/list", params={"path": "/scratch/d", "depth": 2})
    assert r.status_code == 200, r.text
    got = {e["path"]: e for e in r.json()["entries"]}
    assert set(got) == {"/scratch/d/" + w for w in WIRE} | {'/scratch/d/"\\xc3"'}, got
    assert got['/scratch/d/"a\\xffb"']["name"] == '"a\\xffb"'
    for w, content in WIRE.items():        # each listed path reads back its own file
        r = h.get(base, params={"path": "/scratch/d/" + w})
        assert r.status_code == 200 and r.json()["content"] == content, (w, r.text)
        assert h.get(base + "/content", params={"path": "/scratch/d/" + w}).content == \
            content.encode()
        assert h.get(base + "/info", params={"path": "/scratch/d/" + w}).json()["path"] \
            == "/scratch/d/" + w
    # a name that is not there, or a quoted form that is not well formed: clear errors
    e = _err(h.get(base, params={"path": '/scratch/d/"\\xfe"'}), 404, "files")
    assert e["field"] == '/scratch/d/"\\xfe"'
    e = _err(h.get(base, params={"path": '/scratch/d/"\\q"'}), 400, "files", "path")
    assert "\\xNN" in e["message"]
    _err(h.get(base, params={"path": '/scratch/d/"\\x2f"'}), 400, "files", "path")
    # written, renamed and removed by the same form
    r = h.put(base, json={"path": '/scratch/d/"new\\xfd"', "content": "5"})
    assert r.status_code == 200 and r.json()["path"] == '/scratch/d/"new\\xfd"', r.text
    r = h.post(base + "/rename", json={"old": '/scratch/d/"new\\xfd"',
                                       "new": '/scratch/d/"re\\xfd"'})
    assert r.status_code == 200 and r.json()["name"] == '"re\\xfd"', r.text
    for w in ['"\\xff\\xfe"', '"re\\xfd"', '"\\xc3"']:
        assert h.delete(base, params={"path": "/scratch/d/" + w}).status_code == 200
    r = h.post(f"/sandboxes/{sid}/exec", json={"argv": ["bash", "-c", "ls /scratch/d | od -An -c"]})
    assert r.json()["stdout"].split() == ['"', "q", '"', "\\n", "a", "377", "b", "\\n"]


def test_rest_watch_streams_a_name_that_is_not_utf8(odd):
    h, sid = odd
    with h.stream("GET", f"/sandboxes/{sid}/files/watch", params={"path": "/scratch/d"},
                  timeout=60) as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["watching"] == "/scratch/d"
        h2 = httpx.Client(base_url=str(h.base_url), headers=h.headers, timeout=60)
        with h2:
            h2.post(f"/sandboxes/{sid}/exec", json={"argv": ["bash", "-c",
                                                             "touch $'/scratch/d/w\\xff'"]})
        for line in lines:
            if line.strip():
                ev = json.loads(line)
                break
    assert (ev["type"], ev["name"], ev["path"]) == ("add", '"w\\xff"', '/scratch/d/"w\\xff"')


def test_changes_of_names_that_are_not_utf8_list_diff_and_apply(server):
    policy = {"filesystem": {"workspace": {"path": str(server.ws), "mode": "review"}}}
    with server.http(server.tokens["human"]) as h:
        r = h.post("/sandboxes", json={"policy": policy})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            r = h.post(f"/sandboxes/{sid}/exec", json={"argv": ["bash", "-c",
                       "cd /workspace && printf 1 > $'\\xff\\xfe' && printf 2 > $'k\\xfd'"]})
            assert r.json()["verdict"] == "ok", r.text
            r = h.get(f"/sandboxes/{sid}/changes")
            assert r.status_code == 200, r.text
            assert {c["path"] for c in r.json()["changes"]} == {'"\\xff\\xfe"', '"k\\xfd"'}
            r = h.get(f"/sandboxes/{sid}/changes/diff", params={"path": '"\\xff\\xfe"'})
            assert r.status_code == 200, r.text
            assert 'diff --git "a/\\377\\376" "b/\\377\\376"' in r.json()["patch"]
            assert "k" not in r.json()["patch"]
            r = h.post(f"/sandboxes/{sid}/changes/apply", json={"paths": ['"\\xff\\xfe"']})
            assert r.status_code == 200 and r.json()["applied"] == ['"\\xff\\xfe"'], r.text
            assert os.listdir(os.fsencode(server.ws)) == [b"\xff\xfe"]
            _err(h.post(f"/sandboxes/{sid}/changes/apply", json={"paths": ['"\\xf"']}),
                 400, "files", "paths.0")
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_mcp_lists_and_reads_names_that_are_not_utf8(server, odd):
    h, sid = odd

    async def body(c):
        ls = await c.call_tool("list_files", {"path": "/scratch/d", "sandbox_id": sid})
        rd = await c.call_tool("read_file", {"path": '/scratch/d/"a\\xffb"',
                                             "sandbox_id": sid})
        bad = await c.call_tool("read_file", {"path": '/scratch/d/"\\xfe"',
                                              "sandbox_id": sid})
        return ls, rd, bad
    ls, rd, bad = _mcp(server.url, server.tokens["a"], body)
    assert not ls.is_error, ls.content
    assert {e["name"] for e in ls.structured_content["entries"]} == {
        '"\\xff\\xfe"', '"a\\xffb"', '"\\"q\\""', '"\\xc3"'}
    assert '/scratch/d/"a\\xffb"' in ls.content[0].text
    assert not rd.is_error and rd.structured_content["content"] == "2", rd.content
    assert bad.is_error and '/scratch/d/"\\xfe"' in bad.content[0].text, bad.content


def test_a_lone_surrogate_sent_in_is_a_400_or_its_byte(server):
    """JSON may escape a lone surrogate; a surrogate escape (U+DC80-U+DCFF) is the byte
    it stands for, any other is refused naming the field: never a 500."""
    with server.http(server.tokens["a"]) as h:
        sid = h.post("/sandboxes", json={}).json()["id"]
        try:
            def post(path, raw):
                return h.post(f"/sandboxes/{sid}/{path}", content=raw,
                              headers={"content-type": "application/json"})
            r = post("exec", '{"argv": ["sh", "-c", "od -An -b; printf %s \\"$V\\" | od -An -b"], '
                             '"stdin": "\\udcfe", "env": {"V": "\\udcff"}}')
            assert r.status_code == 200 and r.json()["stdout"].split() == ["376", "377"], r.text
            _err(post("exec", '{"argv": ["cat"], "stdin": "\\ud800"}'), 400, "invalid", "stdin")
            r = post("exec", '{"argv": ["printf", "%s", "\\udcff"]}')
            assert r.status_code == 200 and r.json()["stdout"] == "\ufffd", r.text
            _err(post("exec", '{"argv": ["printf", "%s", "\\ud800"]}'), 400, "usage", "cmd")
            _err(post("exec", '{"argv": ["true"], "env": {"V": "\\ud800"}}'), 400, "usage",
                 "env")
            _err(post("run_code", '{"language": "bash", "code": "echo \\ud800"}'), 400,
                 "usage", "code")
            r = post("run_code", '{"language": "bash", "code": "printf %s \\udcff | od -An -b"}')
            assert r.json()["logs"]["stdout"] == [" 377\n"], r.text
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_a_lone_surrogate_in_a_commands_cwd_is_a_400_naming_cwd(server):
    """A command's cwd is bytes to the kernel as its argv and env are: a surrogate escape
    is its byte (here a directory that is not there: 400 naming cwd), another lone
    surrogate is refused naming cwd, never a 500 (os.fsencode's UnicodeEncodeError)."""
    with server.http(server.tokens["a"]) as h:
        sid = h.post("/sandboxes", json={}).json()["id"]
        try:
            def post(raw):
                return h.post(f"/sandboxes/{sid}/exec", content=raw,
                              headers={"content-type": "application/json"})
            _err(post('{"argv": ["pwd"], "cwd": "/tmp/\\udcff"}'), 400, "usage", "cwd")
            _err(post('{"argv": ["pwd"], "cwd": "/tmp/\\ud800"}'), 400, "usage", "cwd")
            r = post('{"argv": ["pwd"], "cwd": "/tmp"}')
            assert r.status_code == 200 and r.json()["stdout"] == "/tmp\n", r.text
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_a_lone_surrogate_in_a_files_path_is_a_400_naming_the_field(server):
    """A path sent in JSON may hold a lone surrogate: a surrogate escape (U+DC80-U+DCFF)
    is its byte, another is refused naming the field (it was a UnicodeEncodeError deep in
    the files API: a 500, and for the batch a connection cut)."""
    with server.http(server.tokens["a"]) as h:
        sid = h.post("/sandboxes", json={}).json()["id"]
        try:
            def send(method, path, raw):
                return h.request(method, f"/sandboxes/{sid}/files{path}", content=raw,
                                 headers={"content-type": "application/json"})
            _err(send("PUT", "", '{"path": "/scratch/\\ud800", "content": "x"}'), 400,
                 "files", "path")
            _err(send("POST", "/mkdir", '{"path": "/scratch/a\\udfff"}'), 400, "files", "path")
            _err(send("POST", "/rename", '{"old": "/scratch/x", "new": "/scratch/\\ud800"}'),
                 400, "files", "new")
            _err(send("POST", "/batch", '{"files": [{"path": "/scratch/ok", "content": "1"}, '
                      '{"path": "/scratch/\\udbff", "content": "2"}]}'), 400, "files",
                 "files.1.path")
            r = send("PUT", "", '{"path": "/scratch/\\udcff", "content": "x"}')
            assert r.status_code == 200 and r.json()["path"] == '/scratch/"\\xff"', r.text
            r = h.post(f"/sandboxes/{sid}/exec", json={"argv": ["ls", "-b", "/scratch"]})
            assert r.json()["stdout"] == "\\377\n", r.text      # nothing else was written
        finally:
            h.delete(f"/sandboxes/{sid}")
