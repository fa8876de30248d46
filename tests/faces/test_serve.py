"""`corral serve` for real: uvicorn in a subprocess on 127.0.0.1, tokens made with
`corral token`, real namespace-tier sandboxes behind it, spoken to with httpx and the SDK
(corral.client)."""

import asyncio
import json
import os
import signal
import stat
import subprocess

import httpx
import pytest
from conftest import CORRAL, tier_unavailable
from servefix import Server
from servefix import api_error as _err
from servefix import make_token as _token

from corral import client
from corral.runtime.files import FileNotFound

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


SECRET = "s3cr3t-value-never-on-the-wire"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    ceiling = tmp / "ceiling.toml"
    ceiling.write_text('[network]\nmode = "allow"\nallow = ["*.example.com"]\n'
                       '[limits]\nmemory = "256M"\n')
    sec = tmp / "secret.toml"
    sec.write_text('[network]\nmode = "allow"\nallow = ["api.example.com"]\n'
                   '[secrets.GH]\nfrom = "env:CORRAL_TEST_SECRET"\nhosts = ["api.example.com"]\n')
    with Server(tmp, env={"CORRAL_TEST_SECRET": SECRET},
                tokens=["a", "b", ("net", "--ceiling", str(ceiling)),
                        ("one", "--max-sandboxes", "1"), ("busy", "--max-concurrent", "1"),
                        ("sec", "--ceiling", str(sec))]) as s:
        yield s


