"""The microvm tier's workspace copy-in (backends/microvm_ws.py) against a workspace that
changes under it (a file swapped for a FIFO between the listing and the open) or nests
deeper than a walk can go: a bounded, clean answer, never a hang or a traceback."""

import io
import os
import tarfile
import threading

import pytest

from corral.backends import microvm_ws
from corral.errors import UnsupportedRule


class _Listing:
    def __init__(self, entries):
        self.entries = entries

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        return iter(self.entries)


def test_file_swapped_for_a_fifo_after_listing_is_skipped_not_opened(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("kept")
    victim = tmp_path / "b.txt"
    victim.write_text("x")
    real = os.scandir

    def racing_scandir(fd):
        with real(fd) as it:
            entries = list(it)
        for e in entries:
            e.stat(follow_symlinks=False)     # listed (and lstat'ed) as a regular file
        if victim.exists() and victim.is_file():
            victim.unlink()
            os.mkfifo(victim)                 # ... then swapped, before it is opened
        return _Listing(entries)

    monkeypatch.setattr(microvm_ws.os, "scandir", racing_scandir)
    got: dict = {}

    def run():
        try:
            got["value"] = microvm_ws.pack(str(tmp_path))
        except BaseException as e:   # noqa: BLE001 - reported below
            got["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():   # blocked in open(2) of the FIFO: let it go, then fail
        fd = os.open(victim, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
        pytest.fail("pack() blocked opening a FIFO swapped in after the listing")
    assert "error" not in got, got.get("error")
    data, skipped = got["value"]
    assert skipped == 1
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == ["a.txt"]


def test_deep_nesting_is_refused_in_one_line(tmp_path, monkeypatch):
    # a bound lowered for the test: a tree deeper than Python's recursion limit would also
    # break pytest's own recursive cleanup of tmp_path
    monkeypatch.setattr(microvm_ws, "MAX_DEPTH", 20)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(40):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
    finally:
        os.close(fd)
    with pytest.raises(UnsupportedRule, match="deep"):
        microvm_ws.pack(str(tmp_path))
