"""`corral serve`, `corral token` and `corral mcp`: argument parsing, then the service."""

from __future__ import annotations

import os
import sys

from ..errors import CorralError, UsageError

SERVE_USAGE = """\
usage: corral serve [--host ADDR] [--port N] [--state-dir DIR] [--drain-timeout S]
                    [--e2b-debug TOKEN_NAME]

The HTTP service (docs/service.md): sandboxes over a JSON API, OpenAPI at /openapi.json,
docs at /docs, /health and /metrics. Every other route needs Authorization: Bearer TOKEN
(corral token create). Listens on 127.0.0.1:8787 by default. On SIGTERM it drains: no
new sandboxes, requests in flight get --drain-timeout seconds (default 30) to finish, then
every sandbox is killed. At start it sweeps what a previous run that died left behind.
The same port speaks E2B's wire protocol (docs/e2b.md); --e2b-debug TOKEN_NAME also
listens on 127.0.0.1:49983 and :49999 for the E2B SDKs' E2B_DEBUG mode, one sandbox of
that token for every caller on this host (a development mode).
"""

TOKEN_USAGE = """\
usage: corral token create --name N [--ceiling POLICY_FILE] [--max-sandboxes K]
                           [--max-concurrent C] [--apply-changes] [--state-dir DIR]
       corral token ls [--state-dir DIR]
       corral token revoke NAME [--state-dir DIR]

Bearer tokens for corral serve and corral mcp, stored hashed in the state directory
($CORRAL_STATE_DIR, else /var/lib/corral for root, else ~/.local/share/corral). create
prints the token once, alone on the last line of stdout. --ceiling: a policy file (TOML)
that the token's sandboxes cannot exceed (default: corral's default policy: no network,
no secrets, no workspace, the default limits, namespace tier). --apply-changes: the
token may apply a review-mode sandbox's changes to the host's workspace (give it to a
person's review tool, never to an agent; without it apply is 403).
"""

MCP_USAGE = """\
usage: corral mcp [--policy FILE] [--state-dir DIR]

An MCP server on stdio (docs/mcp.md): tools to create sandboxes, run commands and code,
read, write and list files, explain the policy. --policy: the ceiling every sandbox of the
session stays within (default: corral's default policy); the session's first tool call
gets a sandbox lazily, killed when the session ends.
"""


class Args:
    def __init__(self, args: list[str], values: set[str], usage: str) -> None:
        self.opts: dict[str, str] = {}
        self.rest: list[str] = []
        it = iter(args)
        for a in it:
            if a in ("-h", "--help"):
                sys.stdout.write(usage)
                raise SystemExit(0)
            name, eq, val = a.partition("=")
            if name in values:
                if not eq:
                    val = next(it, None)
                    if val is None:
                        raise UsageError(f"{name} needs a value", field=name)
                self.opts[name] = val
            elif a.startswith("-"):
                raise UsageError(f"unknown option {a}", field=a)
            else:
                self.rest.append(a)


def _int(v: str | None, field: str) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"{v!r} is not a whole number", field=field) from None


def main(name: str, args: list[str]) -> int:
    if name == "mcp":    # the audit store records this process's runs as MCP's
        os.environ.setdefault("CORRAL_AUDIT_FACE", "mcp")
    try:
        return {"serve": serve, "token": token, "mcp": mcp}[name](args)
    except CorralError as e:
        sys.stderr.write(f"corral {name}: {e}\n")
        return e.exit_code


def serve(args: list[str]) -> int:
    a = Args(args, {"--host", "--port", "--state-dir", "--drain-timeout", "--e2b-debug"},
             SERVE_USAGE)
    if a.rest:
        raise UsageError(f"unexpected {a.rest[0]!r}", field="serve")
    host = a.opts.get("--host", "127.0.0.1")
    port = _int(a.opts.get("--port", "8787"), "--port")
    if not 0 <= port <= 65535:
        raise UsageError("a port is from 0 to 65535", field="--port")
    if host not in ("127.0.0.1", "::1", "localhost"):
        sys.stderr.write(f"corral serve: warning: listening on {host}, beyond loopback, "
                         "without TLS: put it behind a TLS reverse proxy (docs/service.md)\n")
    from .app import DRAIN_S
    from .app import serve as run

    drain = a.opts.get("--drain-timeout")
    try:
        drain_s = DRAIN_S if drain is None else float(drain)
    except ValueError:
        drain_s = -1.0
    if not 0 <= drain_s <= 3600:
        raise UsageError("--drain-timeout is seconds from 0 to 3600", field="--drain-timeout")
    return run(host, port, a.opts.get("--state-dir"), drain=drain_s,
               e2b_debug=a.opts.get("--e2b-debug"))


def token(args: list[str]) -> int:
    from .tokens import TokenStore

    may_apply = "--apply-changes" in args
    args = [x for x in args if x != "--apply-changes"]
    a = Args(args, {"--name", "--ceiling", "--max-sandboxes", "--max-concurrent",
                    "--state-dir"}, TOKEN_USAGE)
    if not a.rest:
        sys.stderr.write(TOKEN_USAGE)
        return 2
    store = TokenStore(a.opts.get("--state-dir"))
    verb = a.rest[0]
    if verb == "create":
        if "--name" not in a.opts:
            raise UsageError("give the token a name: --name N", field="--name")
        ceiling = {}
        if "--ceiling" in a.opts:
            from ..policy.load import policy_from_dict, read_toml

            ceiling = read_toml(a.opts["--ceiling"])
            policy_from_dict(ceiling, allow_literal=False)   # a bad ceiling fails here
        tok = store.create(a.opts["--name"], ceiling=ceiling,
                           max_sandboxes=_int(a.opts.get("--max-sandboxes"), "--max-sandboxes"),
                           max_concurrent=_int(a.opts.get("--max-concurrent"),
                                               "--max-concurrent"),
                           apply_changes=may_apply)
        sys.stderr.write(f"corral token: created {a.opts['--name']!r}; the token follows, "
                         "shown only now\n")
        sys.stdout.write(tok + "\n")
        return 0
    if verb == "ls":
        import time

        for t in store.load():
            limits = []
            if t.max_sandboxes is not None:
                limits.append(f"max-sandboxes={t.max_sandboxes}")
            if t.max_concurrent is not None:
                limits.append(f"max-concurrent={t.max_concurrent}")
            if t.apply_changes:
                limits.append("apply-changes")
            state = "revoked" if t.revoked else "live"
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t.created))
            ceil = "ceiling" if t.ceiling else "default-ceiling"
            sys.stdout.write(f"{t.name}\t{state}\t{when}\t{ceil}\t{' '.join(limits)}\n")
        return 0
    if verb == "revoke":
        if len(a.rest) != 2:
            raise UsageError("name the token: corral token revoke NAME", field="NAME")
        store.revoke(a.rest[1])
        sys.stderr.write(f"corral token: revoked {a.rest[1]!r}\n")
        return 0
    raise UsageError(f"unknown verb {verb!r}: create, ls or revoke", field="token")


def mcp(args: list[str]) -> int:
    a = Args(args, {"--policy", "--state-dir"}, MCP_USAGE)
    if a.rest:
        raise UsageError(f"unexpected {a.rest[0]!r}", field="mcp")
    from .mcp import run_stdio

    return run_stdio(a.opts.get("--policy"))
