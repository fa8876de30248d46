"""What a token's terminals (WS /sandboxes/{id}/pty) may hold of the server, for real:
`corral serve` under uvicorn in a subprocess, namespace-tier live sandboxes, the SDK's
WebSocket client. A terminal is one of the token's operations in flight (max_concurrent),
and an open terminal holds none of the server's shared worker threads (anyio's pool of
40, which every sync route and every other token's work needs), neither while its
command runs nor while its command does not read the input it was sent."""

import httpx
import pytest
from conftest import tier_unavailable
from servefix import Server, procs_with, until

from corral import client

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

#: anyio's default thread limiter: the worker threads run_in_threadpool shares
POOL = 40


def at_once(fn, n: int = POOL + 1) -> None:
    """`fn` in n threads started together; back when all have returned."""
    import threading

    threads = [threading.Thread(target=fn) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def others_still_answered(server, seconds: float) -> None:
    """Another token's sync route (GET /metrics) answers within `seconds` (bounded for a
    hang: a server whose worker threads are all held never answers)."""
    with server.http(server.tokens["other"]) as http:
        r = http.get("/metrics", timeout=httpx.Timeout(seconds))
    assert r.status_code == 200 and "corral_sandboxes_live" in r.text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-term")
    with Server(tmp, tokens=["a", "other", ("one", "--max-concurrent", "1")]) as s:
        yield s


def test_a_terminal_counts_against_max_concurrent(server):
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["one"]) as sb:
        term = sb.pty.create(80, 24, "sleep 1101.5")
        try:
            until(lambda: procs_with("1101.5"), "the first terminal's command runs")
            with pytest.raises(client.RateLimited, match="max_concurrent|concurrent"):
                sb.pty.create(80, 24, "sleep 1102.5")
            assert not procs_with("1102.5")
        finally:
            term.kill()
            term.wait(60)
        # its slot is given back with its end
        again = sb.pty.create(80, 24, "echo back-$((1+1))")
        assert "back-2" in again.wait(60).stdout


def test_open_terminals_leave_the_servers_worker_threads_to_others(server):
    """POOL + 1 terminals of one token, half of them sent input their command never
    reads: another token's sync route (GET /metrics) still answers, as does a new
    terminal."""
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        terms = []
        try:
            for i in range(POOL + 1):
                terms.append(sb.pty.create(80, 24, f"stty raw -echo; exec sleep 1200.{i}"))
            until(lambda: all(procs_with(f"1200.{i}") for i in range(POOL + 1)),
                  "every terminal's command runs")
            for t in terms[::2]:     # the pty's and the pipe's buffers fill; then it waits
                t.send_input(b"x" * (256 << 10))
            others_still_answered(server, 60)
            last = sb.pty.create(80, 24, "echo still-$((2+2))")
            assert "still-4" in last.wait(60).stdout
        finally:
            for t in terms:
                t.kill()
            for t in terms:
                t.wait(60)


@pytest.mark.slow      # 6-15 s: in the slow group, which CI runs too
def test_writes_to_a_stdin_nobody_reads_leave_the_servers_worker_threads_to_others(server):
    """A background command that never reads its stdin (the sandbox's code decides that)
    and POOL + 1 writes to it at once, each more than a pipe holds, the clients giving up:
    another token's sync route still answers; the writes are not lost threads of the
    pool. A second write while one waits is refused (409) rather than queued."""
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        c = sb.commands.run("exec sleep 1300.5", background=True)
        until(lambda: procs_with("1300.5"), "the command runs")
        url = f"{server.url}/sandboxes/{sb.id}/commands/{c.pid}/stdin"
        big = "y" * (256 << 10)
        answers = []

        def write():
            try:
                r = httpx.post(url, json={"data": big}, timeout=5,
                               headers={"Authorization": f"Bearer {server.tokens['a']}"})
                answers.append(r.status_code)
            except httpx.TimeoutException:
                answers.append("gave up")

        at_once(write)
        others_still_answered(server, 60)
        assert answers.count(409) >= POOL - 1, answers
        c.kill()


