ID = "term.dev-tty"
CATEGORY = "terminal"
DESCRIPTION = ("open /dev/tty (the caller's controlling terminal) and write escape sequences to it "
               "directly, past corral's neutralised output")
CLAIMS = ("rule:limits.output",)
# The probe's terminal runs (TTY = True) make the pty the controlling terminal of
# `corral run`, as a user's shell does; the host control writes to it through /dev/tty.
CODE = """
try:
    fd = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY)
except OSError as e:
    if ON_HOST:
        out("UNSUPPORTED", f"/dev/tty: {ename(e)}: the probe's terminal run has no controlling terminal")
    else:
        out("DENIED", f"/dev/tty: {ename(e)}")
else:
    os.write(fd, b"\\x1b]0;owned-by-dev-tty\\x07")
    out("ALLOWED", "wrote to /dev/tty directly")
"""
CONTROL = "host"
CONTAINED = "the sandbox has no controlling terminal: nothing it writes reaches the terminal unneutralised"
TTY = True


def score(obs):
    if "\x1b]0;owned-by-dev-tty" in obs.stdout:
        return False, "a raw OSC written to /dev/tty reached the terminal"
    for tag in ("UNSUPPORTED", "ALLOWED", "DENIED"):
        d = obs.tag(tag)
        if d is not None:
            return {"UNSUPPORTED": None, "ALLOWED": False, "DENIED": True}[tag], (
                "unsupported: " + d if tag == "UNSUPPORTED" else d)
    return None, "inconclusive: no PROBE line"
