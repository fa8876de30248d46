"""Files and code contexts over `corral serve`, for real: uvicorn in a subprocess on
127.0.0.1, live namespace-tier sandboxes, the SDK (corral.client) sync and async and raw
httpx. Binary round trips byte for byte, a streamed download of a few MB, links the
sandbox planted (to /etc/shadow, to a host file) never followed out, hostile tars refused
whole, an upload over the body cap answered 413 with nothing written, watches, and code
contexts that keep their variables apart until restarted."""

import asyncio
import hashlib
import io
import json
import os
import tarfile
import threading
import time

import httpx
import pytest
from conftest import tier_unavailable
from servefix import Server, until
from servefix import api_error as _err

from corral import client
from corral.runtime.files import FileNotFound, FilesError
from corral.runtime.session import CodeResult, Context, ContextError, ExecutionError

pytestmark = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

CAP = 16 << 20        # the service's body cap (service.app.BODY_MAX)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("serve-files"), tokens=["a"]) as s:
        yield s


@pytest.fixture
def sb(server):
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as s:
        yield s


@pytest.fixture
def raw(server, sb):
    """httpx on the sandbox's own routes."""
    with httpx.Client(base_url=f"{server.url}/sandboxes/{sb.id}", timeout=120, headers={
            "Authorization": f"Bearer {server.tokens['a']}"}) as h:
        yield h


def _tar(*members, gz=False) -> bytes:
    """A tar of (TarInfo fields as a dict, data or None) members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tf:
        for fields, data in members:
            ti = tarfile.TarInfo(fields.pop("name"))
            for k, v in fields.items():
                setattr(ti, k, v)
            if data is not None:
                ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _sha_inside(sb, path) -> str:
    r = sb.exec(["sha256sum", path])
    assert r.verdict == "ok", r
    return r.stdout.split()[0]


# -- read and write -----------------------------------------------------------------------
def test_binary_round_trip_byte_for_byte(sb, raw):
    data = bytes(range(256)) * 4 + os.urandom(300_000) + b"\r\n\x00\xff\xfe"
    info = sb.files.write("/scratch/bin/blob", data)
    assert (info.name, info.path, info.type) == ("blob", "/scratch/bin/blob", "file")
    assert sb.files.read("/scratch/bin/blob", format="bytes") == data
    assert _sha_inside(sb, "/scratch/bin/blob") == hashlib.sha256(data).hexdigest()
    r = raw.get("/files/content", params={"path": "/scratch/bin/blob"})
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "application/octet-stream"
    # made inside, read out: the bytes the sandbox wrote
    sb.exec(["sh", "-c", "printf '\\000\\001\\377caf\\303\\251' > /scratch/made"])
    assert sb.files.read("/scratch/made", format="bytes") == b"\x00\x01\xffcaf\xc3\xa9"
    assert sb.files.read("/scratch/made") == "\x00\x01\ufffdcafé"      # text: replaced
    with pytest.raises(FilesError, match="format"):
        sb.files.read("/scratch/made", format="base64")


def _held_by(server, name: str) -> bool:
    """Whether the service's process has a file of that name open."""
    fds = f"/proc/{server.proc.pid}/fd"
    for fd in os.listdir(fds):
        try:
            if os.readlink(f"{fds}/{fd}").endswith("/" + name):
                return True
        except OSError:
            pass
    return False


