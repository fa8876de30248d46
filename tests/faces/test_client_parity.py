"""The SDK does what the in-process API does, for real (issue 17: one import changes):
output callbacks get the command's bytes on both sides (non-UTF-8 output and a sequence
split between writes included), and the parameters the SDK gained for parity (run_code's
env, create_context's engine, the terminal's env and argv, send_stdin's timeout,
send_signal, exec's callbacks) reach the sandbox. A real `corral serve` on loopback
(tests/fixtures/servefix.py's Server), namespace-tier sandboxes."""

import asyncio
import base64
import json
import time

import httpx
import pytest
from conftest import tier_unavailable
from servefix import Server

import corral
from corral import client
from corral.runtime.session import ContextError

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

#: bytes that are not UTF-8 (ff fe), then an é split between two writes, apart in time
SPLIT = ("printf '\\377\\376h\\303'; sleep 0.2; printf '\\251llo'; "
         "printf 'e\\377' >&2")
WANT_OUT, WANT_ERR = b"\xff\xfeh\xc3\xa9llo", b"e\xff"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("client-parity"), tokens=["a"]) as s:
        yield s


@pytest.fixture
def sb(server):
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as s:
        yield s


def _collect():
    out, err = [], []
    return out, err, out.append, err.append


def test_output_callbacks_get_bytes_in_process_and_over_the_sdk(sb):
    """The same command, the same callbacks: bytes on both sides, byte for byte; and a
    run_code cell's callbacks get str on both sides."""
    with corral.Sandbox.create({}) as local:
        lo, le, on_lo, on_le = _collect()
        r_local = local.commands.run(SPLIT, on_stdout=on_lo, on_stderr=on_le, timeout=60)
        cell_local = []
        local.run_code("print('cell-out')", on_stdout=cell_local.append, timeout=60)
    cell_remote = []
    sb.run_code("print('cell-out')", on_stdout=cell_remote.append, timeout=60)
    # a cell's output is text on both sides (E2B's shape): str chunks, the same text
    assert cell_local and all(type(c) is str for c in cell_local + cell_remote)
    assert "".join(cell_local) == "".join(cell_remote) == "cell-out\n"
    ro, re_, on_ro, on_re = _collect()
    r_remote = sb.commands.run(SPLIT, on_stdout=on_ro, on_stderr=on_re, timeout=60)
    for chunks in (lo, le, ro, re_):
        assert chunks and all(type(c) is bytes for c in chunks), chunks
    assert b"".join(lo) == b"".join(ro) == WANT_OUT
    assert b"".join(le) == b"".join(re_) == WANT_ERR
    assert r_local.stdout == r_remote.stdout == WANT_OUT.decode("utf-8", "replace")
    # exec(on_stdout=) too, and a background command's follower
    seen = []
    assert sb.exec(["printf", "\\377x"], on_stdout=seen.append).verdict == "ok"
    assert b"".join(seen) == b"\xffx" and all(type(c) is bytes for c in seen)
    bo, be, on_bo, on_be = _collect()
    h = sb.commands.run(SPLIT, background=True, on_stdout=on_bo, on_stderr=on_be)
    assert h.wait(60).verdict == "ok"
    assert b"".join(bo) == WANT_OUT and b"".join(be) == WANT_ERR


def test_the_wire_keeps_text_by_default_and_base64_on_request(server, sb):
    """Without output_encoding the NDJSON stream is text as before (the E2B face and other
    clients unchanged); with it, base64 of the bytes; a raw-kept command's output asked
    for as text is decoded across chunks (the split é comes whole)."""
    h = {"Authorization": f"Bearer {server.tokens['a']}"}
    url = f"{server.url}/sandboxes/{sb.id}"

    def lines(method, path, **kw):
        with httpx.stream(method, url + path, headers=h, timeout=60, **kw) as r:
            assert r.status_code in (200, 201), r.read()
            return [json.loads(x) for x in r.iter_lines() if x]

    text = lines("POST", "/exec", params={"stream": "ndjson"}, json={"cmd": SPLIT})
    assert "".join(x.get("stdout", "") for x in text) == "\ufffd\ufffdhéllo"
    raw = lines("POST", "/exec", params={"stream": "ndjson"},
                json={"cmd": SPLIT, "output_encoding": "base64"})
    assert b"".join(base64.b64decode(x["stdout"]) for x in raw if "stdout" in x) == WANT_OUT
    assert raw[-1]["result"]["stdout"] == "\ufffd\ufffdhéllo"
    bg = httpx.post(url + "/exec", headers=h, timeout=60, json={
        "cmd": SPLIT, "background": True, "output_encoding": "base64"}).json()
    pid = bg["pid"]
    httpx.get(f"{url}/commands/{pid}/wait", headers=h, timeout=60).raise_for_status()
    as_text = lines("GET", f"/commands/{pid}/output", params={"encoding": "utf-8"})
    assert "".join(x.get("stdout", "") for x in as_text) == "\ufffd\ufffdhéllo"
    assert "".join(x.get("stderr", "") for x in as_text) == "e\ufffd"
    as_raw = lines("GET", f"/commands/{pid}/output")       # its own: base64
    assert b"".join(base64.b64decode(x["stdout"]) for x in as_raw
                    if "stdout" in x) == WANT_OUT


