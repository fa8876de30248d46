"""Why an exec failed with ENOENT although the program exists: the interpreter its `#!`
line names is missing inside the sandbox.

The classic case is a venv made on the host: `.venv/bin/pytest` starts with
`#!/home/me/proj/.venv/bin/python`, a path that does not exist when the workspace is at
/workspace (use `mount_at = "same"`). The kernel reports ENOENT for the script itself, so
bwrap says `execvp .venv/bin/pytest: No such file or directory`, which misleads. Each tier
asks here after such a failure and, if the interpreter is the missing part, reports:

    corral: /home/me/proj/.venv/bin/pytest: its interpreter /home/me/proj/.venv/bin/python is missing inside the sandbox

The answer must come from the sandbox's own view (its mounts, its PATH, its cwd), never
from the host's, and the file is the sandbox's to write, so it is read inside:

- namespace and gvisor: `explain(argv0, run)` runs SCRIPT (POSIX sh) in the same sandbox
  with `run`, one extra short exec, only after an exec failed that way;
- process: the sandboxed child itself calls `explain_here()` after its execvpe failed
  (it already runs under the sandbox's Landlock rules and uid).
"""

from __future__ import annotations

import os

#: resolve $1 as execvp does (PATH, cwd), read its #! line (the kernel reads 256 bytes;
#: the interpreter is the first word after #!), and print "INTERPRETER\nPATH" only if that
#: interpreter does not exist here; otherwise print nothing
SCRIPT = r"""p=$(command -v "$1") || exit 0
[ -f "$p" ] || exit 0
l=$(head -c 256 "$p" | head -n 1)
case $l in '#!'*) ;; *) exit 0 ;; esac
l=${l#??}
set -f; set -- $l; set +f
[ $# -gt 0 ] || exit 0
[ -e "$1" ] && exit 0
printf '%s\n%s' "$1" "$p"
"""
#: the longest report kept (sandbox-written text: bounded)
MAX_REPORT = 4096


def message(path: str, interp: str) -> str:
    """The one line a tier reports (no newline)."""
    return (f"corral: {_shown(path)}: its interpreter {_shown(interp)} is missing inside "
            f"the sandbox")


def _shown(text: str) -> str:
    """Sandbox-written text made safe to print: a \\r (a script saved with CRLF, a common
    cause) and any other control or non-printable character shown escaped, cut short."""
    text = text[:300]
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def parse_report(out: str) -> str | None:
    """message() from SCRIPT's output, or None when it printed nothing usable."""
    interp, nl, path = out[:MAX_REPORT].partition("\n")
    if not nl or not interp or not path:
        return None
    return message(path, interp)


def explain(argv0: str, run) -> str | None:
    """After an exec of argv0 failed with ENOENT: message() if the missing file is the
    interpreter of its #! line, else None. `run(argv)` runs argv in the same sandbox (same
    mounts, environment and cwd) and returns its Result; it must not explain again."""
    try:
        r = run(["/bin/sh", "-c", SCRIPT, "sh", argv0])
    except Exception:   # noqa: BLE001 - a diagnosis never replaces the real failure
        return None
    if r.exit_code != 0 or r.signal is not None:
        return None
    return parse_report(r.stdout)


def interpreter_of(head: bytes) -> bytes | None:
    """The interpreter a script's first bytes name, as the kernel reads it: after `#!`
    and any blanks, up to the next blank or the end of the line; None if not a script."""
    if not head.startswith(b"#!"):
        return None
    words = head[2:256].split(b"\n", 1)[0].replace(b"\t", b" ").split(b" ")
    word = next((w for w in words if w), b"")
    return word or None


def explain_here(argv0: str, path_env: str | None) -> str | None:
    """explain() for a process already in the sandbox (the process tier's child after
    its execvpe failed): looks argv0 up as execvp does, in this process's own view."""
    import stat

    candidates = [argv0] if "/" in argv0 else [
        os.path.join(d or ".", argv0) for d in (path_env or os.defpath).split(":")]
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
                continue
            interp = interpreter_of(os.read(fd, 256))
        except OSError:
            continue
        finally:
            os.close(fd)
        if interp is None:
            return None
        if os.path.exists(interp):
            return None
        return message(path, os.fsdecode(interp))
    return None
