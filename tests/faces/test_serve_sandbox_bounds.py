"""What live sandboxes may hold of the host, for real: `corral serve` under uvicorn in a
subprocess, namespace-tier live sandboxes on the host's root, the SDK, E2B's SDK and the
MCP SDK over /mcp. An idle live sandbox holds processes, memory and fds of the host's for
its life; tokens without max_sandboxes (or many tokens with it) must not be able to make
them without end, so the whole server holds at most `[server] max_sandboxes` of them
(every token's and every face's together), and a sandbox gives its place back when it is
killed or times out."""

import asyncio
import os
import signal

import httpx
import pytest
from conftest import tier_unavailable
from servefix import mcp_session, until

from corral import client

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

MOST = 2


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A server holding at most MOST live sandboxes, its tokens without max_sandboxes;
    its E2B template `base` the host's root (nothing to build)."""
    from e2bfix import e2b_serve

    tmp = tmp_path_factory.mktemp("serve-sb-cap")
    (tmp / "corral.toml").write_text(f"[server]\nmax_sandboxes = {MOST}\n")
    s = e2b_serve(tmp, {"a": [], "b": [], "c": [], "one": ["--max-sandboxes", "1"]},
                  "[base]\n",
                  args=("--config", str(tmp / "corral.toml"), "--mcp"))
    yield s
    s.stop()


def metric(server, token: str, name: str) -> int:
    r = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"},
                  timeout=60)
    return int(r.text.split(f"\n{name} ", 1)[1].split("\n", 1)[0])


def live(server, token: str) -> int:
    return metric(server, token, "corral_sandboxes_live")


def bwraps(root: int) -> set[int]:
    """The bwrap processes below `root` (the server: each sandbox's two)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:          # gone meanwhile
            continue
        if stat:
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append((int(d), name))
    out, todo = set(), [root]
    while todo:
        for pid, name in children.get(todo.pop(), []):
            todo.append(pid)
            if name == "bwrap":
                out.add(pid)
    return out


def rest_refused(server, token: str) -> None:
    """POST /sandboxes is 429 with Retry-After, field max_sandboxes, naming the server's."""
    r = httpx.post(f"{server.url}/sandboxes", json={}, timeout=60,
                   headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
    err = r.json()["error"]
    assert err["field"] == "max_sandboxes" and "every token" in err["message"], err


def refused(server, name: str, monkeypatch) -> None:
    """Each way of making one more, on every face, is refused naming max_sandboxes: E2B's
    SDK and its control plane (429 with E2B's {code, message}), the SDK and plain REST
    (429, Retry-After, field), /mcp's create_sandbox and a tool call that would make the
    session's own sandbox."""
    import e2b
    from e2bfix import e2b_env

    token = server.tokens[name]
    e2b_env(server, monkeypatch, name)
    with pytest.raises(e2b.RateLimitException, match="max_sandboxes"):
        e2b.Sandbox.create(timeout=60)
    r = httpx.post(f"{server.url}/v2/sandboxes", json={"templateID": "base"}, timeout=60,
                   headers={"X-API-Key": token})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
    assert r.headers["Should-Retry"] == "false"      # E2B's SDK raises at once
    assert r.json()["code"] == 429 and "max_sandboxes" in r.json()["message"], r.text
    with pytest.raises(client.RateLimited, match="max_sandboxes") as ei:
        client.Sandbox.create({}, api_url=server.url, api_key=token)
    assert ei.value.field == "max_sandboxes" and ei.value.retry_after >= 1
    rest_refused(server, token)

    async def body(c):
        return [await c.call_tool("create_sandbox", {}),
                await c.call_tool("run_command", {"command": "true"})]
    for r in mcp_session(server, token, body):
        assert r.is_error and "max_sandboxes" in r.content[0].text, r
    assert live(server, token) == MOST
    assert metric(server, token, "corral_sandboxes_making") == 0


def test_live_sandboxes_are_bounded_for_the_whole_server(capped, monkeypatch):
    """Tokens a (REST) and b (E2B) fill the server's max_sandboxes; token c, which has
    none, is refused on every face, and so are a and b. A kill gives a place back: one more
    is made (over /mcp), and the next is refused until it is killed; a sandbox that times
    out, and one that dies (its bwrap killed from the host), give their places back too."""
    import e2b
    from e2bfix import e2b_env

    a = capped.tokens["a"]
    sa = client.Sandbox.create({}, api_url=capped.url, api_key=a, timeout=600)
    e2b_env(capped, monkeypatch, "b")
    es = e2b.Sandbox.create(timeout=600)
    try:
        assert live(capped, a) == MOST
        refused(capped, "c", monkeypatch)        # a token that holds none
        rest_refused(capped, a)                   # nor one more for those that do
        rest_refused(capped, capped.tokens["b"])
        sa.kill()                                  # a kill gives its place back
        until(lambda: live(capped, a) == MOST - 1, "the killed one's place")

        async def made(c):              # one more, made over /mcp; then none again
            r = await c.call_tool("create_sandbox", {})
            again = await c.call_tool("create_sandbox", {})
            await asyncio.to_thread(rest_refused, capped, a)
            await c.call_tool("kill_sandbox", {"sandbox_id": r.structured_content[
                "sandbox_id"]})
            return r, again
        r, again = mcp_session(capped, capped.tokens["c"], made)
        assert not r.is_error, r
        assert again.is_error and "max_sandboxes" in again.content[0].text, again
        until(lambda: live(capped, a) == MOST - 1, "the MCP one's place")
        # a sandbox that times out gives its place back
        short = client.Sandbox.create({}, api_url=capped.url, api_key=a, timeout=3)
        with pytest.raises(client.RateLimited, match="max_sandboxes"):
            client.Sandbox.create({}, api_url=capped.url, api_key=capped.tokens["c"])
        until(lambda: live(capped, a) == MOST - 1, "the timed-out one's place")   # in 3 s
        with client.Sandbox.create({}, api_url=capped.url, api_key=a) as again:
            assert again.commands.run("echo yes").stdout.strip() == "yes"
        short.kill()
        # a sandbox that dies (its bwrap killed from the host) gives its place back
        before = bwraps(capped.proc.pid)
        dies = client.Sandbox.create({}, api_url=capped.url, api_key=a)
        rest_refused(capped, capped.tokens["c"])
        for pid in bwraps(capped.proc.pid) - before:
            os.kill(pid, signal.SIGKILL)
        until(lambda: live(capped, a) == MOST - 1, "the dead one's place")
        with client.Sandbox.create({}, api_url=capped.url, api_key=capped.tokens["c"]):
            assert live(capped, a) == MOST
        dies.kill()
    finally:
        es.kill()
        sa.kill()


def test_a_tokens_own_max_sandboxes_over_e2b_is_e2bs_429(capped, monkeypatch):
    """A token's own max_sandboxes over E2B's control plane: 429 with E2B's {code,
    message} and Retry-After, which the SDK raises as RateLimitException (it was a 500)."""
    import e2b
    from e2bfix import e2b_env

    e2b_env(capped, monkeypatch, "one")
    with e2b.Sandbox.create(timeout=120):
        r = httpx.post(f"{capped.url}/v2/sandboxes", json={"templateID": "base"},
                       timeout=60, headers={"X-API-Key": capped.tokens["one"]})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
        assert r.json()["code"] == 429 and "this token" in r.json()["message"], r.text
        with pytest.raises(e2b.RateLimitException, match="max_sandboxes"):
            e2b.Sandbox.create(timeout=60)
