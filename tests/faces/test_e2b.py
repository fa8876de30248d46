"""The official E2B SDKs (e2b 2.63.0, e2b-code-interpreter 2.11.5, pinned in the dev lock),
unmodified, against a real `corral serve` subprocess on 127.0.0.1 with live namespace-tier
sandboxes: E2B_API_URL and E2B_SANDBOX_URL point at it, E2B_API_KEY is a corral token.
Sync and async: lifecycle, commands, files, watch_dir, run_code (with per-cell envs) and
contexts; the two users (root, and "user": a distinct unprivileged uid); what is refused
(templates, network beyond the ceiling, unsupported fields, users off the namespace tier,
terminals as "user"); the raw Connect and NDJSON streams' first event and keepalives;
every call an audited run under the token; one token never reaching another's sandbox.
The default templates here map to the host's root (a templates file): the python and
datascience images are test_e2b_images.py's (slow)."""

import asyncio
import io
import struct
import time

import httpx
import pytest
from conftest import tier_unavailable
from e2bfix import e2b_env, e2b_serve

e2b = pytest.importorskip("e2b")
e2b_ci = pytest.importorskip("e2b_code_interpreter")

from e2b import (  # noqa: E402
    AsyncSandbox,
    CommandExitException,
    NotFoundException,
    Sandbox,
    TimeoutException,
)
from e2b.exceptions import AuthenticationException, SandboxException  # noqa: E402

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-e2b")
    net = tmp / "net.toml"
    net.write_text('[network]\nmode = "allow"\nallow = ["*.example.com"]\n')
    s = e2b_serve(tmp, {"a": [], "b": [], "net": ["--ceiling", str(net)]},
                  '[small]\nlimits = { memory = "200M" }\n\n'
                  '[wide]\nnetwork = { mode = "allow", allow = ["*.other.org"] }\n\n'
                  # the defaults on the host's root: no image build in this file
                  # (test_e2b_images.py runs them on the python and datascience images)
                  '[base]\n\n[code-interpreter-v1]\n\n'
                  '[ghost]\nimage = "never-built"\n',
                  {"CORRAL_E2B_KEEPALIVE_S": "0.5",   # the subprocess's keepalive period
                   "CORRAL_AUDIT": "1",                # the audit store on (test_audited)
                   "CORRAL_E2B_DOMAIN": "corral.test"},
                  # an object holding an fd collected unclosed is said in the log
                  python_flags=("-W", "always::ResourceWarning"))
    yield s
    s.stop()


@pytest.fixture
def env(server, monkeypatch):
    return e2b_env(server, monkeypatch)


def test_uploads_close_their_spooled_files(env, server):
    """POST /files (the SDK's multipart upload), one small file and one past the 1 MiB a
    part is kept in memory (then a temporary file on disk): each part's file is closed once
    written, none is left for the collector (whose ResourceWarning the server's log shows:
    it ran with -W always::ResourceWarning)."""
    sb = Sandbox.create(timeout=60)
    try:
        before = server.log.read_text().count("ResourceWarning")
        sb.files.write("/tmp/small.txt", "s")
        sb.files.write("/tmp/big.bin", b"x" * (3 << 20))
        assert sb.files.read("/tmp/small.txt") == "s"
        assert sb.commands.run("wc -c < /tmp/big.bin").stdout.strip() == str(3 << 20)
    finally:
        sb.kill()
    log = server.log.read_text()
    assert log.count("ResourceWarning") == before, log[-3000:]