@pytest.mark.slow      # 6-15 s: in the slow group, which CI runs too
def test_cells_that_run_long_leave_the_servers_worker_threads_to_others(server):
    """POOL + 1 cells at once (POST run_code without a stream) that run as long as the
    sandbox's code likes, the clients giving up: another token's sync route still
    answers."""
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        sb.run_code("x = 1", timeout=60)       # the interpreter is up
        url = f"{server.url}/sandboxes/{sb.id}/run_code"

        def cell():
            try:
                httpx.post(url, json={"code": "import time; time.sleep(1500.5)"},
                           timeout=5,
                           headers={"Authorization": f"Bearer {server.tokens['a']}"})
            except httpx.TimeoutException:
                pass

        at_once(cell)
        others_still_answered(server, 30)   # before: the pool was held while cells ran


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A server holding at most 2 open terminals (every token's, both faces), its tokens
    without max_concurrent."""
    from e2bfix import e2b_serve

    tmp = tmp_path_factory.mktemp("serve-term-cap")
    (tmp / "corral.toml").write_text("[server]\nmax_terminals = 2\n")
    s = e2b_serve(tmp, {"a": [], "b": []}, "[base]\n",
                  args=("--config", str(tmp / "corral.toml")))
    yield s
    s.stop()


def raw_terminal(server, sid: str, token: str, cmd: str):
    """The WebSocket of WS /sandboxes/{sid}/pty as any client opens it (websockets)."""
    from urllib.parse import quote

    from websockets.sync.client import connect

    return connect(f"{server.url.replace('http', 'ws', 1)}/sandboxes/{sid}/pty?"
                   f"cmd={quote(cmd)}", additional_headers={"Authorization":
                                                            f"Bearer {token}"},
                   open_timeout=60)


def test_open_terminals_are_bounded_for_the_whole_server(capped, monkeypatch):
    """Tokens without max_concurrent: their terminals together stop at the server's
    max_terminals (429, field max_terminals, Retry-After), over the REST and E2B faces
    alike; a terminal's end (killed, or its client gone) gives its place back."""
    from websockets.exceptions import InvalidStatus

    e2b = pytest.importorskip("e2b")
    from e2bfix import e2b_env

    a, b = capped.tokens["a"], capped.tokens["b"]
    with client.Sandbox.create({}, api_url=capped.url, api_key=a) as sa, \
            client.Sandbox.create({}, api_url=capped.url, api_key=b) as sb:
        t1 = sa.pty.create(80, 24, "sleep 1601.5")
        gone = raw_terminal(capped, sa.id, a, "sleep 1602.5")
        until(lambda: procs_with("1601.5") and procs_with("1602.5"), "both terminals run")
        with pytest.raises(client.RateLimited, match="max_terminals") as ei:
            sb.pty.create(80, 24, "sleep 1603.5")      # another token: the server's bound
        assert ei.value.field == "max_terminals" and ei.value.retry_after >= 1
        with pytest.raises(InvalidStatus) as raw:
            raw_terminal(capped, sb.id, b, "sleep 1603.5")
        assert raw.value.response.status_code == 429
        assert int(raw.value.response.headers["Retry-After"]) >= 1
        e2b_env(capped, monkeypatch, "b")             # E2B's terminals count the same
        with e2b.Sandbox.create(timeout=120) as es:
            with pytest.raises(Exception, match="max_terminals"):
                es.pty.create(e2b.PtySize(rows=24, cols=80))
            assert not procs_with("1603.5")
            t1.kill()                                  # an end gives its place back
            t1.wait(60)
            et = es.pty.create(e2b.PtySize(rows=24, cols=80))
            with pytest.raises(client.RateLimited, match="max_terminals"):
                sb.pty.create(80, 24, "sleep 1603.5")
            es.pty.kill(et.pid)
            with pytest.raises(e2b.CommandExitException):
                et.wait()
        gone.close()                                   # a client gone gives it back too
        until(lambda: not procs_with("1602.5"), "the gone client's terminal ends")
        with capped.http(a) as http:     # every place given back: none counted twice
            until(lambda: "corral_terminals_open 0\n" in http.get("/metrics").text,
                  "no terminal is counted open")
        both = [sb.pty.create(80, 24, f"echo two-$((2*{i}))") for i in range(2)]
        assert [t.wait(60).stdout.strip() for t in both] == ["two-0", "two-2"]
