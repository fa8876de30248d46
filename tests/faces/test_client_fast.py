"""The sync SDK's foreground command (and run_code) on a kept-alive connection of its own
(corral/client/_fast.py) against a real `corral serve`: the connection is reused, one the
service closed is not, its errors are the SDK's and httpx's as before, and a call that
gives up closes its connection, so the service kills the command (the disconnect rule)."""

import os
import socket
import threading

import httpx
import pytest
from conftest import CORRAL, tier_unavailable
from servefix import Server, procs_with, until

from corral import client
from corral.client import _fast
from corral.client._common import sync_client

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("serve-fast"), tokens=["a", "gone"]) as s:
        yield s


def _idle(server) -> list:
    return _fast._idle.get((os.getpid(), "http", "127.0.0.1", server.port), [])


def test_a_foreground_command_reuses_one_kept_alive_connection(server):
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        r = sb.commands.run("echo one; echo two >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, "one\n", "two\n"), r
        assert sb._fast, "the fast path applies to the SDK's own client on plain http"
        first = [c.sock.getsockname() for c in _idle(server)]
        assert len(first) == 1
        assert sb.commands.run(["echo", "again"]).stdout == "again\n"
        assert [c.sock.getsockname() for c in _idle(server)] == first


def test_run_code_without_callbacks_goes_on_the_same_connection(server):
    """sb.run_code(code) with no callbacks is a POST of its own on the kept-alive
    connection (the one the commands use), its errors the SDK's own."""
    from corral.runtime.session import ContextError

    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        for c in _idle(server):
            c.close()
        _idle(server).clear()
        ex = sb.run_code("x = 20\nx + 1")
        first = [c.sock.getsockname() for c in _idle(server)]
        assert len(first) == 1, "the cell went on a connection of the fast path"
        assert ex.text == "21" and ex.error is None, ex
        assert sb.run_code("1/0").error.name == "ZeroDivisionError"
        with pytest.raises(ContextError):
            sb.run_code("1", context="ctx_nope")
        assert [c.sock.getsockname() for c in _idle(server)] == first


def test_a_connection_the_service_closed_is_not_reused(server):
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        sb.commands.run("true")
        idle = _idle(server)
        assert idle
        for c in idle:           # the service sees EOF and closes its end
            c.sock.shutdown(socket.SHUT_WR)
        old = [c.sock for c in idle]
        until(lambda: all(_readable(s) for s in old), "the service closed them")
        assert sb.commands.run("echo fresh").stdout == "fresh\n"
        assert all(s.fileno() == -1 for s in old)       # closed, not used
        assert len(_idle(server)) == 1 and _idle(server)[0].sock not in old


def test_a_connection_idle_past_its_expiry_is_not_reused(server, monkeypatch):
    """The client lets an idle connection go before the service would (IDLE_EXPIRY_S,
    as httpx's keepalive_expiry): never a request on one the service is closing."""
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        sb.commands.run("true")
        old = [c.sock for c in _idle(server)]
        assert old
        sb.commands.run("true")
        assert [c.sock for c in _idle(server)] == old      # within the expiry: reused
        monkeypatch.setattr(_fast, "IDLE_EXPIRY_S", 0.0)
        assert sb.commands.run("echo fresh").stdout == "fresh\n"
        assert all(s.fileno() == -1 for s in old)          # expired: closed, not used
        assert len(_idle(server)) == 1 and _idle(server)[0].sock not in old


def _readable(s) -> bool:
    import select

    return bool(select.select([s], [], [], 0)[0])


def test_errors_are_the_sdks_own(server):
    sb = client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"])
    other = client.Sandbox.connect(sb.id, api_url=server.url, api_key=server.tokens["a"])
    sb.kill()
    with pytest.raises(client.NotFound) as e:       # 404 through the fast path
        other.commands.run("true")
    assert e.value.status == 404 and other._fast
    other._http.close()
    with pytest.raises(RuntimeError):     # a killed Sandbox's client is closed: as httpx
        sb.commands.run("true")
    gone = client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["gone"])
    import subprocess

    subprocess.run([CORRAL, "token", "revoke", "gone", "--state-dir", server.state],
                   check=True, capture_output=True)
    with pytest.raises(client.AuthError) as e:
        gone.commands.run("true")
    assert e.value.status == 401
    gone._http.close()