def test_lifecycle(env):
    sb = Sandbox.create(timeout=120, metadata={"who": "test"}, envs={"FOO": "bar"})
    try:
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id and info.template_id == "base"
        assert info.metadata == {"who": "test"}
        ids = [s.sandbox_id for s in Sandbox.list().next_items()]
        assert sb.sandbox_id in ids
        from e2b import SandboxQuery

        hit = Sandbox.list(query=SandboxQuery(metadata={"who": "test"})).next_items()
        miss = Sandbox.list(query=SandboxQuery(metadata={"who": "other"})).next_items()
        assert [s.sandbox_id for s in hit] == [sb.sandbox_id] and not miss
        before = info.end_at
        sb.set_timeout(600)
        assert sb.get_info().end_at > before
        again = Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("echo $FOO").stdout == "bar\n"   # create's envs
        from e2b_code_interpreter import Sandbox as CI

        ci = CI.connect(sb.sandbox_id)
        assert ci.run_code("import os; os.environ['FOO']").text == "'bar'"
        # the same sandbox on the native API, under the same token
        with env.http(env.tokens["a"]) as c:
            assert c.get(f"/sandboxes/{sb.sandbox_id}").status_code == 200
        assert sb.is_running()
    finally:
        sb.kill()
    assert not sb.is_running()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sb.sandbox_id)
    k1 = Sandbox.create(idempotency_key="retry-1")
    try:
        assert Sandbox.create(idempotency_key="retry-1").sandbox_id == k1.sandbox_id
        assert Sandbox.create(idempotency_key="retry-2").sandbox_id != k1.sandbox_id
    finally:
        for s in Sandbox.list().next_items():
            Sandbox.kill(s.sandbox_id)
    with Sandbox.create() as sb2:
        assert sb2.commands.run("true").exit_code == 0
    assert sb2.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]


def test_commands(env):
    with Sandbox.create(timeout=120) as sb:
        out, err = [], []
        r = sb.commands.run("echo one; echo two >&2; echo $A; pwd", envs={"A": "x"},
                            cwd="/tmp", on_stdout=out.append, on_stderr=err.append)
        assert r.stdout == "one\nx\n/tmp\n" and r.stderr == "two\n" and r.exit_code == 0
        assert "".join(out) == r.stdout and "".join(err) == r.stderr
        with pytest.raises(CommandExitException) as ei:
            sb.commands.run("echo no >&2; exit 3")
        assert ei.value.exit_code == 3 and ei.value.stderr == "no\n"
        with pytest.raises(TimeoutException):
            sb.commands.run("sleep 30", timeout=1)
        h = sb.commands.run("cat", background=True, stdin=True)
        sb.commands.send_stdin(h.pid, "fed\n")
        sb.commands.close_stdin(h.pid)
        assert h.wait().stdout == "fed\n"
        h = sb.commands.run("sleep 300", background=True)
        assert h.pid in [p.pid for p in sb.commands.list()]
        assert sb.commands.kill(h.pid) is True
        with pytest.raises(CommandExitException) as ei:
            h.wait()
        assert ei.value.exit_code == -1
        assert h.pid not in [p.pid for p in sb.commands.list()]
        assert sb.commands.run("id -u", user="root").stdout == "0\n"


def test_users(env):
    """user="user" is a real unprivileged uid inside (1000, a host uid of its own): it
    cannot write what root made; /home/user is its home and the default cwd."""
    with Sandbox.create(timeout=120) as sb:
        r = sb.commands.run("id -u; id -g; pwd; echo $HOME; stat -c %u /home/user",
                            user="user")
        assert r.stdout == "1000\n1000\n/home/user\n/home/user\n1000\n"
        assert sb.commands.run("id -u; pwd").stdout == "0\n/home/user\n"   # root: default
        sb.commands.run("echo secret > /tmp/root-owned; chmod 644 /tmp/root-owned",
                        user="root")
        with pytest.raises(CommandExitException) as ei:
            sb.commands.run("echo x >> /tmp/root-owned", user="user")
        assert "Permission denied" in ei.value.stderr
        assert sb.files.read("/tmp/root-owned") == "secret\n"
        # host-side: the two ids of the sandbox are distinct host uids
        maps = sb.commands.run("cat /proc/self/uid_map").stdout.split()
        assert maps[0::3] == ["0", "1000"] and maps[1] != maps[4]
        # files as the user: owned by it; as root: the user's file is not root's to change
        sb.files.write("/home/user/mine.txt", "u", user="user")
        assert sb.commands.run("stat -c %u /home/user/mine.txt").stdout == "1000\n"
        assert sb.files.read("mine.txt", user="user") == "u"       # relative: its home
        sb.files.write("by-root.txt", "r")          # root's relative path: /home/user too
        assert sb.commands.run("cat by-root.txt; stat -c %u by-root.txt").stdout == "r0\n"
        with pytest.raises(SandboxException, match="user"):
            sb.commands.run("id -u", user="nobody")
        with pytest.raises(SandboxException, match="user"):
            sb.pty.create(e2b.PtySize(rows=24, cols=80), user="user")


