"""`corral serve`, `corral token` and `corral mcp`: argument parsing, then the service."""

from __future__ import annotations

import os
import sys

from ..errors import CorralError, PolicyError, UsageError

SERVE_USAGE = """\
usage: corral serve [--host ADDR] [--port N] [--state-dir DIR] [--config FILE]
                    [--tls-cert PEM --tls-key PEM] [--mcp] [--drain-timeout S]
                    [--e2b-debug TOKEN_NAME]

The HTTP service (docs/service.md): sandboxes over a JSON API, OpenAPI at /openapi.json,
docs at /docs, /health, and a web dashboard at / (a browser logs in once with its
token: docs/dashboard.md). Every other route (/metrics too) needs Authorization: Bearer
TOKEN (corral token create). Listens on 127.0.0.1:8787 by default; another address without TLS
prints a warning. --config: a TOML file with [server], [limits] (defaults of the token
limits) and [secrets] (where the server reads each secret a ceiling may grant); flags win
over it. --tls-cert/--tls-key: serve HTTPS. --mcp: MCP over streamable HTTP at /mcp,
behind the same tokens and ceilings (docs/mcp.md). On SIGTERM it drains: no new
sandboxes, requests in flight get --drain-timeout seconds (default 30) to finish, then
every sandbox is killed. At start it sweeps what a previous run that died left behind.
The same port speaks E2B's wire protocol (docs/e2b.md); --e2b-debug TOKEN_NAME also
listens on 127.0.0.1:49983 and :49999 for the E2B SDKs' E2B_DEBUG mode, one sandbox of
that token for every caller on this host (a development mode).
"""

TOKEN_USAGE = """\
usage: corral token create --name N [--ceiling POLICY_FILE] [--max-sandboxes K]
                           [--max-concurrent C] [--rate N/s [--burst B]] [--apply-changes]
                           [--admin] [--max-lifetime DURATION] [--state-dir DIR]
       corral token ls [--state-dir DIR]
       corral token revoke NAME [--state-dir DIR]

Bearer tokens for corral serve and corral mcp, stored hashed in the state directory
($CORRAL_STATE_DIR, else /var/lib/corral for root, else ~/.local/share/corral). create
prints the token once, alone on the last line of stdout. --ceiling: a policy file (TOML)
that the token's sandboxes cannot exceed (default: corral's default policy: no network,
no secrets, no workspace, the default limits, namespace tier). --max-sandboxes: live
sandboxes at once; --max-concurrent: commands or cells running at once; --rate: requests
(N/s, N/min or N/h) with bursts of --burst (default a second's worth). Past any: 429 with
Retry-After. Limits left unset take the server config's [limits] (docs/service.md).
--apply-changes: the token may apply a review-mode sandbox's changes to the host's
workspace (give it to a person's review tool, never to an agent; without it apply is 403).
--admin: the token sees every token's runs, denials and live sandboxes (the audit queries
and the dashboard at /, docs/dashboard.md); it still controls only its own sandboxes.
--max-lifetime: how long each of its sandboxes may live from its creation (e.g. 2h), the
timeout it asks for at create and any it sets later included (past it: 403, field
timeout); without it a sandbox lives up to 7 days a call, renewable.
"""

MCP_USAGE = """\
usage: corral mcp [--policy FILE] [--max-sandboxes K] [--state-dir DIR]

An MCP server on stdio (docs/mcp.md): tools to create sandboxes, run commands and code,
read, write and list files, explain the policy. --policy: the ceiling every sandbox of the
session stays within (default: corral's default policy); the session's first tool call
gets a sandbox lazily, killed when the session ends. --max-sandboxes: live sandboxes the
session may hold at once (default 128, at most 100000); create_sandbox beyond it is
refused until one is killed.
"""


class Args:
    def __init__(self, args: list[str], values: set[str], usage: str,
                 flags: frozenset[str] = frozenset()) -> None:
        self.opts: dict[str, str] = {}
        self.flags: set[str] = set()
        self.rest: list[str] = []
        it = iter(args)
        for a in it:
            if a in ("-h", "--help"):
                sys.stdout.write(usage)
                raise SystemExit(0)
            name, eq, val = a.partition("=")
            if a in flags:
                self.flags.add(a)
            elif name in values:
                if not eq:
                    val = next(it, None)
                    if val is None:
                        raise UsageError(f"{name} needs a value", field=name)
                self.opts[name] = val
            elif a.startswith("-"):
                raise UsageError(f"unknown option {a}", field=a)
            else:
                self.rest.append(a)


