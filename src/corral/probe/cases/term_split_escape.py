ID = "term.split-escape"
CATEGORY = "terminal"
DESCRIPTION = ("an OSC 52 clipboard write split across writes and preceded by a lone UTF-8 lead "
               "byte, to slip past a filter that works write by write or byte by byte")
CLAIMS = ("rule:limits.output",)
CODE = """
for part in (b"ok \\xc3", b"\\x1b", b"]52;c;", b"aWQK\\x07", b" \\xe2\\x80", b"\\x1b[2J done\\n"):
    os.write(1, part)
    time.sleep(0.05)
"""
CONTROL = "host"
CONTAINED = "on a terminal, no raw ESC reaches it, however the sequence is cut"
TTY = True


def score(obs):
    if "\x1b" in obs.stdout:
        i = obs.stdout.index("\x1b")
        return False, f"a raw ESC reached the terminal: {obs.stdout[i:i + 8]!r}"
    if "done" not in obs.stdout:
        return None, "inconclusive: the output did not reach the terminal"
    return True, "the terminal got the text with every ESC neutralised"