def test_files_named_with_bytes_that_are_not_utf8(env):
    """The sandbox names files with any bytes: listed (and watched) in the quoted form
    of the native API ("\\xff\\xfe", docs/service.md), read and removed by it; a
    malformed quoted name is refused in one line."""
    with Sandbox.create(timeout=120) as sb:
        sb.commands.run("mkdir -p /tmp/d && printf 1 > $'/tmp/d/\\xff\\xfe' && "
                        "printf 2 > '/tmp/d/\"q\"'")
        handle = sb.files.watch_dir("/tmp/d")
        try:
            names = sorted(e.name for e in sb.files.list("/tmp/d"))
            assert names == ['"\\"q\\""', '"\\xff\\xfe"'], names
            assert sb.files.read('/tmp/d/"\\xff\\xfe"') == "1"
            assert sb.files.read('/tmp/d/"\\"q\\""') == "2"
            assert sb.files.get_info('/tmp/d/"\\xff\\xfe"').path == '/tmp/d/"\\xff\\xfe"'
            sb.commands.run("touch $'/tmp/d/w\\xfd'")
            seen = []
            for _ in range(50):
                seen += [e.name for e in handle.get_new_events()]
                if '"w\\xfd"' in seen:
                    break
                time.sleep(0.1)
            assert '"w\\xfd"' in seen, seen
            sb.files.remove('/tmp/d/"\\xff\\xfe"')
            assert sb.commands.run("ls /tmp/d | od -An -c").stdout.split() == [
                '"', "q", '"', "\\n", "w", "375", "\\n"]
            with pytest.raises(SandboxException, match="quoted"):
                sb.files.read('/tmp/d/"\\q"')
            with pytest.raises(SandboxException, match='/tmp/d/"w.xfd" is not a dir'):
                sb.files.list('/tmp/d/"w\\xfd"')
        finally:
            handle.stop()


def test_files(env):
    with Sandbox.create(timeout=120) as sb:
        f = sb.files
        assert f.write("/tmp/a.txt", "text").path == "/tmp/a.txt"
        f.write("/tmp/b.bin", b"\x00\xff")
        f.write("/tmp/c.bin", io.BytesIO(b"from a file object"))
        f.write_files([{"path": "/tmp/d/1", "data": "one"}, {"path": "/tmp/d/2",
                                                              "data": b"two"}])
        assert f.read("/tmp/a.txt") == "text"
        assert bytes(f.read("/tmp/b.bin", format="bytes")) == b"\x00\xff"
        assert b"".join(f.read("/tmp/c.bin", format="stream")) == b"from a file object"
        assert sb.commands.run("cat /tmp/d/1 /tmp/d/2").stdout == "onetwo"
        top = {e.path for e in f.list("/tmp")}
        assert "/tmp/d" in top and "/tmp/d/1" not in top
        assert "/tmp/d/1" in {e.path for e in f.list("/tmp", depth=2)}
        assert f.exists("/tmp/a.txt") and not f.exists("/tmp/none")
        info = f.get_info("/tmp/b.bin")
        assert info.size == 2 and info.type.value == "file"
        assert f.make_dir("/tmp/new") is True and f.make_dir("/tmp/new") is False
        assert f.rename("/tmp/a.txt", "/tmp/new/a.txt").path == "/tmp/new/a.txt"
        f.remove("/tmp/new")
        assert not f.exists("/tmp/new/a.txt")
        with pytest.raises(NotFoundException):
            f.read("/tmp/none")


