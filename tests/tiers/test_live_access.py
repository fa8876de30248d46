"""Who may reach a detached live sandbox (issue 16: `Sandbox.connect(id)` "from another
process on the same host", through "a small registry in corral's state directory,
owner-only"): its supervisor's socket is mode 0600, and a peer of another uid that gets
through anyway (the mode loosened by hand) is answered nothing (SO_PEERCRED), while the
owner's uid is served. Real supervisor, real namespace sandbox, a real second uid."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import tier_unavailable

import corral
from corral.errors import UsageError

pytestmark = [
    pytest.mark.skipif(tier_unavailable("namespace") is not None,
                       reason=f"namespace tier: {tier_unavailable('namespace')}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs a client as another uid: needs root"),
]

NOBODY = 65534
#: a client of the supervisor's protocol (runtime/supervisor.py: 4-byte length, JSON), run
#: as another uid with the system python and nothing of corral (the checkout may be closed
#: to that uid): prints what came back, or why it could not connect
CLIENT = r"""
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:" + type(e).__name__)
    sys.exit(0)
req = json.dumps({"op": "info"}).encode()
got = b""
try:
    s.sendall(struct.pack(">I", len(req)) + req)
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
except (BrokenPipeError, ConnectionResetError):
    pass         # closed by the server, before or after the request: no answer either way
print("answer:" + repr(got))
"""


def _as_nobody(sock_path: str) -> str:
    r = subprocess.run(["/usr/bin/python3", "-I", "-c", CLIENT, sock_path], user=NOBODY,
                       group=NOBODY, extra_groups=[], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_another_uid_reaches_no_detached_sandbox():
    from corral.runtime import registry

    sb = corral.Sandbox.create({}, timeout=120, detached=True, metadata={"k": "v"})
    try:
        entry = registry.read_entry(sb.id)
        assert entry is not None and entry["id"] == sb.id
        sock = entry["socket"]
        st = os.lstat(sock)
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o600)
        d = registry.registry_dir()
        assert os.lstat(d).st_mode & 0o777 == 0o700
        # the file mode keeps another uid out
        assert _as_nobody(sock) == "connect:PermissionError"
        # with the mode loosened by hand, the supervisor still answers that uid nothing:
        # no frame, the connection closed
        os.chmod(sock, 0o666)
        try:
            assert _as_nobody(sock) == "answer:b''"
        finally:
            os.chmod(sock, 0o600)
        # and the owner is served, from another process too
        again = corral.Sandbox.connect(sb.id)
        assert again.get_info().metadata == {"k": "v"}
        assert again.commands.run("echo $((6*7))").stdout == "42\n"
        # what the supervisor does not serve says so (docs/sessions.md)
        for name in ("files", "pty", "run_code", "changes"):
            with pytest.raises(UsageError, match="Sandbox.connect"):
                getattr(again, name)
        with pytest.raises(AttributeError):
            assert again.no_such_thing is None   # never reached
    finally:
        sb.kill()


def test_the_largest_metadata_fits_a_detached_sandbox():
    """Metadata as large as Sandbox.create takes (64 keys of 128 characters, values of
    1024) in characters JSON spells longest (12 bytes each): a detached sandbox's registry
    entry holds it (it was capped at 64 KiB: "registry entry too large" for valid
    metadata), and connect() reads it back."""
    md = {f"{i:03d}" + "\U0001F600" * 125: "\U0001F600" * 1024 for i in range(64)}
    sb = corral.Sandbox.create({}, timeout=60, detached=True, metadata=md)
    try:
        again = corral.Sandbox.connect(sb.id)
        assert again.get_info().metadata == md
        assert again.commands.run("echo ok").stdout == "ok\n"
    finally:
        sb.kill()