def test_streaming_download_of_a_few_megabytes(server, sb, raw):
    r = sb.exec(["sh", "-c", "head -c 6291459 /dev/urandom > /scratch/big && "
                 "sha256sum /scratch/big"])
    assert r.verdict == "ok", r
    want = r.stdout.split()[0]
    chunks = sb.files.read("/scratch/big", format="stream")
    assert not isinstance(chunks, (bytes, str))
    got, n, h = 0, 0, hashlib.sha256()
    for c in chunks:
        h.update(c)
        got += len(c)
        n += 1
    assert (got, h.hexdigest()) == (6291459, want)
    assert n >= 6                      # it came in chunks, not as one body
    with raw.stream("GET", "/files/content", params={"path": "/scratch/big"}) as s:
        assert s.status_code == 200
        assert "content-length" not in s.headers       # streamed, never buffered whole
        assert hashlib.sha256(s.read()).hexdigest() == want
    # stopped early, or never read: the service closes the file
    assert sb.exec("cp /scratch/big /scratch/big-held").verdict == "ok"
    it = sb.files.read("/scratch/big-held", format="stream")
    assert len(next(it)) > 0
    assert _held_by(server, "big-held")        # open in the service while it streams
    it.close()
    until(lambda: not _held_by(server, "big-held"), "the service closes the file")
    with sb.files.read("/scratch/big-held", format="stream") as never_read:
        assert never_read is not None
    until(lambda: not _held_by(server, "big-held"), "the service closes the file")
    assert sb.files.exists("/scratch/big-held")
    # the JSON read holds the file whole: bounded, and it says where to go instead
    assert sb.exec("head -c 17M /dev/zero > /scratch/huge").verdict == "ok"
    e = _err(raw.get("/files", params={"path": "/scratch/huge"}), 413, "too_large")
    assert "files/content" in e["message"]
    assert raw.get("/files", params={"path": "/scratch/big", "encoding": "base64"}).json()[
        "content"][:8]
    with pytest.raises(FileNotFound):
        sb.files.read("/scratch/nothing-here", format="stream")
    with pytest.raises(FilesError, match="not a regular file"):
        sb.files.read("/scratch", format="stream")


def test_raw_put_and_json_put_are_the_same_write(sb, raw):
    r = raw.put("/files/content", params={"path": "/scratch/p/raw.bin"}, content=b"\x00raw")
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "raw.bin", "path": "/scratch/p/raw.bin", "type": "file"}
    r = raw.put("/files", json={"path": "/scratch/p/j.txt", "content": "AP8=",
                                "encoding": "base64"})
    assert r.status_code == 200, r.text
    assert sb.files.read("/scratch/p/j.txt", format="bytes") == b"\x00\xff"
    assert sb.exec("cat /scratch/p/raw.bin").stdout == "\x00raw"
    _err(raw.put("/files", json={"path": "/scratch/p/x", "content": "!!",
                                 "encoding": "base64"}), 400, "invalid")


# -- links the sandbox planted ----------------------------------------------------------------
def test_a_planted_symlink_to_etc_shadow_is_not_read_over_http(sb, raw, tmp_path):
    host_secret = tmp_path / "host-only.txt"        # on the host, not in the sandbox
    host_secret.write_text("host-only-secret\n")
    os.chmod(host_secret, 0o644)
    os.chmod(tmp_path, 0o755)
    r = sb.exec(["sh", "-c", "ln -s /etc/shadow /scratch/shadow && "
                 "ln -s ../../../../../../../etc/shadow /scratch/up && "
                 f"ln -s {host_secret} /scratch/host && ln -s {tmp_path} /scratch/hostdir"])
    assert r.verdict == "ok", r
    with open("/etc/shadow", "rb") as f:
        shadow = f.read()
    for link in ("/scratch/shadow", "/scratch/up"):
        for resp in (raw.get("/files/content", params={"path": link}),
                     raw.get("/files", params={"path": link, "encoding": "base64"})):
            assert resp.status_code in (400, 404), (link, resp.status_code)
            assert resp.json()["error"]["kind"] == "files"
            assert shadow[:20] not in resp.content
        with pytest.raises(FilesError):
            sb.files.read(link, format="bytes")
    # a link to a host path means that path inside the sandbox: not there
    with pytest.raises(FileNotFound):
        sb.files.read("/scratch/host")
    _err(raw.get("/files/content", params={"path": "/scratch/hostdir/host-only.txt"}), 404,
         "files")
    # writes through the links: the link is replaced, or the path resolved inside
    sb.files.write("/scratch/host", "replaced the link")
    assert host_secret.read_text() == "host-only-secret\n"
    assert sb.files.info("/scratch/host").type == "file"
    try:       # the link's target is that path inside: made there, or refused there
        sb.files.write("/scratch/hostdir/host-only.txt", "inside")
        assert sb.exec(["cat", str(host_secret)]).stdout == "inside"
    except FilesError as e:
        print("refused inside:", e)
    assert host_secret.read_text() == "host-only-secret\n"
    info = sb.files.info("/scratch/shadow")           # described, never followed
    assert (info.type, info.symlink_target) == ("symlink", "/etc/shadow")
    sb.files.remove("/scratch/shadow")                # the link, not /etc/shadow
    assert not sb.files.exists("/scratch/shadow")
    with open("/etc/shadow", "rb") as f:
        assert f.read() == shadow