def test_watch_dir(env):
    with Sandbox.create(timeout=120) as sb:
        sb.files.make_dir("/tmp/w")
        w = sb.files.watch_dir("/tmp/w")
        sb.commands.run("echo x > /tmp/w/made")
        names = set()
        for _ in range(100):
            names |= {e.name for e in w.get_new_events()}
            if "made" in names:
                break
        w.stop()
        assert "made" in names


def test_watchers_past_the_cap_say_when_to_try_again(env, server):
    """A sandbox's watchers past its cap: resource_exhausted (429) with Retry-After, as the
    REST face's watches cap answers."""
    from corral.service.e2b.fs import MAX_WATCHERS

    with Sandbox.create(timeout=120) as sb:
        head = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983",
                "X-Access-Token": sb._envd_access_token}
        url = server.url + "/filesystem.Filesystem/CreateWatcher"
        for _ in range(MAX_WATCHERS):
            r = httpx.post(url, headers=head, json={"path": "/tmp"}, timeout=30)
            assert r.status_code == 200 and "Retry-After" not in r.headers, r.text
        r = httpx.post(url, headers=head, json={"path": "/tmp"}, timeout=30)
        assert r.status_code == 429 and r.json()["code"] == "resource_exhausted", r.text
        assert r.headers["Retry-After"] == "1"


def test_run_code_and_contexts(env):
    from e2b_code_interpreter import Sandbox as CI

    with CI.create(timeout=120) as sb:
        out = []
        ex = sb.run_code("x = 40 + 2\nprint('hi')\nx", on_stdout=out.append)
        assert ex.text == "42" and ex.logs.stdout == ["hi\n"] and ex.error is None
        assert [o.line for o in out] == ["hi\n"]
        n = ex.execution_count
        assert sb.run_code("x").execution_count == n + 1
        ex = sb.run_code("1/0")
        assert ex.error.name == "ZeroDivisionError" and "division" in ex.error.value
        assert "Traceback" in ex.error.traceback
        ctx = sb.create_code_context()
        assert ctx.id in [c.id for c in sb.list_code_contexts()]
        sb.run_code("y = 5", context=ctx)
        assert sb.run_code("y", context=ctx).text == "5"
        assert sb.run_code("y").error.name == "NameError"        # another context
        sb.restart_code_context(ctx)
        assert sb.run_code("y", context=ctx).error.name == "NameError"
        sb.remove_code_context(ctx)
        assert ctx.id not in [c.id for c in sb.list_code_contexts()]
        # envs: this cell's own, put back after it (E2B's per-execution variables)
        code = "import os; os.environ.get('CELL_VAR', 'unset') + '/' + os.environ['HOME']"
        assert sb.run_code(code, envs={"CELL_VAR": "one", "HOME": "/elsewhere"}).text \
            == "'one//elsewhere'"
        home = sb.run_code("import os; os.environ['HOME']").text
        assert sb.run_code(code).text == f"'unset/{home[1:-1]}'"       # put back
        assert sb.run_code("process.env.CELL_VAR", language="javascript",
                           envs={"CELL_VAR": "js"}).text == "'js'"
        assert sb.run_code("process.env.CELL_VAR", language="javascript").text in (
            None, "undefined")
        with pytest.raises(SandboxException, match="env_vars"):
            sb.run_code("echo $A", language="bash", envs={"A": "1"})


