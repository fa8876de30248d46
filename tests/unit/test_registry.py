"""The registry of detached live sandboxes (runtime/registry.py; issue 16: "a small
registry in corral's state directory, owner-only"): what it writes, and what it refuses to
trust when it reads: a directory that is a link or open to others, an entry that is a
link, another uid's, writable by others, too big, malformed, or whose supervisor is gone.
On a temporary base directory; no sandbox."""

from __future__ import annotations

import fcntl
import json
import os
import stat

import pytest

from corral.errors import SandboxClosed, UsageError
from corral.runtime import registry

SID = "0123456789ab"


def _entry(sid: str = SID, **over) -> dict:
    e = {"id": sid, "pid": 4242, "socket": f"/run/corral/{sid}/sock", "created": 1.0,
         "ends": 2.0, "isolation": "namespace", "policy_digest": "sha256:" + "0" * 64,
         "metadata": {"k": "v"}}
    e.update(over)
    return e


@pytest.fixture
def base(tmp_path):
    b = str(tmp_path / "base")
    yield b


def _hold(base: str, sid: str = SID) -> int:
    """A run directory whose lock is held, as a live supervisor holds it."""
    os.makedirs(os.path.join(base, sid), exist_ok=True)
    fd = os.open(os.path.join(base, sid, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_written_owner_only_and_read_back(base):
    lock = _hold(base)
    try:
        path = registry.write_entry(_entry(), base)
        d = registry.registry_dir(base)
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o600)
        assert os.listdir(d) == [SID + ".json"]          # no temporary file left
        assert registry.read_entry(SID, base) == _entry()
        assert [e["id"] for e in registry.entries(base)] == [SID]
    finally:
        os.close(lock)


def test_a_stale_entry_is_left_out_and_removed(base):
    registry.write_entry(_entry(), base)        # no run directory, no lock held
    assert registry.read_entry(SID, base) is None
    assert os.listdir(registry.registry_dir(base)) == []
    lock = _hold(base)
    os.close(lock)                              # a supervisor that died: lock free
    registry.write_entry(_entry(), base)
    assert registry.entries(base) == []


@pytest.mark.parametrize("how", ["group", "others", "link"])
def test_a_directory_open_to_others_or_a_link_is_refused(base, tmp_path, how):
    registry.write_entry(_entry(), base)
    d = os.path.join(base, "sandboxes")
    if how == "link":
        real = str(tmp_path / "elsewhere")
        os.rename(d, real)
        os.symlink(real, d)
    else:
        os.chmod(d, 0o750 if how == "group" else 0o705)
    with pytest.raises(SandboxClosed, match="mode 0700"):
        registry.read_entry(SID, base)
    with pytest.raises(SandboxClosed):
        registry.write_entry(_entry("0123456789ac"), base)


def test_untrusted_entries_are_not_read(base, tmp_path):
    lock = _hold(base)
    try:
        path = registry.write_entry(_entry(), base)
        assert registry.read_entry(SID, base) is not None
        # writable by others
        for mode in (0o620, 0o602):
            os.chmod(path, mode)
            assert registry.read_entry(SID, base) is None, oct(mode)
        os.chmod(path, 0o600)
        # another uid's (root can make one)
        if os.geteuid() == 0:
            os.chown(path, 65534, 65534)
            assert registry.read_entry(SID, base) is None
            os.chown(path, 0, 0)
        assert registry.read_entry(SID, base) is not None
        # a link to a good entry elsewhere is not followed
        good = tmp_path / "good.json"
        good.write_text(json.dumps(_entry()))
        os.chmod(good, 0o600)
        os.unlink(path)
        os.symlink(good, path)
        assert registry.read_entry(SID, base) is None
        os.unlink(path)
        # malformed: not JSON, another id, a field missing, one too many, a wrong type
        for body in (b"{", json.dumps(_entry("0123456789ac")).encode(),
                     json.dumps({k: v for k, v in _entry().items() if k != "pid"}).encode(),
                     json.dumps({**_entry(), "extra": 1}).encode(),
                     json.dumps(_entry(pid=True)).encode(),
                     json.dumps(_entry(metadata=[])).encode(),
                     b" " * (registry.MAX_ENTRY + 1)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, body)
            os.close(fd)
            assert registry.read_entry(SID, base) is None, body[:80]
    finally:
        os.close(lock)


@pytest.mark.parametrize("sid", ["../../etc", "0123456789AB", "0123456789a", "", None, 7,
                                 "0123456789ab/"])
def test_only_an_id_names_an_entry(base, sid):
    with pytest.raises(UsageError):
        registry.read_entry(sid, base)
    with pytest.raises(UsageError):
        registry.write_entry(_entry(sid), base)