# -- many files at once --------------------------------------------------------------------
def test_write_files_multipart_and_a_tar(sb, raw):
    out = sb.files.write_files([{"path": "/scratch/m/a.txt", "data": "A"},
                                ("/scratch/m/sub/b.bin", b"\x00B")])
    assert [w.path for w in out] == ["/scratch/m/a.txt", "/scratch/m/sub/b.bin"]
    assert sb.exec("cat /scratch/m/a.txt /scratch/m/sub/b.bin").stdout == "A\x00B"
    r = raw.post("/files/upload", params={"path": "/scratch/up"}, files=[
        ("f", ("one.txt", b"1")), ("f", ("deep/two.bin", b"\x002"))])
    assert r.status_code == 201, r.text
    assert [w["path"] for w in r.json()["written"]] == ["/scratch/up/one.txt",
                                                        "/scratch/up/deep/two.bin"]
    assert sb.files.read("/scratch/up/deep/two.bin", format="bytes") == b"\x002"
    for bad in ("../escape", "/abs", "a/../../b"):
        _err(raw.post("/files/upload", params={"path": "/scratch/up2"},
                      files=[("f", ("ok.txt", b"ok")), ("f", (bad, b"x"))]), 400, "invalid")
    assert not sb.files.exists("/scratch/up2")          # checked before any was written
    tar = _tar(({"name": "d", "type": tarfile.DIRTYPE, "mode": 0o755}, None),
               ({"name": "d/f.txt", "mode": 0o640}, b"tarred"),
               ({"name": "d/link", "type": tarfile.SYMTYPE, "linkname": "f.txt"}, None),
               gz=True)
    w = sb.files.write("/scratch/t", tar, extract=True)
    assert (w.path, w.type) == ("/scratch/t", "dir")
    assert sb.exec("cat /scratch/t/d/link").stdout == "tarred"
    assert sb.files.info("/scratch/t/d/f.txt").mode == 0o640


@pytest.mark.parametrize("member", [
    ({"name": "../escape.txt"}, b"out"),
    ({"name": "ok/../../escape.txt"}, b"out"),
    ({"name": "/etc/escape.txt"}, b"out"),
    ({"name": "l", "type": tarfile.SYMTYPE, "linkname": "/etc"}, None),
    ({"name": "l", "type": tarfile.SYMTYPE, "linkname": "../../.."}, None),
    ({"name": "h", "type": tarfile.LNKTYPE, "linkname": "etc/shadow"}, None),
    ({"name": "null", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, None),
    ({"name": "fifo", "type": tarfile.FIFOTYPE}, None),
], ids=["dotdot", "dotdot-inside", "absolute", "link-abs", "link-up", "hardlink", "device",
        "fifo"])
def test_a_hostile_tar_is_refused_whole_over_http(sb, raw, member):
    tar = _tar(({"name": "first.txt"}, b"would be first"), (dict(member[0]), member[1]),
               ({"name": "last.txt"}, b"would be last"))
    e = _err(raw.put("/files/archive", params={"path": "/scratch/x/dest"}, content=tar),
             400, "files")
    assert "nothing written" in e["message"] or "refused" in e["message"], e
    assert not sb.files.exists("/scratch/x")
    r = sb.exec(["sh", "-c", "ls /scratch; ls /escape.txt /scratch/escape.txt "
                 "/etc/escape.txt 2>/dev/null; true"])
    assert "escape" not in r.stdout and "x" not in r.stdout.split(), r.stdout
    with pytest.raises(FilesError):
        sb.files.write_archive("/scratch/x/dest", tar)


def test_an_upload_over_the_cap_is_413_and_writes_nothing(sb, raw):
    big = os.urandom(CAP + 4096)
    tar = _tar(({"name": "small.txt"}, b"small"), ({"name": "big.bin"}, big))
    _err(raw.put("/files/archive", params={"path": "/scratch/cap/tar"}, content=tar), 413,
         "too_large")
    # without a Content-Length (chunked): counted as it arrives
    def chunks():
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + 1 << 20]
    _err(raw.put("/files/content", params={"path": "/scratch/cap/raw.bin"},
                 content=chunks()), 413, "too_large")
    body = client._common.batch_body([("/scratch/cap/one.txt", b"1"),
                                      ("/scratch/cap/big.bin", big)])
    _err(raw.post("/files/batch", json=body), 413, "too_large")
    _err(raw.post("/files/upload", params={"path": "/scratch/cap/mp"},
                  files=[("f", ("one.txt", b"1")), ("f", ("big.bin", big))]), 413)
    with pytest.raises(client.ApiError) as ei:
        sb.files.write_files([("/scratch/cap/sdk1.txt", b"1"), ("/scratch/cap/sdk.bin", big)])
    assert ei.value.status == 413
    assert not sb.files.exists("/scratch/cap")
    r = sb.exec(["sh", "-c", "ls -A /scratch; find /scratch -name '.corral-write-*'"])
    assert "cap" not in r.stdout.split() and ".corral-write" not in r.stdout, r.stdout
    # just under the cap goes through
    ok = big[:CAP - (64 << 10)]
    assert sb.files.write("/scratch/under.bin", ok).path == "/scratch/under.bin"
    assert _sha_inside(sb, "/scratch/under.bin") == hashlib.sha256(ok).hexdigest()