def test_async(env):
    from e2b_code_interpreter import AsyncSandbox as ACI

    async def main():
        sb = await AsyncSandbox.create(timeout=120)
        try:
            assert (await sb.commands.run("echo async")).stdout == "async\n"
            with pytest.raises(CommandExitException):
                await sb.commands.run("false")
            h = await sb.commands.run("sleep 300", background=True)
            await sb.commands.kill(h.pid)
            with pytest.raises(CommandExitException):
                await h.wait()
            await sb.files.write("/tmp/q", "q")
            assert await sb.files.read("/tmp/q") == "q"
            assert await sb.files.exists("/tmp/q")
            await sb.files.make_dir("/tmp/aw")
            seen = asyncio.Event()
            w = await sb.files.watch_dir("/tmp/aw", lambda e: seen.set()
                                         if e.name == "made" else None)
            await sb.commands.run("echo x > /tmp/aw/made")
            await asyncio.wait_for(seen.wait(), 60)
            await w.stop()
            seen = []
            t = await sb.pty.create(e2b.PtySize(rows=24, cols=80), on_data=seen.append)
            await sb.pty.send_stdin(t.pid, b"echo a5ync; exit 4\n")
            with pytest.raises(CommandExitException) as ei:
                await t.wait()
            assert ei.value.exit_code == 4 and b"a5ync" in b"".join(seen)
            h = await sb.commands.run("read x; echo got $x", background=True, stdin=True)
            out = []
            h2 = await sb.commands.connect(h.pid, on_stdout=out.append)
            await sb.commands.send_stdin(h.pid, "it\n")
            assert (await h2.wait()).exit_code == 0
            assert "".join(out) == "got it\n"
            paginator = AsyncSandbox.list()
            assert sb.sandbox_id in [s.sandbox_id for s in await paginator.next_items()]
            info = await sb.get_info()
            assert info.sandbox_id == sb.sandbox_id
        finally:
            await sb.kill()
        ci = await ACI.create(timeout=120)
        try:
            ex = await ci.run_code("6 * 7")
            assert ex.text == "42"
            ctx = await ci.create_code_context()
            await ci.run_code("z = 1", context=ctx)
            assert (await ci.run_code("z", context=ctx)).text == "1"
        finally:
            await ci.kill()

    asyncio.run(main())


def test_templates(env):
    """A template of the server's file is its policy, within the token's ceiling."""
    sb = Sandbox.create(template="small")
    try:
        assert sb.get_info().template_id == "small"
        with env.http(env.tokens["a"]) as c:
            pol = c.get(f"/sandboxes/{sb.sandbox_id}").json()["policy"]
        assert pol["limits"]["memory"] in ("200M", 200 << 20)
    finally:
        sb.kill()
    with pytest.raises(SandboxException, match="network"):   # beyond token a's ceiling
        Sandbox.create(template="wide")


def test_refusals(env, monkeypatch):
    with pytest.raises(SandboxException, match="templateID"):
        Sandbox.create(template="my-own-template")
    with pytest.raises(SandboxException, match="no image named .never-built.*corral image build"):
        Sandbox.create(template="ghost")        # its image is not in the server's store
    with pytest.raises(SandboxException, match="allow_internet_access"):
        Sandbox.create(allow_internet_access=True)
    with pytest.raises(SandboxException, match="network"):     # beyond token a's ceiling
        Sandbox.create(network={"allow_out": ["api.example.com"]})
    with pytest.raises(SandboxException, match="autoPause|pause"):
        Sandbox.create(lifecycle={"on_timeout": "pause"})
    assert not Sandbox.list().next_items()        # nothing was made by the refusals
    monkeypatch.setenv("E2B_API_KEY", env.tokens["net"])
    with pytest.raises(SandboxException, match="network"):     # beyond net's too
        Sandbox.create(network={"allow_out": ["evil.invalid"]})
    sb = Sandbox.create(network={"allow_out": ["api.example.com"]})
    try:
        with env.http(env.tokens["net"]) as c:
            pol = c.get(f"/sandboxes/{sb.sandbox_id}").json()["policy"]
        assert pol["network"]["mode"] == "allow"
        assert pol["network"]["allow"] == ["api.example.com"]
    finally:
        sb.kill()


