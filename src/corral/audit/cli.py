"""`corral runs`, `logs`, `denials`, `gc`, `audit export`, `verify` and `key show`.

Loaded only when one of them is asked for (corral run imports none of this).
"""

from __future__ import annotations

import json
import os
import sys

from ..errors import CorralError, UsageError, option_values

RUNS_USAGE = """\
usage: corral runs [--since AGE] [--verdict V] [--tier T] [--limit N] [--json]

The runs and live-sandbox commands the audit store holds, newest first (AGE: 90s, 15m,
1h, 30d, 2w; V: ok, error, killed, timeout, oom). --json: one JSON object per line with
id, argv, verdict, tier, started (and kind, sandbox, exit_code, usage, actor, face).
"""
LOGS_USAGE = """\
usage: corral logs RUN [--json]

The events of one run (or live sandbox), in order: limits hit, network decisions, secrets
sent or withheld, rules not enforced, teardown. --json: one event per line.
"""
DENIALS_USAGE = """\
usage: corral denials [--since AGE] [--kind net|secret|limit|refused|syscall] [--json]

What was refused, grouped and counted, most frequent first, with the policy rule that
would allow each (a refused host: network.allow += "host").
"""
GC_USAGE = """\
usage: corral gc --older-than AGE

Delete the audit records (runs, their events, live sandboxes) older than AGE (e.g. 30d).
Images have their own: corral image gc.
"""
AUDIT_USAGE = """\
usage: corral audit export [--since AGE]

Every run as one JSON line, oldest first: the run, its policy (TOML), events and receipt.
"""
VERIFY_USAGE = """\
usage: corral verify RECEIPT [--key ed25519:BASE64] [--stdout FILE] [--stderr FILE]
                     [--stdin FILE]

Check a receipt's signature (with --key: a host's public key as `corral key show` prints
it; without: this host's) and that each FILE has the hash the receipt records.
Exit status: 0 verified; 2 usage; 10 not a receipt; 11 the signature does not match (the
receipt was altered); 12 signed by another key; 13 a file does not match its hash.
"""
KEY_USAGE = """\
usage: corral key show

Print this host's receipt-signing public key (ed25519:BASE64), for third parties to
verify its receipts with corral verify --key.
"""


def _flags(args: list[str], values: tuple[str, ...], bools: tuple[str, ...] = ("--json",),
           positional: int = 0) -> tuple[dict, list[str]]:
    out: dict = {}
    pos: list[str] = []
    for name, a in option_values(args, values):
        if name is not None:
            out[name] = a
        elif a in bools:
            out[a] = True
        elif not a.startswith("-") and len(pos) < positional:
            pos.append(a)
        else:
            raise UsageError(f"unexpected argument {a!r}; see --help", field=a)
    return out, pos


def _age(f: dict, name: str):
    from .query import parse_age

    return parse_age(f[name], name) if name in f else None


