"""A shell command line that /bin/sh would only exec, exec'd without the shell.

`sb.commands.run("ls -la /tmp")` runs `/bin/sh -c "ls -la /tmp"`. When the line is one
simple command of plain words (simple_words), the shell adds nothing but its own exec
(about 1 ms inside a sandbox): the command's entrant, already inside the sandbox and
confined as the command (linux/enter.py), then resolves the program itself (resolve)
and execs it directly, with what dash would have given it:

- argv: the words as typed (argv[0] too), the program found by dash's PATH search (the
  first regular file named so along PATH);
- env: what dash exports: the variables with valid shell names (dash drops the others),
  PWD set as dash sets it (kept if it names the working directory, else its physical
  path); a line whose environment holds IFS, OPTIND, PPID or LINENO (dash sets
  them itself) keeps the shell;
- a death by a signal the program met on its own (SIGSEGV, an abort, a kill from inside)
  is turned into what dash reports for its child: exit status 128+N and the signal's
  description on stderr (none for SIGINT and SIGPIPE) (as_shell_status).

Whenever the answer could differ, the entrant runs /bin/sh -c as before: /bin/sh inside
is not dash, PATH is unset or holds a relative entry, the word names no file (so the
shell's own "not found" and 127 come from the shell), the file found is not a readable,
executable ELF or #! script (dash runs a script without #! itself), the word is a shell
keyword or a builtin (`true` alone too: dash runs it without a fork or an exec, so
finding /usr/bin/true first only costs more, ~0.3 ms measured); and when the program's exec fails after all (a #! line
naming no interpreter), the entrant runs the shell then (nothing ran). Only the order of the environment's entries may differ
from dash's (which lists them from its hash table).
"""

from __future__ import annotations

import os
import stat

#: bytes a word may hold: nothing the shell expands, quotes, globs, redirects or splits
_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./,:+@%")
#: dash's builtins and reserved words: never exec'd as a program of that name
_SHELL_NAMES = frozenset((
    ".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo",
    "eval", "exec", "exit", "export", "false", "fg", "getopts", "hash", "jobs", "kill",
    "local", "printf", "pwd", "read", "readonly", "return", "set", "shift", "test",
    "times", "trap", "true", "type", "ulimit", "umask", "unalias", "unset", "wait",
    "!", "case", "do", "done", "elif", "else", "esac", "for", "if", "in", "then", "until",
    "while", "{", "}", "function", "select", "time"))
#: variables dash sets itself even when its environment has them (their values are then
#: its own): a command line with one of them in its environment keeps the shell
_SHELL_SETS = (b"IFS", b"OPTIND", b"PPID", b"LINENO")
#: dash prints no description for a child's death by these (SIGINT, SIGPIPE)
_QUIET_SIGNALS = (2, 13)


def simple_words(line: str) -> list[str] | None:
    """The words of `line` if it is one simple command the shell would only exec (plain
    words separated by spaces or tabs, the first neither a keyword nor a builtin), else
    None."""
    if len(line) > 4096 or not line.isascii():
        return None
    words = line.replace("\t", " ").split(" ")
    words = [w for w in words if w]
    if not words:
        return None
    for w in words:
        if not _WORD.issuperset(w.encode()):
            return None
    first = words[0]
    if first in _SHELL_NAMES:
        return None
    if "/" in first and not first.startswith("/"):
        return None       # relative to the working directory: left to the shell
    return words


#: symbolic links followed at most (the kernel's own limit, MAXSYMLINKS)
_LINKS_MAX = 40


def shell_is_dash(path: str = "/bin/sh") -> bool:
    """Whether /bin/sh (as this process sees it: inside the sandbox) is dash: the name of
    the file its links end at. Each link is read by the kernel, which resolves the
    directories on the way (so the name is realpath's last one), instead of realpath's
    walk in Python, whose objects an entrant copies page by page (it runs this for every
    command). A loop, or more than _LINKS_MAX links: not dash (the shell runs the line
    and says what it says)."""
    for _ in range(_LINKS_MAX + 1):
        try:
            target = os.readlink(path)
        except OSError as e:
            if e.errno != 22:      # EINVAL: not a link, the file itself
                return False       # missing, unreadable: not a shell to trust
            return path.rsplit("/", 1)[-1].startswith("dash")
        path = target if target.startswith("/") else path.rsplit("/", 1)[0] + "/" + target
    return False


def resolve(name: bytes, env: dict[bytes, bytes]) -> bytes | None:
    """The program dash would exec for command `name` with environment `env`, if
    exec'ing it directly gives what dash gives; else None (run the shell)."""
    if any(k in env for k in _SHELL_SETS):
        return None
    if b"/" in name:
        found = name
        try:
            st = os.stat(found)
        except OSError:
            return None
    else:
        path = env.get(b"PATH")
        if not path:
            return None
        found = None
        for d in path.split(b":"):
            if not d.startswith(b"/"):
                return None     # the working directory (dash's empty entry) or relative
            try:
                st = os.stat(d.rstrip(b"/") + b"/" + name)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found = d.rstrip(b"/") + b"/" + name
                break
        if found is None:
            return None         # "not found": the shell says so, in its words
    if not stat.S_ISREG(st.st_mode) or not os.access(found, os.X_OK):
        return None
    head = read_head(found, 4)
    if head is None or head != b"\x7fELF" and not head.startswith(b"#!"):
        return None             # dash runs a script without #! itself
    return found


def read_head(path: str | bytes | os.PathLike, n: int) -> bytes | None:
    """The first `n` bytes (fewer if the file is shorter) of the file at `path`, or None if
    it cannot be opened or read (as the caller's process: its confinement applies). Opened
    without waiting (a FIFO) and without becoming a terminal's controlling process."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, n)
    except OSError:
        return None
    finally:
        os.close(fd)


def _shell_name(k: bytes) -> bool:
    return bool(k) and not k[:1].isdigit() and (k.replace(b"_", b"").isalnum()
                                               and k.isascii())


def shell_env(env: dict[bytes, bytes], cwd: bytes) -> dict[bytes, bytes]:
    """The environment dash gives its child: the variables with shell names, and PWD
    (kept when it is absolute and names the working directory, else its physical
    path)."""
    out = {k: v for k, v in env.items() if _shell_name(k)}
    pwd = out.get(b"PWD")
    keep = False
    if pwd is not None and pwd.startswith(b"/"):
        try:
            a, b = os.stat(pwd), os.stat(cwd)
            keep = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        except OSError:
            keep = False
    if not keep:
        try:
            out[b"PWD"] = os.path.realpath(cwd)
        except OSError:
            return env
    return out


def as_shell_status(status: int) -> tuple[int, bytes]:
    """(wait status, stderr text) that dash reports for a child that ended with
    `status`: a death by signal N becomes exit 128+N with the signal's description."""
    if not os.WIFSIGNALED(status):
        return status, b""
    import signal

    n = os.WTERMSIG(status)
    text = b""
    if n not in _QUIET_SIGNALS:
        what = signal.strsignal(n) or f"Signal {n}"
        if os.WCOREDUMP(status):
            what += " (core dumped)"
        text = what.encode() + b"\n"
    return ((128 + n) & 0xFF) << 8, text
