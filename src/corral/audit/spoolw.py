"""The audit spool's writer side, kept lean for `corral run` (audit/spool.py has the
reader, `ingest`, and says how the spool works).

`corral run` pays for what it imports and computes after its command has ended, so its
record's line is made with what is already loaded: no json or _json (strings are quoted
here; only one with a quote, a backslash or a non-printable character loads the C
encoder), no hashlib, no policy.dump. The policy goes in the cheap form `policy_form`
gives (its field values as the loader made them, {} for the default policy); `ingest`
turns it into the TOML and digest every record holds, with the corral version that wrote
it (a record of another version says so in an `audit` event). A policy whose TOML this
process made already (`--receipt` needs its digest) is written as that text.
"""

from __future__ import annotations

import os
import stat
import sys

#: the longest line one run writes (and ingest reads), bytes
LINE_MAX = 1 << 20
#: a long argv keeps this many bytes of it in a truncated record
ARGV_KEEP = 4096
SPOOL_NAME = "runs.jsonl"
#: the digest of no policy (a run refused before its policy was read): sha256 of b""
EMPTY_DIGEST = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def private_dir(path: str) -> str:
    """Make (0700) and check a directory of ours: a link, another owner or a group- or
    world-writable mode is refused."""
    os.makedirs(path, 0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory of this user (a link?): refused")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


_USERS: dict[int, str] = {}


def local_user() -> str:
    uid = os.geteuid()
    name = _USERS.get(uid)
    if name is None:
        try:
            import pwd

            name = "user:" + pwd.getpwuid(uid).pw_name
        except (KeyError, ImportError):
            name = f"user:{uid}"
        _USERS[uid] = name
    return name


def _quote(s: str) -> str:
    """A JSON string, ASCII only (what _json.encode_basestring_ascii gives)."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    from _json import encode_basestring_ascii

    return encode_basestring_ascii(s)


def dumps(v) -> str:
    """Compact JSON of what records hold (dict, list, str, int, float, bool, None; any
    other value as its str), without importing json."""
    if isinstance(v, str):
        return _quote(v)
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return "null"
        return float.__repr__(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{_quote(str(k))}:{dumps(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    return _quote(str(v))


_DEFAULT: list = []   # [Policy()]


def policy_form(policy) -> dict:
    """The policy as ingest needs it to print its TOML (policy/dump.py `dump_form`): {}
    for the default policy, else {"values": {dotted key: value}, "secrets": [[name,
    source, hosts, ttl, plain_http], ...]} (a literal secret's value is never in it)."""
    from ..policy.schema import FIELDS, Policy

    if not _DEFAULT:
        _DEFAULT.append(Policy())
    if policy == _DEFAULT[0]:
        return {}
    values = {}
    for spec in FIELDS:
        obj = policy
        for part in spec.path.split("."):
            obj = getattr(obj, "pass_" if part == "pass" else part)
        if spec.kind == "workspace" and obj is not None:
            obj = [obj.path, obj.mode, obj.mount_at]
        elif isinstance(obj, (tuple, list, frozenset, set)):
            obj = [list(x) if isinstance(x, tuple) else x for x in obj]
        values[spec.path] = obj
    values.setdefault("image", policy.image)
    return {"values": values,
            "secrets": [[s.name, s.source, list(s.hosts), s.ttl, s.plain_http]
                        for s in policy.secrets]}


def image_digest(plan, policy) -> str:
    from ..plan import ImageRoot

    if plan is not None:
        roots = plan.find(ImageRoot)
        if roots and roots[0].digest:
            return roots[0].digest
    return "host" if getattr(policy, "image", "host") in (None, "host") else ""


def cli_fields(item: dict) -> dict:
    """The spool line's fields of one run of a short-lived process (spool.FIELDS, the
    policy text and digest left to ingest: "policy_form" and "version" in their place)."""
    from .. import __version__

    r, policy = item["result"], item["policy"]
    spool = sys.modules.get("corral.audit.spool")
    hit = spool._TOML.get(id(policy)) if spool is not None else None
    if policy is None:
        text, dig, form = "", EMPTY_DIGEST, None
    elif hit is not None and hit[0] is policy:   # made already (--receipt): as it is
        text, dig, form = hit[1], spool.digest(hit[1].encode()), None
    else:
        text, dig, form = "", "", policy_form(policy)
    usage = r.usage.to_dict() if hasattr(r.usage, "to_dict") else dict(r.usage)
    idig = image_digest(item["plan"], policy)
    f = {"id": item["id"], "kind": item["kind"], "sandbox": item["sandbox"],
         "started": item["started"], "ended": item["ended"], "tier": item["tier"],
         "image": str(getattr(policy, "image", "") or "host"),
         "image_digest": idig, "policy_digest": dig, "policy": text,
         "argv": list(item["argv"]), "verdict": r.verdict, "exit_code": r.exit_code,
         "signal": r.signal, "usage": usage, "actor": item["actor"] or local_user(),
         "face": item["face"], "events": list(r.events[:item["n_events"]])}
    if form is not None:
        f["policy_form"] = form
        f["version"] = __version__
    return f


def line_of(fields: dict) -> bytes:
    """One spool line (newline included); past LINE_MAX, spool.line_of cuts it."""
    line = (dumps(fields) + "\n").encode("ascii")
    if len(line) <= LINE_MAX:
        return line
    from .spool import line_of as cut

    return cut(fields)


def append(audit_dir: str, line: bytes) -> None:
    """Append one line to the spool file: one write, on a regular file of ours, never
    through a link; raises OSError (or PermissionError) if it cannot."""
    import fcntl  # a C module: cheap

    d = private_dir(os.path.join(private_dir(audit_dir), "spool"))
    path = os.path.join(d, SPOOL_NAME)
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
             | os.O_NONBLOCK)
    for _ in range(8):
        fd = os.open(path, flags, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise PermissionError(f"{path} is not a regular file of this user: refused")
            # an ingest renames the file aside and then takes it exclusively: a writer
            # holds it shared and checks the name still leads to it, else takes the new one
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:   # an ingest has it (renamed aside): a new file
                continue
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                continue
            if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
                continue
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)
            n = os.write(fd, line)
            if n != len(line):
                raise OSError(f"a short write to {path} ({n} of {len(line)} bytes)")
            return
        finally:
            os.close(fd)
    raise OSError(f"{path} kept being renamed under this writer")
