"""run_code's wire (runtime/session.py): the length-prefixed JSON frames an interpreter
sends, read strictly and with a bound (everything in them is hostile; a lone surrogate,
which JSON can escape and node's strings hold, becomes U+FFFD), and how each
language's interpreter is started inside the sandbox (the python boot line, node's
runner, bash's setup line and its quoting)."""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct

from .execution import BASE64_MIMES

HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The interpreter sent something that is not a valid message."""


class FrameReader:
    """Length-prefixed JSON frames from bytes as they come; strict and bounded."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[dict, int]]:
        """Each whole frame now in the buffer: (the message, its size in bytes)."""
        self.buf += data
        out = []
        while len(self.buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self.buf)
            if n > self.max_frame:
                raise ProtocolError(f"a frame claims {n} bytes, over the {self.max_frame} "
                                    f"byte limit")
            if len(self.buf) < HEADER.size + n:
                break
            body = bytes(self.buf[HEADER.size:HEADER.size + n])
            del self.buf[:HEADER.size + n]
            try:
                msg = json.loads(body.decode("utf-8"))
            except (ValueError, RecursionError):   # RecursionError: [[[[... (tests/fuzz)
                raise ProtocolError(f"a frame of {n} bytes is not UTF-8 JSON") from None
            if not isinstance(msg, dict):
                raise ProtocolError("a frame is not a JSON object")
            if _SURROGATE_ESCAPE.search(body):
                try:
                    msg = _whole(msg)
                except RecursionError:
                    raise ProtocolError(f"a frame of {n} bytes is nested too deep") from None
            out.append((msg, n))
        return out


#: a JSON escape of a UTF-16 surrogate: the only way a frame's strict UTF-8 can carry one
#: (a pair makes one character; one alone stays a lone surrogate in the str)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE = re.compile("[\ud800-\udfff]")


def _whole(v):
    """v with every lone surrogate (node's strings have them; a forged frame too) made
    U+FFFD: nothing downstream (a JSON answer, a stream, MCP, E2B) can encode one as
    UTF-8, and it is no character of the output anyway."""
    if isinstance(v, str):
        return _LONE.sub("\ufffd", v)
    if isinstance(v, dict):
        return {_whole(k): _whole(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_whole(x) for x in v]
    return v


#: per message type, the exact fields besides "type" and their types
_SCHEMA = {
    "ready": {"version": int, "python": str},
    "ready-js": {"version": int, "node": str},
    "ready-kernel": {"version": int, "python": str, "kernel": str},
    "stdout": {"text": str},
    "stderr": {"text": str},
    "display": {"id": int, "data": dict, "main": bool},
    "error": {"id": int, "name": str, "value": str, "traceback": list},
    "end": {"id": int, "count": int},
    "fatal": {"message": str},
}


def check_message(msg: dict) -> str:
    """The message's type, after checking it has exactly its fields, of their types."""
    kind = msg.get("type")
    key = kind
    if kind == "ready":
        key = "ready-js" if "node" in msg else "ready-kernel" if "kernel" in msg else kind
    fields = _SCHEMA.get(key) if isinstance(kind, str) else None
    if fields is None:
        raise ProtocolError(f"unknown message type {str(kind)[:40]!r}")
    if set(msg) != {"type", *fields}:
        raise ProtocolError(f"a {kind!r} message has the fields {sorted(msg)[:10]}, "
                            f"not {sorted(['type', *fields])}")
    for name, typ in fields.items():
        v = msg[name]
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise ProtocolError(f"{kind}.{name} is not a {typ.__name__}")
    if kind == "error" and not all(isinstance(x, str) for x in msg["traceback"]):
        raise ProtocolError("error.traceback is not a list of strings")
    if kind == "display":
        for mime, value in msg["data"].items():
            if mime == "application/json":
                continue                       # any JSON value
            if not isinstance(value, str):
                raise ProtocolError(f"display data {mime[:60]!r} is not a string")
            if mime in BASE64_MIMES:
                try:
                    base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    raise ProtocolError(f"display data {mime} is not base64") from None
    return kind


# --- the interpreters ------------------------------------------------------------------

#: python contexts start with this (argv: RUNNER MAX_FRAME CWD ENGINE KERNEL): the kernel
#: bridge (guest/kernel.py) where the image's python3 has ipykernel and the engine allows
#: it, else corral's runner (whose frames are named <corral-runner>, for tracebacks)
_PY_BOOT = """import sys
e = sys.argv[4]
if e != 'runner':
    try:   # as the kernel's own python will see them: not from the working directory
        from importlib.machinery import PathFinder
        p = [d for d in sys.path if d not in ('', '.')]
        k = all(PathFinder.find_spec(m, p) is not None
                for m in ('ipykernel', 'jupyter_client', 'zmq'))
    except Exception:
        k = False
    if k:
        exec(compile(sys.argv[5], '<corral-kernel>', 'exec'))
        raise SystemExit(0)
    if e == 'ipykernel':
        import json, os, struct
        b = json.dumps({'type': 'fatal', 'message': 'ipykernel (with jupyter_client and '
                        'pyzmq) is not importable by ' + sys.executable}).encode()
        os.write(1, struct.pack('>I', len(b)) + b)
        os._exit(1)
exec(compile(sys.argv[1], '<corral-runner>', 'exec'))
"""
ENGINES = ("auto", "ipykernel", "runner")


def _runner_argv(language: str, max_frame: int, cwd: str | None,
                 engine: str = "auto") -> list[str]:
    from .. import guest

    if language == "python":
        return ["python3", "-c", _PY_BOOT, guest.source("runner.py"), str(max_frame),
                cwd or "", engine, guest.source("kernel.py") if engine != "runner" else ""]
    if language == "javascript":
        return ["node", "-e", guest.source("runner.js"), "--", str(max_frame), cwd or ""]
    raise ValueError(language)


#: the first line an interactive bash context reads (then its cwd and the ready line):
#: no prompts, no history, no `!` expansion; __corral_end prints a cell's end lines once
#: (a cell's own line, or the host's after an interrupt, whichever comes first)
_BASH_SETUP = ("PS1= PS2= PS0= PS4=; unset PROMPT_COMMAND HISTFILE; set +H +o history; "
               "__corral_end() { if [ -n \"$__corral_n\" ]; then "
               "printf '\\n%s %d\\n' \"$__corral_n\" \"$1\"; "
               "printf '\\n%s\\n' \"$__corral_n\" >&2; __corral_n=; fi; }; ")


def bash_quote(text: str) -> str:
    """`text` as one bash word on one line: $'...' with every control character,
    backslash and quote escaped (NUL cannot be in it). A surrogate escape (U+DC80-U+DCFF:
    a byte that is not UTF-8, as os.listdir and files.list give a name) is that byte
    again (\\xNN); a lone surrogate that stands for no byte is a ValueError."""
    out = ["$'"]
    for ch in text:
        o = ord(ch)
        if ch in "\\'":
            out.append("\\" + ch)
        elif o < 32 or o == 127:
            out.append("\\x%02x" % o)
        elif 0xDC80 <= o <= 0xDCFF:
            out.append("\\x%02x" % (o & 0xFF))
        elif 0xD800 <= o <= 0xDFFF:
            raise ValueError(f"a lone surrogate (U+{o:04X}) is no character and stands for "
                             "no byte: send text, or a name as files.list gives it")
        else:
            out.append(ch)
    out.append("'")
    return "".join(out)