def test_pty(env):
    with Sandbox.create(timeout=120) as sb:
        t = sb.pty.create(size=e2b.PtySize(rows=24, cols=80), envs={"MARK": "m4rk"})
        sb.pty.resize(t.pid, e2b.PtySize(rows=40, cols=100))
        sb.pty.send_stdin(t.pid, b"stty size; echo $MARK; exit 7\n")
        seen = []
        with pytest.raises(CommandExitException) as ei:
            t.wait(on_pty=seen.append)
        shown = b"".join(seen)
        assert b"40 100" in shown and b"m4rk" in shown and ei.value.exit_code == 7
        t2 = sb.pty.create(size=e2b.PtySize(rows=24, cols=80))
        assert sb.pty.kill(t2.pid) is True
        with pytest.raises(CommandExitException):
            t2.wait()


def test_auth(env, monkeypatch):
    sb = Sandbox.create(timeout=120)
    try:
        monkeypatch.setenv("E2B_API_KEY", "corral_not-a-token")
        with pytest.raises(AuthenticationException):
            Sandbox.list().next_items()
        monkeypatch.setenv("E2B_API_KEY", env.tokens["b"])
        with pytest.raises(NotFoundException):
            Sandbox.connect(sb.sandbox_id)
        assert sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
        # the data plane without the sandbox's access token: no such sandbox
        r = httpx.post(env.url + "/process.Process/List", json={}, headers={
            "E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983",
            "X-Access-Token": "ea_wrong"})
        assert r.status_code == 404 and r.json()["code"] == "not_found"
    finally:
        sb.kill()


def test_domain_host_names(env):
    """CORRAL_E2B_DOMAIN: behind a TLS proxy the SDK names the sandbox and port in the
    host name (PORT-ID.DOMAIN), not in headers; the host name wins over the headers.
    (The SDK itself in E2B_DOMAIN mode over TLS: test_e2b_domain.py.)"""
    sb = Sandbox.create(timeout=120)
    try:
        h = {"Host": f"49983-{sb.sandbox_id}.corral.test",
             "X-Access-Token": sb._envd_access_token}
        r = httpx.post(env.url + "/process.Process/List", json={}, headers=h)
        assert r.status_code == 200 and "processes" in r.json()
        r = httpx.post(env.url + "/process.Process/List", json={}, headers={
            **h, "E2b-Sandbox-Id": "someone-else", "E2b-Sandbox-Port": "49983"})
        assert r.status_code == 200
        r = httpx.get(env.url + "/health", headers={
            **h, "Host": f"49999-{sb.sandbox_id}.corral.test"})
        assert r.json() == "OK"
        r = httpx.get(env.url + "/v2/sandboxes", headers={
            "Host": "api.corral.test", "X-API-Key": env.tokens["a"]})
        assert sb.sandbox_id in [d["sandboxID"] for d in r.json()]
    finally:
        sb.kill()


def _envelopes(raw: bytes) -> list[tuple[int, bytes]]:
    out, i = [], 0
    while i < len(raw):
        flags, n = struct.unpack(">BI", raw[i:i + 5])
        out.append((flags, raw[i + 5:i + 5 + n]))
        i += 5 + n
    return out