def _create(http, policy=None):
    r = http.post("/sandboxes", json={"policy": policy or {}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_health_and_openapi_need_no_token_metrics_does(server):
    """/health, /openapi.json and /docs answer without a token; /metrics (issue 17: every
    other route) is 401 without a valid one, and a Prometheus scrape's bearer token
    gets the text format (docs/service.md's scrape config)."""
    with server.http() as h:
        assert h.get("/health").json()["ok"] is True
        doc = h.get("/openapi.json").json()
        assert doc["openapi"].startswith("3.1")
        for path in ("/sandboxes", "/sandboxes/{sid}", "/sandboxes/{sid}/exec",
                     "/sandboxes/{sid}/files", "/sandboxes/{sid}/files/list",
                     "/sandboxes/{sid}/run_code", "/sandboxes/{sid}/explain", "/explain"):
            assert path in doc["paths"], path
        assert doc["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]
        assert "401" in doc["paths"]["/metrics"]["get"]["responses"]
        assert "security" not in doc["paths"]["/health"]["get"]
        assert h.get("/docs").status_code == 200
        _err(h.get("/metrics"), 401, "auth", "authorization")
        _err(h.get("/metrics", headers={"Authorization": "Bearer corral_" + "x" * 43}),
             401, "auth", "authorization")
    with server.http(server.tokens["a"]) as h:
        m = h.get("/metrics")
        assert m.status_code == 200 and "corral_sandboxes_live" in m.text
        assert m.headers["content-type"].startswith("text/plain; version=0.0.4")


def _metrics(h) -> dict[str, float]:
    """GET /metrics as {'name{labels}': value}, checking the text format on the way."""
    out = {}
    for line in h.get("/metrics").text.splitlines():
        if line.startswith("# TYPE "):
            assert line.split()[3] in ("gauge", "counter", "histogram"), line
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


FETCH_DENIED = ("import urllib.request as u, urllib.error as e\n"
                "try:\n    u.urlopen('http://denied.invalid/', timeout=30)\n"
                "except e.HTTPError as x:\n    print(x.code)\n")


def test_metrics_count_runs_by_verdict_denials_by_kind_and_latency(server):
    """/metrics (issue 17): runs by verdict, denials by kind (a limit that stopped a
    command, a connection the proxy refused), the run latency histogram."""
    with server.http(server.tokens["net"]) as h:
        before = _metrics(h)
        sid = _create(h, {"network": {"mode": "allow", "allow": ["a.example.com"]}})
        try:
            r = h.post(f"/sandboxes/{sid}/exec", json={"cmd": "sleep 30", "timeout": 0.5})
            assert r.json()["verdict"] == "timeout", r.text
            r = h.post(f"/sandboxes/{sid}/exec", json={"argv": ["python3", "-c",
                                                               FETCH_DENIED]})
            assert r.json()["stdout"] == "403\n", r.text
            assert any(e["kind"] == "net" and e.get("decision") == "deny"
                       for e in r.json()["events"]), r.json()["events"]
        finally:
            h.delete(f"/sandboxes/{sid}")
        after = _metrics(h)

    def grew(name):
        return after.get(name, 0) - before.get(name, 0)

    assert grew('corral_runs_total{verdict="timeout"}') == 1
    assert grew('corral_runs_total{verdict="ok"}') >= 1
    assert grew('corral_denials_total{kind="limit"}') >= 1
    assert grew('corral_denials_total{kind="net"}') >= 1
    assert grew("corral_run_seconds_count") >= 2
    assert grew('corral_run_seconds_bucket{le="+Inf"}') == grew("corral_run_seconds_count")
    # the timed-out run took at least its 0.5 s: not in the buckets below that
    assert grew('corral_run_seconds_bucket{le="0.25"}') < grew("corral_run_seconds_count")
    assert grew("corral_run_seconds_sum") >= 0.5


@pytest.mark.parametrize("auth", [None, "Bearer", "Bearer corral_wrong", "Basic abc",
                                  "Bearer " + "corral_" + "x" * 43])
def test_no_or_wrong_token_is_401(server, auth):
    headers = {"Authorization": auth} if auth else {}
    for method, path in (("GET", "/sandboxes"), ("POST", "/sandboxes"),
                         ("GET", "/sandboxes/sb_0/files?path=x"), ("POST", "/explain")):
        r = httpx.request(method, server.url + path, headers=headers, json={}, timeout=30)
        _err(r, 401, "auth", "authorization")
        assert r.headers["www-authenticate"] == "Bearer"


def test_a_revoked_token_is_401(server):
    tok = _token(server.state, "gone")
    with server.http(tok) as h:
        assert h.get("/sandboxes").status_code == 200
        subprocess.run([CORRAL, "token", "revoke", "gone", "--state-dir", server.state],
                       check=True, capture_output=True)
        _err(h.get("/sandboxes"), 401, "auth")


def _lean(h) -> int:
    for line in h.get("/metrics").text.splitlines():
        if line.startswith("corral_http_lean_exec_total "):
            return int(line.split()[1])
    raise AssertionError("no corral_http_lean_exec_total in /metrics")


def test_the_lean_exec_path_and_what_it_leaves_to_fastapi(server):
    """A foreground exec with a well-formed body and a valid token is answered by the
    lean path (service/fastexec.py), with the route's Result; a bad body or token goes on
    to FastAPI's route and gets its documented error; errors after the token's check
    (another token's sandbox, bad base64 stdin) are the app's own shapes."""
    with server.http(server.tokens["a"]) as a, server.http(server.tokens["b"]) as b:
        sid = _create(a)
        try:
            n = _lean(a)
            r = a.post(f"/sandboxes/{sid}/exec", json={
                "argv": ["/bin/sh", "-c", "read x; echo \"$x $V\"; pwd; exit 3"],
                "stdin": "aGk=", "stdin_encoding": "base64", "env": {"V": "v"},
                "cwd": "/tmp", "timeout": 30})
            assert r.status_code == 200, r.text
            got = r.json()
            assert (got["exit_code"], got["stdout"]) == (3, "hi v\n/tmp\n"), got
            assert a.post(f"/sandboxes/{sid}/exec?stream=none",
                          json={"cmd": "echo ok"}).json()["stdout"] == "ok\n"
            assert _lean(a) == n + 2
            # FastAPI's answers, untouched by the lean path
            _err(a.post(f"/sandboxes/{sid}/exec", json={"cmd": "true", "nope": 1}), 422)
            _err(a.post(f"/sandboxes/{sid}/exec", json={"cmd": "true", "timeout": 0}), 422)
            _err(a.post(f"/sandboxes/{sid}/exec", json={"cmd": "true", "timeout": True}),
                 422)
            _err(a.post(f"/sandboxes/{sid}/exec", json={"argv": []}), 422)
            _err(a.post(f"/sandboxes/{sid}/exec", json={"cmd": "a", "argv": ["b"]}), 400)
            _err(a.post(f"/sandboxes/{sid}/exec", content=b"{not json",
                        headers={"content-type": "application/json"}), 422)
            _err(httpx.post(f"{server.url}/sandboxes/{sid}/exec", json={"cmd": "true"}),
                 401, "auth")
            _err(httpx.post(f"{server.url}/sandboxes/{sid}/exec", json={"cmd": "true"},
                            headers={"Authorization": "Bearer corral_nope"}), 401, "auth")
            assert _lean(a) == n + 2
            # after the token's check: answered on the lean path, the app's error bodies
            _err(b.post(f"/sandboxes/{sid}/exec", json={"cmd": "true"}), 404, "not_found")
            _err(a.post(f"/sandboxes/{sid}/exec", json={"cmd": "cat", "stdin": "%%",
                                                        "stdin_encoding": "base64"}), 400)
            assert _lean(a) == n + 4
        finally:
            a.delete(f"/sandboxes/{sid}")


def _counter(h, name: str) -> int:
    for line in h.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_lean_exec_is_started_and_watched_by_the_event_loop(server):
    """With its entrant ready, a namespace-tier sandbox's foreground command on the lean
    path is started and watched by the event loop, no thread (service/commands.py,
    CommandHandle._watch_on): its Result is a thread's (output, exit code, the output
    cap, a timeout, an exec that failed), and the sandbox's next command runs."""
    import time

    with server.http(server.tokens["a"]) as a:
        sid = _create(a, {"limits": {"output": "1K"}})
        try:
            def ex(**body):
                time.sleep(0.1)              # the next entrant is ready
                r = a.post(f"/sandboxes/{sid}/exec", json=body)
                assert r.status_code == 200, r.text
                return r.json()

            n = _counter(a, "corral_http_lean_exec_loop_total")
            r = ex(cmd="read x; echo \"$x\"; echo err >&2; exit 4", stdin="in")
            assert (r["verdict"], r["exit_code"], r["stdout"], r["stderr"]) == \
                ("error", 4, "in\n", "err\n"), r
            r = ex(cmd="head -c 5000 /dev/zero | tr '\\0' x")
            assert (r["stdout"], r["stdout_truncated"]) == ("x" * 1024, True), r
            t = time.monotonic()
            r = ex(argv=["sleep", "30"], timeout=0.3)
            assert r["verdict"] == "timeout" and time.monotonic() - t < 10, r
            r = ex(argv=["/no/such/program"])
            assert r["exit_code"] == 127 and "/no/such/program" in r["stderr"], r
            r = ex(cmd="echo $((6*7))")
            assert (r["verdict"], r["stdout"]) == ("ok", "42\n"), r
            assert _counter(a, "corral_http_lean_exec_loop_total") >= n + 4
            cmds = a.get(f"/sandboxes/{sid}/commands").json()["commands"]
            assert not [c for c in cmds if c["running"]], cmds
        finally:
            a.delete(f"/sandboxes/{sid}")


#: inside: a connection to the egress proxy, held by a child after the command's exit
HOLD_PROXY = """
import os, socket, time
host, port = os.environ["http_proxy"].split("//")[1].rstrip("/").rsplit(":", 1)
s = socket.create_connection((host, int(port)))
if os.fork() == 0:
    fd = os.open("/dev/null", os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    time.sleep(3)
    os._exit(0)
print("held", flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_a_lean_exec_whose_proxy_connection_outlives_it(server):
    """A command the event loop watches whose connection to the egress proxy is still
    open at its end: its Result waits for the proxy (at most netlog.NET_WAIT_S) in a
    thread, not on the loop, and comes back whole; the server goes on answering."""
    import time

    with server.http(server.tokens["net"]) as h:
        sid = _create(h, {"network": {"mode": "allow", "allow": ["api.example.com"]}})
        try:
            time.sleep(0.2)                  # the next entrant is ready
            n = _counter(h, "corral_http_lean_exec_loop_total")
            r = h.post(f"/sandboxes/{sid}/exec",
                       json={"argv": ["/usr/bin/python3", "-c", HOLD_PROXY]})
            assert r.status_code == 200, r.text
            assert (r.json()["verdict"], r.json()["stdout"]) == ("ok", "held\n"), r.json()
            assert _counter(h, "corral_http_lean_exec_loop_total") == n + 1
            assert h.get("/health").json()["ok"] is True
            time.sleep(0.1)
            r = h.post(f"/sandboxes/{sid}/exec", json={"cmd": "echo next"})
            assert r.json()["stdout"] == "next\n", r.json()
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_a_foreground_commands_run_is_counted_before_its_result_is_answered(server):
    """The run's metrics (on_end) and its command.ended event are in before the waiters
    wake (service/commands.py _finished): a client holding the Result sees them."""
    with server.http(server.tokens["a"]) as h:
        sid = _create(h)
        try:
            for i in range(15):
                before = _metrics(h).get('corral_runs_total{verdict="ok"}', 0)
                r = h.post(f"/sandboxes/{sid}/exec", json={"cmd": "true"})
                assert r.json()["verdict"] == "ok", r.text
                assert _metrics(h)['corral_runs_total{verdict="ok"}'] == before + 1
                ev = h.get(f"/sandboxes/{sid}/events", params={"follow": "false"})
                assert ev.text.count("command.ended") == i + 1, ev.text[-500:]
        finally:
            h.delete(f"/sandboxes/{sid}")


def _one_answer(port: int, request: bytes) -> tuple[bytes, int]:
    """`request` sent on a new loopback connection: (the whole answer, by its
    Content-Length; how many TCP segments with data it came in: tcp_info's
    tcpi_data_segs_in, Linux 4.6+)."""
    import socket
    import struct

    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536) or b""
        head, _, body = got.partition(b"\r\n\r\n")
        n = next(int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                 if k.strip().lower() == b"content-length")
        while len(body) < n:
            body += s.recv(65536)
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(info) < 156:
        pytest.skip("this kernel's tcp_info has no tcpi_data_segs_in")
    return head + b"\r\n\r\n" + body, struct.unpack_from("I", info, 152)[0]


def test_an_answer_goes_out_in_one_segment(server):
    """uvicorn writes the status line and headers, then the body: two sends, two
    segments, the client woken twice (service/wire.py joins them). A lean exec's Result, a
    FastAPI route's answer and an error each arrive in one segment with data."""
    tok = server.tokens["a"]
    with server.http(tok) as a:
        sid = _create(a)
        try:
            body = json.dumps({"cmd": "echo hi"}).encode()
            for req in (
                    f"POST /sandboxes/{sid}/exec HTTP/1.1\r\nHost: x\r\nAuthorization: "
                    f"Bearer {tok}\r\nContent-Type: application/json\r\nContent-Length: "
                    f"{len(body)}\r\n\r\n".encode() + body,
                    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                    f"GET /sandboxes/{sid} HTTP/1.1\r\nHost: x\r\nAuthorization: "
                    f"Bearer {tok}\r\n\r\n".encode(),
                    b"GET /sandboxes/nope HTTP/1.1\r\nHost: x\r\n\r\n"):
                answer, segments = _one_answer(server.port, req)
                assert answer.split(b" ", 2)[1] in (b"200", b"401"), answer
                assert segments == 1, (req.split(b"\r\n")[0], segments)
            answer, _ = _one_answer(server.port, req)
            assert b'"kind":"auth"' in answer.replace(b" ", b"")
        finally:
            a.delete(f"/sandboxes/{sid}")


def test_joined_writes_hold_a_turn_and_no_more_than_hold_max():
    """service/wire.Joined on a real loopback connection: a small write waits for the
    loop's turn to end, the writes of one turn arrive together, and writes that reach
    HOLD_MAX go to the transport at once (its flow control bounds the memory, as
    without Joined)."""
    import socket

    from corral.service.wire import HOLD_MAX, Joined

    async def main():
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as ls:
            t, _ = await loop.create_connection(asyncio.Protocol, *ls.getsockname())
            peer, _ = ls.accept()
        with peer:
            peer.setblocking(False)
            j = Joined(t, loop)
            j.write(b"head ")
            j.write(memoryview(b"body"))
            with pytest.raises(BlockingIOError):
                peer.recv(100)               # held until the turn ends
            assert j.get_write_buffer_size() == 9
            await asyncio.sleep(0)
            await asyncio.sleep(0.05)
            assert peer.recv(100) == b"head body"
            big = b"x" * (HOLD_MAX // 2)
            j.write(big)
            j.write(big)                     # HOLD_MAX reached: sent now, not held
            assert j.get_write_buffer_size() == t.get_write_buffer_size()
            await asyncio.sleep(0.05)
            got = b""
            while len(got) < HOLD_MAX:
                got += peer.recv(HOLD_MAX)
            assert got == big + big
            j.write(b"last")
            j.close()                        # what is held goes before the close
            await asyncio.sleep(0.05)
            peer.setblocking(True)
            assert peer.recv(100) == b"last" and peer.recv(100) == b""

    asyncio.run(main())


def test_another_tokens_sandbox_is_404(server):
    with server.http(server.tokens["a"]) as a, server.http(server.tokens["b"]) as b:
        sid = _create(a)
        try:
            _err(b.get(f"/sandboxes/{sid}"), 404, "not_found")
            _err(b.post(f"/sandboxes/{sid}/exec", json={"cmd": "true"}), 404)
            _err(b.get(f"/sandboxes/{sid}/files", params={"path": "/etc/hostname"}), 404)
            _err(b.delete(f"/sandboxes/{sid}"), 404)
            assert sid not in [s["id"] for s in b.get("/sandboxes").json()["sandboxes"]]
            # and it is still a's, alive
            assert a.post(f"/sandboxes/{sid}/exec", json={"cmd": "echo $((6*7))"}).json()[
                "stdout"] == "42\n"
        finally:
            a.delete(f"/sandboxes/{sid}")


def test_another_tokens_sandbox_is_404_on_every_route(server):
    """Every operation of the document on a sandbox of another token answers exactly as
    for a sandbox that does not exist (404 naming the sandbox, or a 400 or 422 about the
    body before any lookup), and touches nothing: a's sandbox runs on unchanged."""
    with server.http(server.tokens["a"]) as a, server.http(server.tokens["b"]) as b:
        sid = _create(a)
        try:
            a.post(f"/sandboxes/{sid}/exec", json={"cmd": "echo kept > /scratch/k"})
            doc = b.get("/openapi.json").json()
            n = 0
            for path, item in doc["paths"].items():
                if "{sid}" not in path:
                    continue
                url = path.replace("{pid}", "1").replace("{cid}", "c1")
                for method in item:
                    got = []
                    for s_ in (sid, "0123456789ab"):
                        got.append(b.request(method.upper(), url.replace("{sid}", s_),
                                             json={}, params={"path": "/scratch/k"}))
                    theirs, none = got
                    assert theirs.status_code in (400, 404, 422), (method, path, theirs.text)
                    assert theirs.status_code == none.status_code, (method, path)
                    assert theirs.text.replace(sid, "0123456789ab") == none.text, (
                        method, path, theirs.text, none.text)
                    if theirs.status_code == 404:
                        _err(theirs, 404, "not_found", "sandbox_id")
                        n += 1
            assert n >= 20
            assert a.post(f"/sandboxes/{sid}/exec", json={"cmd": "cat /scratch/k"}).json()[
                "stdout"] == "kept\n"
        finally:
            a.delete(f"/sandboxes/{sid}")


@pytest.mark.parametrize("policy,field", [
    ({"network": {"mode": "allow", "allow": ["evil.com"]}}, "network.allow"),
    ({"network": {"mode": "allow", "allow_private": ["10.0.0.0/8"]}}, "network.allow_private"),
    ({"network": {"mode": "allow"}, "secrets": {"GH": {"hosts": ["x.example.com"]}}},
     "secrets.GH"),
    ({"filesystem": {"workspace": {"path": "/tmp"}}}, "filesystem.workspace"),
    ({"limits": {"memory": "1G"}}, "limits.memory"),
    ({"isolation": "process"}, "isolation"),
])
def test_beyond_the_ceiling_is_403_naming_the_rule(server, policy, field):
    with server.http(server.tokens["net"]) as h:
        _err(h.post("/sandboxes", json={"policy": policy}), 403, "ceiling", field)
        assert h.get("/sandboxes").json()["sandboxes"] == []   # nothing was made


def test_within_the_ceiling_takes_its_limits(server):
    with server.http(server.tokens["net"]) as h:
        r = h.post("/sandboxes", json={"policy": {"network": {"mode": "allow",
                                                               "allow": ["a.example.com"]}}})
        assert r.status_code == 201, r.text
        try:
            assert r.json()["policy"]["limits"]["memory"] == "256M"
        finally:
            h.delete(f"/sandboxes/{r.json()['id']}")


def test_bad_requests_are_json_errors(server):
    with server.http(server.tokens["a"]) as h:
        _err(h.post("/sandboxes", json={"policy": {"limits": {"memory": "lots"}}}), 400,
             "policy", "limits.memory")
        _err(h.post("/sandboxes", json={"nope": 1}), 422, "invalid")
        _err(h.post("/sandboxes", content=b"{not json", headers={
            "content-type": "application/json"}), 422)
        _err(h.get("/nowhere"), 404)


def test_conflicts_are_409_json_errors(server):
    """409, on the wire: a background command still running past a wait's timeout, its
    stdin written after it was closed."""
    with server.http(server.tokens["a"]) as h:
        sid = _create(h)
        try:
            r = h.post(f"/sandboxes/{sid}/exec", json={"cmd": "cat; sleep 60",
                                                       "background": True})
            assert r.status_code == 201, r.text
            pid = r.json()["pid"]
            _err(h.get(f"/sandboxes/{sid}/commands/{pid}/wait", params={"timeout": 0.2}),
                 409, "running", "timeout")
            r = h.post(f"/sandboxes/{sid}/commands/{pid}/stdin", json={"close": True})
            assert r.status_code == 200 and r.json()["closed"] is True, r.text
            _err(h.post(f"/sandboxes/{sid}/commands/{pid}/stdin", json={"data": "late"}),
                 409, "closed", "pid")
            # a sandbox that ended by itself (its init killed from inside) is forgotten: 404
            r = h.post(f"/sandboxes/{sid}/exec", json={"cmd": "kill -KILL -1; sleep 5"})
            assert r.json()["verdict"] == "killed", r.text
            _err(h.post(f"/sandboxes/{sid}/exec", json={"cmd": "true"}), 404, "not_found")
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_an_image_the_server_does_not_have_is_422_not_a_server_error(server):
    with server.http(server.tokens["a"]) as h:
        for path in ("/sandboxes", "/explain"):
            _err(h.post(path, json={"policy": {"image": "no-such-image"}}), 422, "image",
                 "image")
        assert h.get("/sandboxes").json()["sandboxes"] == []
    # the SDK raises the class corral.Sandbox.create raises in-process
    from corral.errors import ImageError

    with pytest.raises(ImageError, match="no image named 'no-such-image'"):
        client.Sandbox.create({"image": "no-such-image"}, api_url=server.url,
                              api_key=server.tokens["a"])
    assert "Traceback" not in server.log.read_text()


def test_max_sandboxes_is_429_with_retry_after(server):
    with server.http(server.tokens["one"]) as h:
        sid = _create(h)
        try:
            r = h.post("/sandboxes", json={"policy": {}})
            _err(r, 429, "rate", "max_sandboxes")
            assert int(r.headers["retry-after"]) > 0
        finally:
            h.delete(f"/sandboxes/{sid}")
        h.delete(f"/sandboxes/{_create(h)}")   # room again once one is killed


def test_a_body_over_the_cap_is_413_and_writes_nothing(server):
    with server.http(server.tokens["a"]) as h:
        sid = _create(h)
        try:
            big = "x" * (17 << 20)
            r = h.put(f"/sandboxes/{sid}/files", json={"path": "/scratch/big", "content": big})
            _err(r, 413, "too_large", "body")
            _err(h.get(f"/sandboxes/{sid}/files", params={"path": "/scratch/big"}), 404,
                 "files")
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_tokens_are_hashed_on_disk_and_in_no_log(server):
    path = os.path.join(server.state, "service", "tokens.json")
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    with open(path) as f:
        raw = f.read()
    data = json.loads(raw)
    import hashlib

    for tok in server.tokens.values():
        assert tok not in raw and tok[7:] not in raw
        assert hashlib.sha256(tok.encode()).hexdigest() in [t["sha256"] for t in
                                                            data["tokens"]]
    with server.http(server.tokens["a"]) as h:   # make sure the log has requests in it
        h.get("/sandboxes")
    log = server.log.read_text()
    assert "GET /sandboxes" in log
    for tok in server.tokens.values():
        assert tok not in log and tok[7:] not in log


def test_sdk_round_trip(server, monkeypatch):
    monkeypatch.setenv("CORRAL_API_URL", server.url)
    monkeypatch.setenv("CORRAL_API_KEY", server.tokens["a"])
    with client.Sandbox.create(policy={"limits": {"timeout": "30s"}}) as sb:
        r = sb.commands.run("echo hello; echo oops >&2; exit 3")
        assert (r.verdict, r.exit_code, r.stdout, r.stderr) == ("error", 3, "hello\n", "oops\n")
        assert sb.exec(["cat"], stdin="fed").stdout == "fed"
        sb.files.write("/scratch/notes/a.txt", "kept between calls")
        sb.files.write("/scratch/bin.dat", b"\x00\xff")
        assert sb.files.read("/scratch/notes/a.txt") == "kept between calls"
        assert sb.files.read("/scratch/bin.dat", format="bytes") == b"\x00\xff"
        assert sb.exec("cat /scratch/notes/a.txt").stdout == "kept between calls"
        names = {e.name for e in sb.files.list("/scratch/notes")}
        assert names == {"a.txt"}
        assert sb.run_code("x = 6 * 7\nx").text == "42"
        assert sb.run_code("x + 1").text == "43"             # the interpreter persists
        assert sb.run_code("1/0").error.name == "ZeroDivisionError"
        with pytest.raises(FileNotFound):
            sb.files.read("/scratch/none")
        assert sb.id in [s["id"] for s in client.Sandbox.list()]
        again = client.Sandbox.connect(sb.id)
        assert again.exec("echo $HOME").stdout.strip() == "/scratch"
        again._http.close()
        sid = sb.id
    with pytest.raises(client.NotFound):
        client.Sandbox.connect(sid)             # killed at the end of `with`


def test_sdk_errors_are_corrals_classes(server):
    with pytest.raises(client.AuthError) as e:
        client.Sandbox.create(api_url=server.url, api_key="corral_nope")
    assert e.value.status == 401
    with pytest.raises(client.CeilingError) as e:
        client.Sandbox.create(policy={"isolation": "process"}, api_url=server.url,
                              api_key=server.tokens["a"])
    assert e.value.field == "isolation"
    from corral.errors import PolicyError

    with pytest.raises(PolicyError):
        client.Sandbox.create(policy={"limits": {"memory": -1}}, api_url=server.url,
                              api_key=server.tokens["a"])


def test_async_sdk_round_trip(server):
    async def main():
        async with await client.AsyncSandbox.create(api_url=server.url,
                                                    api_key=server.tokens["b"]) as sb:
            await sb.files.write("/scratch/x", "async")
            assert await sb.files.read("/scratch/x") == "async"
            assert (await sb.exec("cat /scratch/x")).stdout == "async"
            assert (await sb.run_code("'a' * 3")).text == "'aaa'"
            assert [e.name for e in await sb.files.list("/scratch")] == ["x"]

    asyncio.run(main())


def test_the_sandbox_behind_the_service_is_one(server):
    """A command run through the service is contained like `corral run`'s: no network, a
    read-only root, nothing of the server's environment."""
    with client.Sandbox.create(api_url=server.url, api_key=server.tokens["a"]) as sb:
        r = sb.exec(["/bin/sh", "-c", "touch /etc/x; echo $?; env | grep -c CORRAL_; "
                     "cat /proc/net/dev | grep -c :"])
        touched, corral_env, links = r.stdout.split()
        assert touched != "0" and corral_env == "0" and links == "1"   # lo only


def test_sigterm_kills_every_sandbox(tmp_path):
    s = Server(tmp_path, tokens=["t"]).start()
    with s.http(s.tokens["t"]) as h:
        sid = _create(h)
        marker = f"corral-serve-test-{os.getpid()}-{sid}"
        r = h.post(f"/sandboxes/{sid}/exec", json={"cmd": f"echo {marker}"})
        assert r.json()["stdout"].strip() == marker
        assert h.get("/health").json()["sandboxes"] == 1
    s.stop()
    # uvicorn re-raises the SIGTERM it drained on: systemd counts that as a clean stop
    assert s.proc.returncode in (0, -signal.SIGTERM), s.log.read_text()
    assert "1 sandbox(es) killed" in s.log.read_text()


def test_max_concurrent_is_429_with_retry_after(server):
    """max-concurrent 1: while one command of the token runs, another (in another of its
    sandboxes) is 429."""
    import threading

    with server.http(server.tokens["busy"]) as h, server.http(server.tokens["busy"]) as h2:
        a, b = _create(h), _create(h)
        try:
            first = {}

            def long():
                # 3 s: time enough for a probe below to meet the held slot (each is one
                # round trip on loopback); the probe may hold the one slot a moment itself
                for _ in range(1000):
                    first["r"] = h.post(f"/sandboxes/{a}/exec", json={"cmd": "sleep 3"})
                    if first["r"].status_code != 429:
                        return

            t = threading.Thread(target=long)
            t.start()
            refused = None
            while t.is_alive() and refused is None:   # bounded by the long command's life
                r = h2.post(f"/sandboxes/{b}/exec", json={"cmd": "true"})
                if r.status_code == 429:
                    refused = r
            t.join()
            assert refused is not None, f"no 429 while a command ran: {first}"
            _err(refused, 429, "rate", "max_concurrent")
            assert int(refused.headers["retry-after"]) > 0
            assert first["r"].status_code == 200 and first["r"].json()["verdict"] == "ok"
        finally:
            h.delete(f"/sandboxes/{a}")
            h.delete(f"/sandboxes/{b}")


def test_explain_answers_the_three_questions(server):
    """POST /explain (a policy asked for, within the token's ceiling) and GET
    /sandboxes/{sid}/explain (a sandbox's own): what it sees, where it connects, which
    credentials; beyond the ceiling is 403 as for a create, and nothing is made."""
    want = {"network": {"mode": "allow", "allow": ["api.example.com"]},
            "secrets": {"GH": {"hosts": ["api.example.com"]}}}
    with server.http(server.tokens["sec"]) as h:
        r = h.post("/explain", json={"policy": want})
        assert r.status_code == 200, r.text
        x = r.json()
        assert x["runs"] is True and x["tier"] == "namespace" and x["workspace"] is None
        assert x["network"]["default_closed"] is True
        assert x["network"]["reachable"] == ["api.example.com (via the egress proxy)"]
        (cred,) = x["credentials"]
        assert cred["name"] == "GH" and "only to api.example.com" in cred["how"]
        assert SECRET not in r.text and "CORRAL_TEST_SECRET" not in r.text
        assert {"rule", "enforced_by"} <= set(x["rules"][0])
        _err(h.post("/explain", json={"policy": {"network": {"mode": "allow",
                                                             "allow": ["evil.com"]}}}),
             403, "ceiling", "network.allow")
        assert h.get("/sandboxes").json()["sandboxes"] == []
        r = h.post("/sandboxes", json={"policy": want})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            got = h.get(f"/sandboxes/{sid}/explain").json()
            assert got == x
        finally:
            h.delete(f"/sandboxes/{sid}")
    with server.http(server.tokens["a"]) as h:   # the default ceiling: no network at all
        x = h.post("/explain", json={}).json()
        assert x["network"]["reachable"] == [] and x["credentials"] == []


def test_secret_values_never_cross_the_api(server):
    with server.http(server.tokens["sec"]) as h:
        r = h.post("/sandboxes", json={"policy": {
            "network": {"mode": "allow", "allow": ["api.example.com"]},
            "secrets": {"GH": {"hosts": ["api.example.com"]}}}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            assert r.json()["policy"]["secrets"] == {"GH": {"hosts": ["api.example.com"],
                                                            "ttl": "900s",
                                                            "plain_http": False}}
            assert SECRET not in r.text and "CORRAL_TEST_SECRET" not in r.text
            for path in (f"/sandboxes/{sid}", "/sandboxes", f"/sandboxes/{sid}/explain"):
                got = h.get(path).text
                assert SECRET not in got and "CORRAL_TEST_SECRET" not in got, path
            ex = h.post(f"/sandboxes/{sid}/exec", json={"cmd": "echo $GH; env"}).json()
            assert ex["verdict"] == "ok" and ex["stdout"].split()[0]   # a placeholder
            assert SECRET not in json.dumps(ex)
            # a request naming the value or a source of its own: refused, nothing made
            for table in ({"value": SECRET, "hosts": ["api.example.com"]},
                          {"from": "env:HOME", "hosts": ["api.example.com"]}):
                _err(h.post("/sandboxes", json={"policy": {
                    "network": {"mode": "allow", "allow": ["api.example.com"]},
                    "secrets": {"GH": table}}}), 400, "policy", "secrets.GH")
            assert len(h.get("/sandboxes").json()["sandboxes"]) == 1
        finally:
            h.delete(f"/sandboxes/{sid}")


def test_streamed_output_arrives_before_the_command_ends(server):
    """The command waits (up to its timeout) for a file that only the first chunk of its
    output, seen by the client, makes: it ends "ok" only if that chunk arrived while it
    ran."""
    with client.Sandbox.create(api_url=server.url, api_key=server.tokens["a"]) as sb:
        other = client.Sandbox.connect(sb.id, api_url=server.url, api_key=server.tokens["a"])
        seen = []

        def on_stdout(data):
            seen.append(data)
            if len(seen) == 1:
                other.files.write("/scratch/go", "")

        r = sb.commands.run("echo first; while [ ! -e /scratch/go ]; do sleep 0.05; done; "
                            "echo second >&2; echo third", timeout=60, on_stdout=on_stdout,
                            on_stderr=lambda b: seen.append(b"err:" + b))
        other._http.close()
        assert r.verdict == "ok", r
        assert b"".join(s for s in seen if not s.startswith(b"err:")) == b"first\nthird\n"
        assert b"err:second\n" in seen and r.stdout == "first\nthird\n"


def test_the_loops_start_of_a_command_never_waits_for_a_busy_sandbox():
    """Commands._begin (the event loop's start of a foreground command) never waits for
    the sandbox's lock: while another thread holds it (a command starting in a thread,
    an entrant being forked, the sandbox's end) it starts nothing and returns None, and
    the service runs that command in a thread instead; once the lock is free it sends
    the request, and the command runs."""
    import threading
    import time

    from livefix import loop_run

    import corral

    if os.geteuid() != 0:
        pytest.skip("needs root: a live namespace sandbox")
    sb = corral.Sandbox.create({"isolation": "namespace"}, timeout=60)
    try:
        assert sb.commands.run("true").verdict == "ok"
        held, release = threading.Event(), threading.Event()

        def hold():
            with sb._lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(10)
        got = []
        begin = threading.Thread(target=lambda: got.append(sb.commands._begin(["/bin/true"])))
        begin.start()
        begin.join(5)
        waited = begin.is_alive()
        release.set()
        holder.join()
        begin.join(30)
        assert not waited, "_begin waited for the sandbox's lock"
        assert got == [None]
        time.sleep(0.2)                      # the next entrant is ready
        r = loop_run(sb, ["/bin/echo", "hi"])
        assert (r.verdict, r.stdout) == ("ok", "hi\n"), r
    finally:
        sb.kill()