def _when(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _show(text: str) -> str:
    from ..termsafe import neutralise

    return neutralise(text)


def main(name: str, args: list[str]) -> int:
    usage = {"runs": RUNS_USAGE, "logs": LOGS_USAGE, "denials": DENIALS_USAGE,
             "gc": GC_USAGE, "audit": AUDIT_USAGE, "verify": VERIFY_USAGE,
             "key": KEY_USAGE}[name]
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(usage)
        return 0
    try:
        return globals()[f"_cmd_{name}"](args)
    except CorralError as e:
        sys.stderr.write(f"corral: {e}\n")
        return e.exit_code
    except (OSError, ValueError) as e:     # the store's directory or file refused
        sys.stderr.write(f"corral: the audit store: {e}\n")
        return 125
    finally:
        _spool_notes()


def _spool_notes() -> None:
    """What ingesting the spool (docs/audit.md) could not take, on stderr."""
    from . import store

    got = store.last_ingest
    if got["skipped"]:
        sys.stderr.write(f"corral: the audit spool had {got['skipped']} malformed "
                         f"line(s): skipped (docs/audit.md)\n")
    if got["error"]:
        sys.stderr.write(f"corral: the audit spool was not ingested: {got['error']}\n")


def _cmd_runs(args: list[str]) -> int:
    from .query import runs

    f, _ = _flags(args, ("--since", "--verdict", "--tier", "--limit"))
    try:
        limit = int(f.get("--limit", 1000))
    except ValueError:
        raise UsageError("--limit must be a whole number", field="--limit") from None
    rows = runs(since=_age(f, "--since"), verdict=f.get("--verdict"), tier=f.get("--tier"),
                limit=limit)
    for r in rows:
        if f.get("--json"):
            sys.stdout.write(json.dumps(r) + "\n")
        else:
            argv = " ".join(r["argv"]).replace("\n", "\\n")
            sys.stdout.write(_show(f"{r['id']}  {_when(r['started'])}  {r['tier']:9} "
                                   f"{r['verdict']:7} {r['face']:7} {r['actor']:16} {argv[:80]}") + "\n")
    return 0


def _cmd_logs(args: list[str]) -> int:
    from .query import events

    f, pos = _flags(args, (), positional=1)
    if not pos:
        raise UsageError("corral logs needs a RUN id (corral runs lists them)", field="RUN")
    evs = events(pos[0])
    if evs is None:
        raise UsageError(f"no run {pos[0]!r} in the audit store", field="RUN")
    for e in evs:
        if f.get("--json"):
            sys.stdout.write(json.dumps(e) + "\n")
        else:
            rest = ", ".join(f"{k}={v}" for k, v in e.items() if k != "kind")
            sys.stdout.write(_show(f"{e.get('kind')}: {rest}") + "\n")
    return 0


def _cmd_denials(args: list[str]) -> int:
    from .query import denials

    f, _ = _flags(args, ("--since", "--kind"))
    if f.get("--kind") not in (None, "net", "secret", "limit", "refused", "syscall"):
        raise UsageError("--kind is one of net, secret, limit, refused, syscall",
                         field="--kind")
    for g in denials(since=_age(f, "--since"), kind=f.get("--kind")):
        if f.get("--json"):
            sys.stdout.write(json.dumps(g) + "\n")
        else:
            rule = g["rule"] or "-"
            sys.stdout.write(_show(f"{g['count']:6}x  {g['kind']:6} {g['what']:40} "
                                   f"(in {g['runs']} run(s))  allow with: {rule}") + "\n")
    return 0


def _cmd_gc(args: list[str]) -> int:
    from .query import gc

    f, _ = _flags(args, ("--older-than",), bools=())
    if "--older-than" not in f:
        raise UsageError("corral gc needs --older-than AGE (e.g. 30d)", field="--older-than")
    n = gc(_age(f, "--older-than"))
    sys.stdout.write(f"corral: removed {n['runs']} run(s), {n['sandboxes']} live "
                     f"sandbox(es) and {n['events']} event(s) from the audit store\n")
    return 0


def _cmd_audit(args: list[str]) -> int:
    from .query import export

    if args[:1] != ["export"]:
        raise UsageError("use: corral audit export [--since AGE]", field="audit")
    f, _ = _flags(args[1:], ("--since",), bools=())
    for d in export(since=_age(f, "--since")):
        sys.stdout.write(json.dumps(d) + "\n")
    return 0


def _cmd_key(args: list[str]) -> int:
    from .receipt import public_key_text

    if args != ["show"]:
        raise UsageError("use: corral key show", field="key")
    sys.stdout.write(public_key_text() + "\n")
    return 0


def _read(path: str, field: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}", field=field) from None


def _cmd_verify(args: list[str]) -> int:
    from . import receipt as rc

    f, pos = _flags(args, ("--key", "--stdout", "--stderr", "--stdin"), bools=(),
                    positional=1)
    if not pos:
        raise UsageError("corral verify needs a RECEIPT file", field="RECEIPT")
    data = _read(pos[0], "RECEIPT")
    files = {n[2:]: _read(f[n], n) for n in ("--stdout", "--stderr", "--stdin") if n in f}
    try:
        r = rc.load(data)
        trusted = rc.parse_key(f["--key"] if "--key" in f else rc.public_key_text())
        b = rc.verify(r, trusted, files)
    except rc.VerifyError as e:
        sys.stderr.write(f"corral: verify: FAILED: {e}\n")
        return e.code
    checked = ", ".join(files) or "no files"
    sys.stdout.write(_show(f"corral: verify: OK: run {b.get('run_id')} on "
                           f"{b.get('host')} ({b.get('verdict')}), signature good, "
                           f"{checked} matched\n"))
    return 0


class Hasher:
    """Wraps an on_stdout/on_stderr callback: every byte it passes is hashed too."""

    def __init__(self, inner=None) -> None:
        import hashlib

        self.inner, self.h = inner, hashlib.sha256()

    def __call__(self, data: bytes) -> None:
        self.h.update(data)
        if self.inner is not None:
            self.inner(data)

    def finish(self) -> None:
        if hasattr(self.inner, "finish"):
            self.inner.finish()

    def hexdigest(self) -> str:
        return "sha256:" + self.h.hexdigest()


class StdinTee:
    """`corral run --stdin --receipt`: this process's stdin copied to a pipe the command
    reads, hashed on the way (nothing kept: any size)."""

    def __init__(self, fd: int = 0) -> None:
        import hashlib
        import threading

        self.h = hashlib.sha256()
        self.src = fd
        self.r, self._w = os.pipe()
        self._t = threading.Thread(target=self._copy, daemon=True, name="corral-stdin")
        self._t.start()

    def _copy(self) -> None:
        try:
            while data := os.read(self.src, 1 << 16):
                self.h.update(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(self._w, view):]
        except OSError:     # the command closed its stdin early: the rest is not its
            pass
        finally:
            os.close(self._w)

    def digest(self) -> str:
        """The hash of what was read (after the command ended, what it could read)."""
        self._t.join(1.0)
        return "sha256:" + self.h.hexdigest()


def write_receipt(path: str, sb, result, argv, stdin, out: Hasher, err: Hasher,
                  changes) -> None:
    """stdin: a StdinTee, or None (the command read /dev/null: the hash of nothing)."""
    """`corral run --receipt FILE`: sign and write the receipt of the run just done."""
    import time

    from . import receipt as rc
    from . import store

    toml = store.policy_toml(sb.policy)
    b = rc.body(run_id=sb.last_run_id, started=sb.last_run_started, ended=time.time(),
                tier=sb.isolation, policy_toml=toml,
                image_digest=store.image_digest(sb.plan, sb.policy), argv=argv,
                stdin=b"" if stdin is None else stdin.digest(), stdout=out.hexdigest(), stderr=err.hexdigest(),
                changes=changes, events=result.events, verdict=result.verdict,
                exit_code=result.exit_code, signal=result.signal,
                usage=result.usage.to_dict(), actor=store.local_user())
    data = json.dumps(rc.sign(b), indent=1).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