def test_run_code_env_and_create_context_engine(sb):
    ex = sb.run_code("import os\nos.environ.get('PARITY_X')", env={"PARITY_X": "x-42"},
                     timeout=60)
    assert ex.error is None and ex.text == "'x-42'", (ex.error, ex.text)
    assert sb.run_code("import os\n'PARITY_X' in os.environ").text == "False"   # put back
    with pytest.raises(ContextError):
        sb.run_code("echo $X", language="bash", env={"X": "1"})
    ctx = sb.create_context("python", engine="runner")
    assert sb.run_code("6*7", context=ctx).text == "42"
    with pytest.raises(client.ApiError) as e:
        sb.create_context("python", engine="nope")
    assert e.value.status == 422


def test_pty_env_and_an_argv_command(sb):
    term = sb.pty.create(80, 24, "echo foo=$PARITY_FOO", env={"PARITY_FOO": "bar-42"})
    assert term.pid_inside == term.pid and term.pid
    assert "foo=bar-42" in term.wait(60).stdout
    term = sb.pty.create(80, 24, ["printf", "%s|", "a b", "c"])
    assert "a b|c|" in term.wait(60).stdout


def test_send_signal_send_stdin_timeout_and_a_broken_pipe(sb):
    out = []
    h = sb.commands.run("trap 'echo got-term; exit 3' TERM; echo ready; "
                        "while :; do sleep 0.05; done", background=True,
                        on_stdout=out.append)
    for _ in range(1200):             # the trap is set once "ready" shows (not timed)
        if b"ready" in b"".join(out):
            break
        time.sleep(0.05)
    assert h.send_signal(15) is True
    r = h.wait(60)
    assert (r.exit_code, r.stdout) == (3, "ready\ngot-term\n"), r
    assert h.send_signal(15) is False               # it has exited
    # a command that never reads its stdin: the pipe fills, the write gives up
    h = sb.commands.run(["sleep", "1000"], background=True)
    with pytest.raises(TimeoutError):
        h.send_stdin(b"x" * (1 << 20), timeout=0.5)
    h.kill()
    h.wait(60)
    h = sb.commands.run("cat", background=True)
    h.close_stdin()
    h.close_stdin()                                  # again: a no-op, as in-process
    assert h.wait(60).verdict == "ok"
    with pytest.raises(BrokenPipeError):
        h.send_stdin(b"late")


def test_the_async_twin_gets_bytes_env_and_engine(server):
    async def main():
        async with await client.AsyncSandbox.create(
                {}, api_url=server.url, api_key=server.tokens["a"]) as sb:
            out = []
            r = await sb.commands.run(SPLIT, on_stdout=out.append, timeout=60)
            assert r.verdict == "ok" and b"".join(out) == WANT_OUT
            assert all(type(c) is bytes for c in out)
            ex = await sb.run_code("import os\nos.environ['PARITY_Y']",
                                   env={"PARITY_Y": "y"})
            assert ex.text == "'y'"
            ctx = await sb.create_context(engine="runner")
            assert (await sb.run_code("1+1", context=ctx)).text == "2"
            term = await sb.pty.create(80, 24, "echo v=$PARITY_V", env={"PARITY_V": "w"})
            assert "v=w" in (await term.wait(60)).stdout
            h = await sb.commands.run("cat", background=True)
            await h.close_stdin()
            await h.wait(60)
            with pytest.raises(BrokenPipeError):
                await h.send_stdin(b"late")
            assert await h.send_signal(15) is False
        await sb.close()          # after the end of `async with`: a no-op
    asyncio.run(main())


def test_user_account_and_commands_as_the_user(server, sb):
    """create(user_account=True) and commands.run(user="user"), as in-process: uid 1000
    inside with its own HOME; root stays root; a sandbox without the account refuses
    user="user" with in-process's UsageError."""
    from corral.errors import UsageError

    with client.Sandbox.create({}, user_account=True, api_url=server.url,
                               api_key=server.tokens["a"]) as acc:
        r = acc.commands.run("id -u; echo $HOME", user="user")
        assert (r.verdict, r.stdout) == ("ok", "1000\n/home/user\n"), r
        assert acc.commands.run("id -u").stdout == "0\n"
        h = acc.commands.run(["id", "-u"], user="user", background=True)
        assert h.wait(60).stdout == "1000\n"
    with pytest.raises(UsageError):
        sb.commands.run("id -u", user="user")
