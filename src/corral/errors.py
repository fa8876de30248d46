"""One tree of errors, each carrying the exit status `corral` uses for it.

    CorralError
    ├── PolicyError          exit 2   a field of the policy (or a flag) is wrong; names it and the fix
    ├── UsageError           exit 2   the command line itself is wrong
    ├── UnsupportedRule      exit 3   this tier cannot enforce a rule the user set explicitly
    ├── BackendUnavailable   exit 3   the tier's mechanism is missing on this host
    ├── ImageError           exit 4   an image cannot be found, built, imported or installed into
    ├── SandboxSetupError    exit 125 corral failed while building the sandbox (step, errno)
    └── SandboxClosed        exit 125 a live sandbox has ended (killed, timed out, its init died)

No command has run when any of these is raised, but for a SandboxSetupError of step
"handover": a live sandbox's command had started when handing it over to its supervisor
failed, and it was killed (and reaped) before anyone watched it; its output and status
mean nothing. Messages are one line and never contain a secret value.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """`text` with every character that is not printable (controls, line and paragraph
    separators, other spaces than " ") shown as an escape: \\n, \\x7f, \\u2028."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


class CorralError(Exception):
    """Every error corral raises: a one-line message, the field it is about, an exit status."""

    kind = "error"
    exit_code = 125

    def __init__(self, message: str, *, field: str | None = None) -> None:
        # one line, whatever text of the input a message quotes (a key, a rule, a value's
        # repr is already escaped, the text itself may not be): a newline, CR, another
        # control or a line separator becomes a visible escape
        if not message.isprintable():
            message = one_line(message)
        if field is not None and not field.isprintable():
            field = one_line(field)
        super().__init__(message)
        self.message = message
        self.field = field

    def to_dict(self) -> dict:
        return {"kind": self.kind, "field": self.field, "message": self.message}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class PolicyError(CorralError, ValueError):
    """A field of the policy (or a flag) is wrong; the message names it and the fix."""

    kind = "policy"
    exit_code = 2


class UsageError(CorralError):
    """The command line itself is wrong."""

    kind = "usage"
    exit_code = 2


def option_values(args: list[str], names, end: str | None = None):
    """Walk a command line: (name, value) for an option of `names`, given as `NAME VALUE`
    or `NAME=VALUE`, and (None, arg) for any other argument; an option with no value left
    is a UsageError. From `end` on (`--`, say), every argument is (None, arg)."""
    it = iter(args)
    for a in it:
        if a == end:
            yield None, a
            for b in it:
                yield None, b
            return
        name, eq, inline = a.partition("=")
        if name not in names:
            yield None, a
        elif eq:
            yield name, inline
        else:
            v = next(it, None)
            if v is None:
                raise UsageError(f"{name} needs a value", field=name)
            yield name, v


class UnsupportedRule(CorralError):
    """This tier cannot enforce a rule the user set explicitly; nothing ran."""

    kind = "unsupported"
    exit_code = 3


class BackendUnavailable(CorralError):
    """The tier's mechanism is missing on this host; nothing ran."""

    kind = "unavailable"
    exit_code = 3


class ImageError(CorralError):
    kind = "image"
    exit_code = 4


class SandboxSetupError(CorralError):
    """corral failed while building the sandbox: the step, and the errno if one."""

    kind = "setup"
    exit_code = 125

    def __init__(self, message: str, *, step: str, errno: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.step = step
        self.errno = errno

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["step"] = self.step
        d["errno"] = self.errno
        return d

    def __str__(self) -> str:
        return f"setup step {self.step}: {self.message}"


class SandboxClosed(CorralError):
    """A live sandbox has ended (killed, timed out, idle, or its init died): nothing more
    runs in it."""

    kind = "closed"
    exit_code = 125