# -- the tree ---------------------------------------------------------------------------------
def test_list_info_exists_remove_rename_make_dir(sb, raw):
    assert sb.files.make_dir("/scratch/tree/a/b") is True
    assert sb.files.make_dir("/scratch/tree/a/b") is False
    sb.files.write("/scratch/tree/a/b/f.txt", "f")
    sb.files.write("/scratch/tree/top.txt", "top")
    one = sb.files.list("/scratch/tree")
    assert [(e.name, e.type) for e in one] == [("a", "dir"), ("top.txt", "file")]
    deep = sb.files.list("/scratch/tree", depth=3)
    assert [e.path for e in deep] == ["/scratch/tree/a", "/scratch/tree/a/b",
                                      "/scratch/tree/a/b/f.txt", "/scratch/tree/top.txt"]
    i = sb.files.info("/scratch/tree/top.txt")
    assert (i.type, i.size, i.mode) == ("file", 3, 0o644)
    assert sb.files.exists("/scratch/tree/a") and not sb.files.exists("/scratch/tree/no")
    moved = sb.files.rename("/scratch/tree/top.txt", "/scratch/tree/a/moved.txt")
    assert (moved.path, moved.size) == ("/scratch/tree/a/moved.txt", 3)
    assert sb.exec("cat /scratch/tree/a/moved.txt").stdout == "top"
    sb.files.remove("/scratch/tree/a")
    assert sb.exec("ls -A /scratch/tree").stdout == ""
    with pytest.raises(FileNotFound):
        sb.files.info("/scratch/tree/a")
    with pytest.raises(FileNotFound):
        sb.files.remove("/scratch/tree/a")
    _err(raw.get("/files/list", params={"path": "/scratch", "depth": 0}), 422, "invalid")   # a query outside its schema
    with pytest.raises(FilesError, match="read-only"):
        sb.files.write("/usr/x", "no")


