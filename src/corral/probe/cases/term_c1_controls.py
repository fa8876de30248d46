ID = "term.c1-controls"
CATEGORY = "terminal"
DESCRIPTION = ("8-bit C1 controls instead of ESC: U+009B (CSI) to clear the line and U+009D (OSC) "
               "to set the title, shown by `corral run` on a terminal")
CLAIMS = ("rule:limits.output",)
CODE = """
sys.stdout.write("FAILED\\r\\u009b2KPASSED\\u009d0;owned\\u009c\\n")
sys.stdout.flush()
"""
CONTROL = "host"
CONTAINED = "on a terminal, corral shows C1 controls neutralised: no raw U+0080..U+009F reaches it"
TTY = True


def score(obs):
    raw = [f"U+{ord(c):04X}" for c in sorted(set(obs.stdout)) if 0x80 <= ord(c) <= 0x9F]
    if raw:
        return False, "raw C1 controls reached the terminal: " + ", ".join(raw)
    if "PASSED" not in obs.stdout:
        return None, "inconclusive: the output did not reach the terminal"
    return True, "the terminal got the text with its C1 controls neutralised"