def test_stream_starts_with_start_and_sends_keepalives(env):
    """The raw Connect stream of process.Process/Start: `start` first, keepalives while a
    quiet command runs (the server's period is 0.5 s here), `end` and the end-of-stream
    envelope last."""
    import json

    sb = Sandbox.create(timeout=120)
    try:
        body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 2; echo"
                                                                   " done"]}}).encode()
        r = httpx.post(env.url + "/process.Process/Start",
                       content=struct.pack(">BI", 0, len(body)) + body, timeout=60,
                       headers={"E2b-Sandbox-Id": sb.sandbox_id,
                                "E2b-Sandbox-Port": "49983",
                                "X-Access-Token": sb._envd_access_token,
                                "Content-Type": "application/connect+json"})
        envs = _envelopes(r.content)
        msgs = [json.loads(b) for _, b in envs[:-1]]
        kinds = [next(iter(m["event"])) for m in msgs]
        assert kinds[0] == "start" and kinds[-1] == "end"
        assert "keepalive" in kinds
        assert envs[-1][0] == 0x02 and json.loads(envs[-1][1]) == {}
    finally:
        sb.kill()


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as corral serve binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_debug_mode(tmp_path, monkeypatch):
    """E2B_DEBUG=true: the SDK makes no control-plane call and talks to localhost:49983
    and :49999; `corral serve --e2b-debug NAME` answers there with one sandbox of token
    NAME, made on first use."""
    if not (_port_free(49983) and _port_free(49999)):
        pytest.skip("127.0.0.1:49983 or :49999 is taken on this host")
    # the host's root: no image build here
    s = e2b_serve(tmp_path, {"dev": []}, "[base]\n", args=("--e2b-debug", "dev"))
    try:
        monkeypatch.setenv("E2B_DEBUG", "true")
        for v in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
            monkeypatch.delenv(v, raising=False)
        from e2b_code_interpreter import Sandbox as CI

        sb = CI.create()
        assert sb.sandbox_id == "debug_sandbox_id"
        assert sb.commands.run("echo dbg").stdout == "dbg\n"
        sb.files.write("/tmp/kept", "1")
        assert sb.run_code("3 * 3").text == "9"
        again = CI.connect("debug_sandbox_id")
        assert again.files.read("/tmp/kept") == "1"           # the same sandbox
        with s.http(s.tokens["dev"]) as c:                   # the token's, natively
            assert len(c.get("/sandboxes").json()["sandboxes"]) == 1
    finally:
        s.stop()


def test_every_call_is_an_audited_run(env):
    """Each command, terminal and code interpreter an E2B call starts is a run in the
    audit store under the token's name, face "e2b", seen on the native /runs."""
    import time

    from e2b_code_interpreter import Sandbox as CI

    with CI.create(timeout=120) as sb:
        sid = sb.sandbox_id
        sb.commands.run("echo audited")
        h = sb.commands.run("sleep 30", background=True)
        sb.commands.kill(h.pid)
        t = sb.pty.create(e2b.PtySize(rows=24, cols=80))
        sb.pty.send_stdin(t.pid, b"exit 0\n")
        t.wait()
        assert sb.run_code("1+1").text == "2"
    want = {"/bin/bash -l -c echo audited", "/bin/bash -l -c sleep 30", "run_code python"}
    with env.http(env.tokens["a"]) as c:
        for _ in range(400):
            runs = [r for r in c.get("/runs", params={"sandbox": sid}).json()["runs"]
                    if r["sandbox"] == sid]
            cmds = {" ".join(r["argv"]) for r in runs if r.get("argv")}
            if want <= cmds and len(runs) >= 4:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(runs)
        assert all(r["actor"] == "token:a" and r["face"] == "e2b" for r in runs), runs
        kinds = sorted(r["kind"] for r in runs)
        assert kinds == ["cell", "command", "command", "command"], kinds   # + the terminal
        cell = next(r for r in runs if r["kind"] == "cell")
        assert cell["verdict"] == "ok" and cell["receipt"] is True
        with env.http(env.tokens["b"]) as other:        # never another token's
            assert sid not in {r["sandbox"] for r in other.get("/runs").json()["runs"]}


def test_execute_stream_sends_keepalives(env):
    """The code interpreter's NDJSON /execute stream: keepalive lines while a quiet cell
    runs (the server's period is 0.5 s here), then the cell's own lines."""
    import json

    from e2b_code_interpreter import Sandbox as CI

    with CI.create(timeout=120) as sb:
        r = httpx.post(env.url + "/execute", timeout=60, json={
            "code": "import time\ntime.sleep(1.6)\nprint('late')"}, headers={
            "E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49999",
            "X-Access-Token": sb._envd_access_token})
        kinds = [json.loads(line)["type"] for line in r.text.splitlines()]
        assert kinds.count("keepalive") >= 2, kinds
        assert kinds.index("keepalive") < kinds.index("stdout")
        assert kinds[-1] == "end_of_execution"