def test_watch_streams_changes_and_ends_with_the_sandbox(server, sb, raw):
    sb.files.make_dir("/scratch/w/sub")
    with sb.files.watch("/scratch/w", recursive=True) as w:
        assert w.path == "/scratch/w" and w.get_new_events() == []
        sb.files.write("/scratch/w/a.txt", "1")
        sb.exec("echo more > /scratch/w/sub/b.txt")
        seen = []
        while not any(e.name == "sub/b.txt" for e in seen):
            got = w.next_events(60)
            assert got, seen
            seen += got
        assert {"type": "add", "name": "sub/b.txt", "path": "/scratch/w/sub/b.txt"} in [
            e.to_dict() for e in seen]
        assert any(e.type in ("add", "rename") and e.name.startswith(("a.txt", ".corral"))
                   for e in seen)
    # SSE; the stream ends when the sandbox does
    with server.http(server.tokens["a"]) as h:
        r = h.post("/sandboxes", json={"policy": {}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        h.post(f"/sandboxes/{sid}/files/mkdir", json={"path": "/scratch/s"})
        with h.stream("GET", f"/sandboxes/{sid}/files/watch",
                      params={"path": "/scratch/s", "format": "sse"}) as s:
            assert s.status_code == 200 and s.headers["content-type"].startswith(
                "text/event-stream")
            lines = s.iter_lines()
            assert next(lines) == "event: watching"
            assert json.loads(next(lines)[6:]) == {"watching": "/scratch/s",
                                                   "recursive": False}
            h.put(f"/sandboxes/{sid}/files", json={"path": "/scratch/s/n.txt",
                                                   "content": "n"})
            while next(lines) != "event: add":
                pass
            assert json.loads(next(lines)[6:])["path"].startswith("/scratch/s/")
            assert h.delete(f"/sandboxes/{sid}").status_code == 200
            rest = list(lines)
        assert rest[-3:-1] == ["event: end", 'data: {"end": "the sandbox ended"}'], rest
    _err(raw.get("/files/watch", params={"path": "/scratch/none"}), 404, "files")
    # the SDK's Watcher ends with its sandbox, and says why
    with client.Sandbox.create({}, api_url=server.url, api_key=server.tokens["a"]) as sb2:
        sb2.files.make_dir("/scratch/e")
        w = sb2.files.watch("/scratch/e")
        client.Sandbox.connect(sb2.id, api_url=server.url,
                               api_key=server.tokens["a"]).kill()
        for _ in w:
            pass
        assert w.done and w.why == "the sandbox ended" and w.next_events(0) == []


@pytest.mark.slow      # 6-15 s: in the slow group, which CI runs too
def test_watches_are_bounded_per_sandbox(server, sb, raw):
    sb.files.make_dir("/scratch/many")
    ws = [sb.files.watch("/scratch/many") for _ in range(8)]
    try:
        e = _err(raw.get("/files/watch", params={"path": "/scratch/many"}), 429, "rate")
        assert e["field"] == "watch"
    finally:
        for w in ws:
            w.stop()
    for _ in range(600):              # each watch's thread lets its slot go
        with raw.stream("GET", "/files/watch", params={"path": "/scratch/many"}) as r:
            if r.status_code == 200:
                break
        time.sleep(0.05)
    assert r.status_code == 200


# -- code contexts ------------------------------------------------------------------------
def test_contexts_keep_variables_apart_and_restart_clears_them(sb):
    a = sb.create_context("python")
    b = sb.create_context("python", cwd="/tmp")
    assert isinstance(a, Context) and a.language == "python" and b.cwd == "/tmp"
    assert sb.run_code("x = 'in a'", context=a).error is None
    assert sb.run_code("x = 'in b'", context=b.id).error is None
    assert sb.run_code("x", context=a).text == "'in a'"
    assert sb.run_code("x", context=b).text == "'in b'"
    assert sb.run_code("import os; os.getcwd()", context=b).text == "'/tmp'"
    err = sb.run_code("x", context=None).error          # the default context: its own
    assert isinstance(err, ExecutionError) and err.name == "NameError"
    ids = {c.id for c in sb.list_contexts()}
    assert {a.id, b.id} <= ids
    sb.restart_context(a)
    gone = sb.run_code("x", context=a)
    assert gone.error.name == "NameError", gone
    assert sb.run_code("x", context=b).text == "'in b'"        # b untouched
    sb.remove_context(b)
    with pytest.raises(ContextError):
        sb.run_code("x", context=b)
    with pytest.raises(ContextError):
        sb.restart_context(b)
    assert b.id not in {c.id for c in sb.list_contexts()}
    with pytest.raises(ContextError, match="language"):
        sb.run_code("echo", language="bash", context=a)
    with pytest.raises(ContextError, match="nonexistent"):
        sb.create_context("python", cwd="/nonexistent")
    kinds = [(e["kind"], e["data"].get("id")) for e in sb.stream_events(follow=False)]
    assert ("context.created", a.id) in kinds and ("context.removed", b.id) in kinds


def test_a_bash_context_and_the_execution_shape(sb):
    c = sb.create_context("bash")
    sb.run_code("export GREETING=hi; cd /tmp", context=c)
    ex = sb.run_code("echo $GREETING $PWD; false", context=c)
    assert ex.logs.stdout == ["hi /tmp\n"] and ex.exit_code == 1, ex
    ex = sb.run_code("print('out'); 6 * 7")
    assert isinstance(ex.results[0], CodeResult) and ex.text == "42"
    assert ex.results[0].is_main_result and ex.logs.stdout == ["out\n"]
    assert ex.execution_count >= 1


def test_run_code_streams_as_the_cell_runs(server, sb):
    """The cell waits (up to its timeout) for a file only its first output, seen by the
    client, makes: its result comes only if that output arrived while it ran."""
    other = client.Sandbox.connect(sb.id, api_url=server.url, api_key=server.tokens["a"])
    seen = []

    def on_stdout(text):
        seen.append(("out", text))
        if len(seen) == 1:
            other.files.write("/scratch/go", "")

    code = ("import os, sys, time\nprint('first', flush=True)\n"
            "while not os.path.exists('/scratch/go'):\n    time.sleep(0.05)\n"
            "print('err', file=sys.stderr)\nraise ValueError('at the end')\n")
    ex = sb.run_code(code, timeout=60, on_stdout=on_stdout,
                     on_stderr=lambda t: seen.append(("err", t)),
                     on_result=lambda r: seen.append(("result", r)),
                     on_error=lambda e: seen.append(("error", e)))
    other._http.close()
    assert seen[0] == ("out", "first\n")
    assert ("err", "err\n") in seen
    assert seen[-1][0] == "error" and seen[-1][1].name == "ValueError"
    assert ex.error.name == "ValueError" and "at the end" in ex.error.traceback
    ex = sb.run_code("1 + 1", on_result=seen.append)
    assert ex.text == "2" and isinstance(seen[-1], CodeResult) and seen[-1].text == "2"


def test_a_stuck_cell_holds_only_its_own_context(server, sb):
    """A cell of context a waits for a file; meanwhile cells of b (and the default
    context) run, and b's cell makes the file; a restart kills a cell that never ends."""
    a, b = sb.create_context("python"), sb.create_context("python")
    done = {}

    def wait_in_a():
        done["a"] = sb.run_code("import os, time\nwhile not os.path.exists('/scratch/ab'):"
                                "\n    time.sleep(0.05)\n'a saw it'", context=a, timeout=120)

    t = threading.Thread(target=wait_in_a)
    t.start()
    other = client.Sandbox.connect(sb.id, api_url=server.url, api_key=server.tokens["a"])
    try:
        assert other.run_code("1 + 1").text == "2"
        assert other.run_code("open('/scratch/ab', 'w').close(); 'made'", context=b).text \
            == "'made'"
        t.join(120)
        assert done["a"].text == "'a saw it'", done["a"]
        # a cell that never ends: the restart kills it, its Execution says so
        t = threading.Thread(target=lambda: done.update(stuck=sb.run_code(
            "import time\nopen('/scratch/stuck', 'w').close()\nwhile True: time.sleep(1)",
            context=a, timeout=600)))
        t.start()
        for _ in range(600):          # poll every 50 ms until the cell runs
            if other.files.exists("/scratch/stuck"):
                break
            time.sleep(0.05)
        other.restart_context(a)
        t.join(120)
        assert done["stuck"].error.name == "ContextDied", done["stuck"]
        assert other.run_code("1", context=a).text == "1"
    finally:
        other._http.close()


def test_a_client_gone_mid_cell_leaves_the_cell_and_its_context(server, sb, raw):
    c = sb.create_context("python")
    with raw.stream("POST", "/run_code", params={"stream": "ndjson"}, json={
            "code": "import os, time\nprint('started', flush=True)\n"
                    "while not os.path.exists('/scratch/go2'):\n    time.sleep(0.05)\n"
                    "kept = 'set after the client left'", "context": c.id,
            "timeout": 120}) as s:
        first = json.loads(next(s.iter_lines()))
        assert first == {"type": "stdout", "data": "started\n"}
    # the connection is closed; the cell still waits for its file
    sb.files.write("/scratch/go2", "")
    ex = sb.run_code("kept", context=c, timeout=120)     # after the cell, in its context
    assert ex.text == "'set after the client left'", ex


def test_run_code_ndjson_lines_on_the_wire(raw):
    with raw.stream("POST", "/run_code", params={"stream": "ndjson"},
                    json={"code": "print('a')\n2 + 3"}) as s:
        assert s.status_code == 200
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert [x["type"] for x in lines] == ["stdout", "result", "end"]
    assert lines[0]["data"] == "a\n" and lines[1]["data"]["text"] == "5"
    assert lines[-1]["data"]["results"][0]["text"] == "5"
    _err(raw.post("/run_code", json={"code": "1", "context": "nope"}), 404, "context")
    _err(raw.post("/run_code", params={"stream": "ndjson"},
                  json={"code": "1", "context": "nope"}), 404, "context")
    _err(raw.post("/contexts", json={"language": "cobol"}), 422, "invalid")
    _err(raw.post("/contexts", json={"cwd": "/nonexistent"}), 400, "context")
    r = raw.post("/contexts", json={"language": "python"})
    assert r.status_code == 201 and set(r.json()) == {"id", "language", "cwd"}
    cid = r.json()["id"]
    assert raw.delete(f"/contexts/{cid}").json() == {"removed": cid}
    _err(raw.delete(f"/contexts/{cid}"), 404, "context")


def test_the_new_routes_are_in_the_openapi_document(server):
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    for path, method in [("/sandboxes/{sid}/files/content", "get"),
                         ("/sandboxes/{sid}/files/content", "put"),
                         ("/sandboxes/{sid}/files/batch", "post"),
                         ("/sandboxes/{sid}/files/upload", "post"),
                         ("/sandboxes/{sid}/files/archive", "put"),
                         ("/sandboxes/{sid}/files/info", "get"),
                         ("/sandboxes/{sid}/files/exists", "get"),
                         ("/sandboxes/{sid}/files", "delete"),
                         ("/sandboxes/{sid}/files/rename", "post"),
                         ("/sandboxes/{sid}/files/mkdir", "post"),
                         ("/sandboxes/{sid}/files/watch", "get"),
                         ("/sandboxes/{sid}/contexts", "post"),
                         ("/sandboxes/{sid}/contexts", "get"),
                         ("/sandboxes/{sid}/contexts/{cid}/restart", "post"),
                         ("/sandboxes/{sid}/contexts/{cid}", "delete")]:
        assert {"200", "401", "404", "413"} <= set(paths[path][method]["responses"]) | {
            "200"}, (path, method)


# -- async -----------------------------------------------------------------------------------
def test_async_files_watch_and_contexts(server):
    async def main():
        async with await client.AsyncSandbox.create(
                {}, api_url=server.url, api_key=server.tokens["a"]) as sb:
            data = bytes(range(256)) + os.urandom(2 << 20)
            w = await sb.files.write("/scratch/a/bin", data)
            assert w.path == "/scratch/a/bin"
            assert await sb.files.read("/scratch/a/bin", format="bytes") == data
            got = b""
            async for chunk in await sb.files.read("/scratch/a/bin", format="stream"):
                got += chunk
            assert got == data
            out = await sb.files.write_files([("/scratch/a/x.txt", "x"),
                                              {"path": "/scratch/a/y.txt", "data": b"y"}])
            assert [o.name for o in out] == ["x.txt", "y.txt"]
            assert [e.name for e in await sb.files.list("/scratch/a")] == ["bin", "x.txt",
                                                                           "y.txt"]
            assert await sb.files.exists("/scratch/a/x.txt")
            assert (await sb.files.info("/scratch/a/y.txt")).size == 1
            assert (await sb.files.rename("/scratch/a/y.txt", "/scratch/a/z.txt")).name == \
                "z.txt"
            assert await sb.files.make_dir("/scratch/a/d") is True
            await sb.files.remove("/scratch/a/x.txt")
            assert not await sb.files.exists("/scratch/a/x.txt")
            with pytest.raises(FileNotFound):
                await sb.files.read("/scratch/a/x.txt")
            with pytest.raises(FilesError):
                await sb.files.write_archive("/scratch/t", _tar(({"name": "../e"}, b"e")))
            assert not await sb.files.exists("/scratch/t")
            async with await sb.files.watch("/scratch/a") as watch:
                await sb.files.write("/scratch/a/new.txt", "n")
                seen = []
                while "new.txt" not in [e.name for e in seen]:
                    more = await watch.next_events(60)
                    assert more, seen
                    seen += more
            a = await sb.create_context("python")
            b = await sb.create_context("python")
            await sb.run_code("v = 1", context=a)
            await sb.run_code("v = 2", context=b)
            assert (await sb.run_code("v", context=a)).text == "1"
            assert (await sb.run_code("v", context=b)).text == "2"
            await sb.restart_context(a)
            assert (await sb.run_code("v", context=a)).error.name == "NameError"
            assert (await sb.run_code("v", context=b)).text == "2"
            streamed = []
            ex = await sb.run_code("print('s'); v * 21", context=b,
                                   on_stdout=streamed.append,
                                   on_result=lambda r: streamed.append(r.text))
            assert ex.text == "42" and streamed == ["s\n", "42"]
            await sb.remove_context(a)
            assert a.id not in [c.id for c in await sb.list_contexts()]
            with pytest.raises(ContextError):
                await sb.run_code("v", context=a)

    asyncio.run(main())
