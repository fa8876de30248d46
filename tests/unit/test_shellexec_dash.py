"""shellexec.shell_is_dash: the name of the file /bin/sh's links end at, read link by link
by the kernel (not realpath's walk in Python), on real links in a temporary tree."""

from __future__ import annotations

import os

from corral.linux.shellexec import shell_is_dash


def _tree(tmp_path):
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "dash").write_bytes(b"\x7fELF")
    (tmp_path / "usr" / "bin" / "bash").write_bytes(b"\x7fELF")
    os.symlink("usr/bin", tmp_path / "bin")          # a merged /usr, as Debian's
    return tmp_path


def test_the_name_at_the_end_of_the_links_as_realpath_gives_it(tmp_path):
    t = _tree(tmp_path)
    cases = {"sh1": "dash", "sh2": str(t / "usr" / "bin" / "dash"), "sh3": "sh1",
             "sh4": "../bin/dash", "sh5": "bash", "sh6": "../../usr/bin/sh1"}
    for name, target in cases.items():
        os.symlink(target, t / "usr" / "bin" / name)
    for name in cases:
        path = str(t / "bin" / name)       # through the directory link, as /bin/sh is
        want = os.path.basename(os.path.realpath(path)).startswith("dash")
        assert shell_is_dash(path) is want, name
    assert [shell_is_dash(str(t / "bin" / n)) for n in ("sh1", "sh3", "sh5")] == [
        True, True, False]


def test_a_file_itself_is_named_for_what_it_is(tmp_path):
    t = _tree(tmp_path)
    assert shell_is_dash(str(t / "bin" / "dash")) is True
    assert shell_is_dash(str(t / "bin" / "bash")) is False


def test_no_shell_a_loop_or_a_dangling_link_is_not_dash(tmp_path):
    """Where /bin/sh would not run at all, the line goes to the shell, which says so:
    never exec'd directly on the strength of a name (realpath names a dangling link's
    target, and gives up on a loop with a name of its own)."""
    t = _tree(tmp_path)
    os.symlink("dash2", t / "usr" / "bin" / "loop1")
    os.symlink("loop1", t / "usr" / "bin" / "dash2")
    os.symlink("missing/dash", t / "usr" / "bin" / "dangling")
    for name in ("loop1", "dash2", "dangling", "absent"):
        assert shell_is_dash(str(t / "bin" / name)) is False, name