def test_user_refused_off_the_namespace_tier(env, tmp_path, monkeypatch):
    """On gvisor there is no second uid to switch to: user="user" is refused with a
    message naming the namespace tier (fail closed, never a silent root)."""
    if tier_unavailable("gvisor") is not None:
        pytest.skip(f"gvisor: {tier_unavailable('gvisor')}")
    ceiling = tmp_path / "gvisor.toml"
    ceiling.write_text('isolation = "gvisor"\n')
    monkeypatch.setenv("E2B_API_KEY", env.token("gv", "--ceiling", str(ceiling)))
    with Sandbox.create(timeout=120) as sb:
        assert sb.commands.run("id -u").stdout == "0\n"
        with pytest.raises(SandboxException, match="namespace tier"):
            sb.commands.run("id -u", user="user")


@pytest.mark.slow      # 6-15 s: in the slow group, which CI runs too
def test_inputs_nobody_reads_leave_the_servers_worker_threads_to_others(env, server):
    """A process and a terminal that never read their input (the sandbox's code decides),
    and 45 SendInput calls to each at once (raw Connect calls, as many connections), each
    more than a pipe holds, the clients giving up: another token's sync route (GET
    /metrics) still answers; a second write to one target while one waits is refused
    (resource_exhausted), not parked on a thread of the server's shared pool."""
    import base64
    import threading

    sb = Sandbox.create(timeout=120)
    try:
        h = sb.commands.run("exec sleep 1400.5", background=True, stdin=True)
        t = sb.pty.create(e2b.PtySize(rows=24, cols=80))
        sb.pty.send_stdin(t.pid, b"stty raw -echo; exec sleep 1401.5\n")
        head = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983",
                "X-Access-Token": sb._envd_access_token}
        big = base64.b64encode(b"z" * 300_000).decode()
        for pid, key in ((h.pid, "stdin"), (t.pid, "pty")):
            answers = []

            def write():
                try:
                    r = httpx.post(server.url + "/process.Process/SendInput", headers=head,
                                   json={"process": {"pid": pid}, "input": {key: big}},
                                   timeout=5)
                    answers.append(r.json().get("code", "ok"))
                except httpx.TimeoutException:
                    answers.append("gave up")

            writers = [threading.Thread(target=write) for _ in range(45)]
            for w in writers:
                w.start()
            for w in writers:
                w.join()
            # bounded for a hang (before: the pool was held until the writes gave up)
            r = httpx.get(server.url + "/metrics", timeout=30,
                          headers={"Authorization": f"Bearer {server.tokens['b']}"})
            assert r.status_code == 200 and "corral_sandboxes_live" in r.text
            assert answers.count("resource_exhausted") >= 40, (key, answers)
    finally:
        sb.kill()


def test_watches_made_at_once_never_stop_the_server(env, server):
    """Many watch_dir calls on one sandbox at once, each a recursive watch of a tree the
    sandbox made wide (its scan takes a while): the files lock is never held by the
    event loop across an await (a second call would then block the loop on it, and the
    first could never finish: every request of every token stuck). Every call returns,
    and another token's request is answered."""
    import threading

    sb = Sandbox.create(timeout=120)
    try:
        sb.commands.run("mkdir -p /tmp/wide && cd /tmp/wide && seq -f d%g 1 1000 | "
                        "xargs mkdir && for d in d1 d2 d3 d4 d5; do (cd $d && "
                        "seq -f f%g 1 3000 | xargs touch); done", timeout=120)
        made = []

        def watch():
            try:
                made.append(sb.files.watch_dir("/tmp/wide", recursive=True,
                                               request_timeout=60))
            except Exception as e:  # noqa: BLE001 - counted below
                made.append(e)

        ws = [threading.Thread(target=watch) for _ in range(16)]
        for w in ws:
            w.start()
        for w in ws:
            w.join(90)
        # bounded for a hang (before: the loop blocked on the lock, for good)
        r = httpx.get(server.url + "/metrics", timeout=30,
                      headers={"Authorization": f"Bearer {server.tokens['b']}"})
        assert r.status_code == 200
        assert len(made) == 16, made
        for w in made:
            if not isinstance(w, Exception):
                w.stop()
    finally:
        sb.kill()