def _duration(v: str | None, field: str) -> float | None:
    if v is None:
        return None
    from ..policy.units import parse_duration

    try:
        return parse_duration(v)
    except ValueError as e:
        raise UsageError(str(e), field=field) from None


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
    a = Args(args, {"--host", "--port", "--state-dir", "--config", "--tls-cert", "--tls-key",
                    "--drain-timeout", "--e2b-debug"}, SERVE_USAGE, frozenset({"--mcp"}))
    if a.rest:
        raise UsageError(f"unexpected {a.rest[0]!r}", field="serve")
    _warm_zygote()
    from .config import Config, load

    c = load(a.opts["--config"]) if "--config" in a.opts else Config()
    if "--host" in a.opts:
        c.host = a.opts["--host"]
    if "--port" in a.opts:
        c.port = _int(a.opts["--port"], "--port")
    for flag, attr in (("--state-dir", "state_dir"), ("--tls-cert", "tls_cert"),
                       ("--tls-key", "tls_key")):
        if flag in a.opts:
            setattr(c, attr, os.path.abspath(a.opts[flag]))
    if "--mcp" in a.flags:
        c.mcp = True
    c.host = c.host or "127.0.0.1"
    c.port = 8787 if c.port is None else c.port
    if not 0 <= c.port <= 65535:
        raise UsageError("a port is from 0 to 65535", field="--port")
    if (c.tls_cert is None) != (c.tls_key is None):
        raise UsageError("TLS needs both --tls-cert and --tls-key (a PEM certificate chain "
                         "and its private key)",
                         field="--tls-key" if c.tls_key is None else "--tls-cert")
    for flag, p in (("--tls-cert", c.tls_cert), ("--tls-key", c.tls_key)):
        if p is not None and not os.access(p, os.R_OK):
            raise UsageError(f"cannot read {p}", field=flag)
    if c.tls_cert is not None:
        import ssl

        try:    # uvicorn would load them only once serving, with a traceback
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                c.tls_cert, c.tls_key)
        except (ssl.SSLError, OSError) as e:
            raise UsageError(f"{c.tls_cert} and {c.tls_key} are not a PEM certificate chain "
                             f"and its private key ({getattr(e, 'reason', None) or e})",
                             field="--tls-cert") from None
    if c.tls_cert is None and not is_loopback(c.host):
        sys.stderr.write(f"corral serve: warning: listening on {c.host}, beyond loopback, "
                         "without TLS: tokens and code cross the network in clear; give "
                         "--tls-cert/--tls-key or put a TLS reverse proxy in front "
                         "(docs/service.md)\n")
    if "--drain-timeout" in a.opts:
        from .config import drain_seconds

        c.drain_timeout = drain_seconds(a.opts["--drain-timeout"], "--drain-timeout")
    from .app import serve as run

    return run(c, e2b_debug=a.opts.get("--e2b-debug"))


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: an address only this machine reaches."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token(args: list[str]) -> int:
    from .tokens import TokenStore

    a = Args(args, {"--name", "--ceiling", "--max-sandboxes", "--max-concurrent", "--rate",
                    "--burst", "--state-dir", "--max-lifetime"}, TOKEN_USAGE,
             frozenset({"--apply-changes", "--admin"}))
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
            from .config import with_sources

            try:
                ceiling = read_toml(a.opts["--ceiling"])
            except PolicyError as e:    # read_toml names --policy: here it is --ceiling
                raise PolicyError(e.message.replace("--policy", "--ceiling"),
                                  field="--ceiling") from None
            # a bad ceiling fails here; a secret without `from` is the server config's
            policy_from_dict(with_sources(ceiling, None), allow_literal=False)
        tok = store.create(a.opts["--name"], ceiling=ceiling,
                           max_sandboxes=_int(a.opts.get("--max-sandboxes"), "--max-sandboxes"),
                           max_concurrent=_int(a.opts.get("--max-concurrent"),
                                               "--max-concurrent"),
                           rate=a.opts.get("--rate"),
                           burst=_int(a.opts.get("--burst"), "--burst"),
                           apply_changes="--apply-changes" in a.flags,
                           admin="--admin" in a.flags,
                           max_lifetime=_duration(a.opts.get("--max-lifetime"),
                                                  "--max-lifetime"))
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
            if t.rate is not None:
                from .limits import format_rate

                limits.append(f"rate={format_rate(t.rate)}")
                if t.burst is not None:
                    limits.append(f"burst={t.burst}")
            if t.max_lifetime is not None:
                from ..policy.units import format_duration

                limits.append(f"max-lifetime={format_duration(t.max_lifetime)}")
            if t.apply_changes:
                limits.append("apply-changes")
            if t.admin:
                limits.append("admin")
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
    a = Args(args, {"--policy", "--max-sandboxes", "--state-dir"}, MCP_USAGE)
    if a.rest:
        raise UsageError(f"unexpected {a.rest[0]!r}", field="mcp")
    from .config import MAX_SANDBOXES

    most = _int(a.opts.get("--max-sandboxes"), "--max-sandboxes")
    if most is not None and not 1 <= most <= 100_000:
        raise UsageError(f"{most} is out of range: give 1 to 100000", field="--max-sandboxes")
    _warm_zygote()
    from .mcp import run_stdio

    return run_stdio(a.opts.get("--policy"), MAX_SANDBOXES if most is None else most)


def _warm_zygote() -> None:
    """The commands' zygote (linux/enter.py), forked before the web and MCP stacks are
    imported: each command's entrant is then a fork of a small process (enter.warm)."""
    from ..linux import enter

    try:
        enter.warm()
    except OSError:    # made on first use then, as everywhere else
        pass
