"""The gvisor live tier's reading of `runsc ps`: the table a command's kill walks. CMD is
the process's own name, so a forged line must never hide a descendant from the kill."""

from corral.backends.gvisor_live import _descendants, parse_ps

HEAD = b"UID       PID       PPID      C         TTY       STIME     TIME      CMD\n"


def test_a_command_and_its_descendants_not_its_siblings():
    out = HEAD + (b"0 1 0 0 ? 22:41 0s sh\n0 2 1 0 ? 22:41 0s sleep\n"
                  b"0 7 0 0 ? 22:41 0s sh\n0 9 7 0 ? 22:41 0s sleep\n"
                  b"0 11 9 0 ? 22:41 0s sh\n0 12 0 0 ? 22:41 0s other\n")
    table = parse_ps(out)
    assert _descendants(table, 7) == {7, 9, 11}
    assert _descendants(table, 12) == {12}
    assert _descendants(table, 99) == set()     # gone already


def test_a_forged_line_in_a_name_adds_parents_and_never_removes_one():
    # pid 9 (child of 7) names itself "x\n0 9 1 0" to look like init's child
    out = HEAD + (b"0 1 0 0 ? 22:41 0s sh\n0 7 0 0 ? 22:41 0s sh\n"
                  b"0 9 7 0 ? 22:41 0s x\n0 9 1 0 ? 22:41 0s y\n"
                  b"junk line\n0 x 7\n-1 5 7 0\n")
    table = parse_ps(out)
    assert table[9] == {7, 1} and 5 not in table
    assert 9 in _descendants(table, 7)