def test_a_body_over_the_cap_is_the_services_413(server):
    """The service answers 413 from Content-Length and closes before it reads the body:
    that answer is the error (as httpx reads it), not the write's broken pipe."""
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        with pytest.raises(client.ApiError) as e:
            sb.commands.run("cat", stdin=b"x" * (17 << 20))
        assert e.value.status == 413 and e.value.kind == "too_large", e.value
        assert sb.commands.run("echo fine").stdout == "fine\n"


def test_transport_failures_are_httpx_errors():
    headers = {"Authorization": "Bearer corral_x"}
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    sb = client.Sandbox({"id": "abc"}, sync_client(f"http://127.0.0.1:{port}", headers))
    with pytest.raises(httpx.ConnectError):            # nobody listens
        sb.commands.run("true")
    sb._http.close()

    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen()

    def hang_up():           # reads the request, answers nothing, closes
        c, _ = lsn.accept()
        c.recv(65536)
        c.close()

    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    sb = client.Sandbox({"id": "abc"},
                        sync_client(f"http://127.0.0.1:{lsn.getsockname()[1]}", headers))
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            sb.commands.run("true")
    finally:
        t.join(10)
        lsn.close()
        sb._http.close()


def test_a_call_that_gives_up_kills_its_command(server):
    """A read timeout (a caller giving up) closes the connection: the service sees the
    client go and kills the foreground command, as with httpx."""
    arg = f"1013.{os.getpid()}"
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        sb.commands.run("true")
        before = len(_idle(server))

        seen = []
        t = threading.Thread(target=lambda: seen.append(
            until(lambda: procs_with(arg), "the command runs")), daemon=True)
        t.start()
        with pytest.raises(httpx.ReadTimeout):
            sb._exec({"argv": ["sleep", arg]}, 5.0)
        t.join(60)
        assert seen, "the command ran"
        until(lambda: not procs_with(arg), "the command is killed")
        assert len(_idle(server)) == before - 1        # that connection was not kept
        assert sb.commands.run("echo after").stdout == "after\n"


def _zygotes(pid: int) -> list[int]:
    """The server's children that are forks of it (its commands' zygote): the same
    command line, unlike the egress zygote (python -I -c ...) and bwrap."""
    def read(path):
        with open(path, "rb") as f:
            return f.read()
    own = read(f"/proc/{pid}/cmdline")
    kids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        kids += [int(k) for k in read(f"/proc/{pid}/task/{tid}/children").split()]
    return [k for k in kids if read(f"/proc/{k}/cmdline") == own]


def test_the_commands_zygote_is_forked_before_the_web_stack(server):
    """corral serve forks the commands' zygote (linux/enter.py) before it imports FastAPI
    and pydantic: each command's entrant is a fork of that small process (enter.warm)."""
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        sb.commands.run("true")
        pid = server.proc.pid
        zygotes = _zygotes(pid)
        assert len(zygotes) == 1, zygotes

        def maps(p):
            with open(f"/proc/{p}/maps") as f:
                return f.read()
        assert "pydantic_core" in maps(pid)             # the server has the web stack
        assert "pydantic_core" not in maps(zygotes[0])  # its zygote does not


def test_the_zygote_outlives_a_groups_sigint_and_sigterm_commands_do_not_inherit(server):
    """Ctrl-C or systemd's stop signals the whole group while the service drains: the
    zygote stays (it ends when the service does), and a command still starts with SIGINT
    and SIGTERM at their defaults."""
    import signal

    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb:
        sb.commands.run("true")
        (zygote,) = _zygotes(server.proc.pid)
        os.kill(zygote, signal.SIGINT)
        os.kill(zygote, signal.SIGTERM)
        assert sb.commands.run("echo alive").stdout == "alive\n"
        with open(f"/proc/{zygote}/status") as f:
            assert "State:\tZ" not in f.read()
        ign = sb.commands.run("grep SigIgn /proc/self/status").stdout.split()[1]
        assert not int(ign, 16) & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)), ign
