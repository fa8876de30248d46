"""`corral serve --config FILE`: the server's own settings, in TOML.

    [server]
    host = "127.0.0.1"          # --host
    port = 8787                 # --port
    state_dir = "/var/lib/corral"
    tls_cert = "/etc/corral/cert.pem"   # both or neither: HTTPS (uvicorn's ssl options)
    tls_key = "/etc/corral/key.pem"
    mcp = true                  # --mcp: MCP over streamable HTTP at /mcp
    log_level = "info"          # uvicorn's: critical, error, warning, info, debug
    access_log = true           # a line per request (false: ~0.2 ms less CPU a request)
    drain_timeout = 30          # --drain-timeout: seconds requests get at SIGTERM
    max_terminals = 64          # open terminals, every token's together (each holds
                                # threads and fds of the server's own); past it 429
    max_running = 128           # commands and cells running, every token's together
                                # (each holds a thread of the server's own); past it 429
    max_sandboxes = 128         # live sandboxes, every token's together (each holds
                                # processes, memory and fds of the host's); past it 429
    keep_alive = 310            # seconds an idle HTTP connection is kept open: above
                                # every client's own idle expiry (E2B's SDK: 300)

    [limits]                    # for every token that does not set its own
    rate = "20/s"               # requests; N/s, N/min or N/h
    burst = 40                  # requests at once (default a second's worth)
    max_sandboxes = 10          # live sandboxes at once
    max_concurrent = 4          # commands or cells running at once

    [secrets]                   # the values a token's ceiling may grant, by name
    GH_TOKEN = "env:GH_TOKEN"   # from the server's environment
    [secrets.NPM]
    from = "file:/etc/corral/npm.token"   # or a file (read when a sandbox is made)

Flags given on the command line win over the file. An unknown section or key is an error
naming it (a misspelt `tls_cert` must not leave the server on plain HTTP). Secret values
are never in this file and never cross the API: the file names where each value is read
from, a token's ceiling names which secrets it may grant to which hosts
(`[secrets.GH_TOKEN] hosts = ["api.github.com"]`, with no `from`), and a request names
only the secret and its hosts. The sandbox sees a placeholder; the egress proxy puts the
value on the wire to the granted hosts (docs/secrets.md).
"""

from __future__ import annotations

import os
import re

from ..errors import UsageError

SERVER_KEYS = ("host", "port", "state_dir", "tls_cert", "tls_key", "mcp", "log_level",
               "access_log", "drain_timeout", "max_terminals", "max_running",
               "max_sandboxes", "keep_alive")
#: SIGTERM: how long running requests (foreground commands, cells) get to finish
DRAIN_S = 30.0
#: seconds an idle kept-alive HTTP connection stays open (uvicorn's timeout_keep_alive).
#: A client reusing a connection at the moment the server closes it sees the connection
#: reset and its request lost, so the server must keep connections longer than its
#: clients do: httpx (corral's SDK) lets one go after 5 s idle, E2B's SDK after 300 s
#: (E2B_KEEPALIVE_EXPIRY); uvicorn's own default, 5 s, raced both. An idle connection
#: costs the server one fd and a few KB.
KEEP_ALIVE_S = 310
#: open terminals (WS /sandboxes/{id}/pty and E2B's) the server holds at once, every
#: token's together: each holds threads and fds of the server's own while it is open
#: (a WebSocket one: 5 threads, 11 fds, measured), which a token without max_concurrent
#: could take without end; 64 of them fit in the common 1024-fd soft limit with room
MAX_TERMINALS = 64
#: commands (foreground and background) and code cells running at once, every token's
#: and face's together: each holds a thread of the server's own until it ends, which the
#: sandbox's code decides (a background command's waiter, a cell's thread, a foreground
#: command's), and a token without max_concurrent could start them without end. Measured
#: (session 11): a background command 2 threads and 7 fds of the server's, a cell 1
#: thread; 128 of them and the 64 terminals want ~1,600 fds: a server with more than the
#: common 1024 soft limit (LimitNOFILE in the unit, docs/service.md)
MAX_RUNNING = 128
#: live sandboxes, every token's and face's together (REST, /mcp, E2B): each holds
#: processes, memory and fds of the host's for its life, and tokens without max_sandboxes
#: (or many tokens with it) could make them until the host had none left for any tenant.
#: Measured idle (session 11, namespace tier): 1 thread and 7 fds of the server's (9 with
#: network allow), 3 processes (4: its egress proxy), 0.4 MB PSS (6.3 MB with allow);
#: 128 of them: ~1,150 fds, ~510 processes, ~0.8 GB with allow, before their own work
MAX_SANDBOXES = 128
LIMIT_KEYS = ("rate", "burst", "max_sandboxes", "max_concurrent")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
SECRET_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: the source a ceiling's secret is checked with when it is made (the server's comes later)
PLACEHOLDER_SOURCE = "env:CORRAL_SERVER_SECRET"


class Config:
    """The server's settings; every field has the default `corral serve` has without a file."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.host: str | None = None
        self.port: int | None = None
        self.state_dir: str | None = None
        self.tls_cert: str | None = None
        self.tls_key: str | None = None
        self.mcp: bool = False
        self.log_level: str = "info"
        #: uvicorn's access log, a line per request (corral's own log lines stay)
        self.access_log: bool = True
        self.drain_timeout: float = DRAIN_S
        self.max_terminals: int = MAX_TERMINALS
        self.max_running: int = MAX_RUNNING
        self.max_sandboxes: int = MAX_SANDBOXES
        self.keep_alive: int = KEEP_ALIVE_S
        #: defaults of the token limits (tokens.LIMITS): rate in requests a second
        self.limits: dict = {}
        #: secret name -> source ("env:VAR" or "file:/abs/path"), never a value
        self.secrets: dict[str, str] = {}


def _fail(path: str, key: str, message: str):
    return UsageError(f"{message} (in {path})", field=key)   # shown as "key: message (in path)"


def load(path: str) -> Config:
    """Read and check a config file: a UsageError naming the key for anything wrong."""
    import tomllib

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}", field="--config") from None
    with os.fdopen(fd, "rb") as f:
        raw = f.read((1 << 20) + 1)
    if len(raw) > 1 << 20:
        raise UsageError(f"{path} is over 1 MiB; a server config is a few lines",
                         field="--config")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text", field="--config") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not TOML: {e}", field="--config") from None
    return from_dict(data, path)


def from_dict(data: dict, path: str = "config") -> Config:
    c = Config()
    c.path = path
    for section in data:
        if section not in ("server", "limits", "secrets"):
            raise _fail(path, section, "unknown section; the sections are [server], "
                        "[limits] and [secrets]")
        if not isinstance(data[section], dict):
            raise _fail(path, section, "must be a table ([" + section + "])")
    _server(c, data.get("server", {}), path)
    _limits(c, data.get("limits", {}), path)
    _secrets(c, data.get("secrets", {}), path)
    return c


def _str(v, key: str, path: str) -> str:
    if not isinstance(v, str) or not v or "\0" in v:
        raise _fail(path, key, "must be a non-empty string")
    return v


def _int(v, key: str, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _fail(path, key, f"must be a whole number from {lo} to {hi}")
    return v


def _server(c: Config, t: dict, path: str) -> None:
    for k, v in t.items():
        key = f"server.{k}"
        if k not in SERVER_KEYS:
            raise _fail(path, key, f"unknown key; [server] has {', '.join(SERVER_KEYS)}")
        if k == "port":
            c.port = _int(v, key, path, 0, 65535)
        elif k == "max_terminals":
            c.max_terminals = _int(v, key, path, 1, 100_000)
        elif k == "max_running":
            c.max_running = _int(v, key, path, 1, 100_000)
        elif k == "max_sandboxes":
            c.max_sandboxes = _int(v, key, path, 1, 100_000)
        elif k == "keep_alive":
            c.keep_alive = _int(v, key, path, 1, 3600)
        elif k in ("mcp", "access_log"):
            if not isinstance(v, bool):
                raise _fail(path, key, "must be true or false")
            setattr(c, k, v)
        elif k == "drain_timeout":
            try:
                c.drain_timeout = drain_seconds(v, key)
            except UsageError as e:
                raise _fail(path, key, e.message) from None
        elif k == "log_level":
            if v not in LOG_LEVELS:
                raise _fail(path, key, f"must be one of {', '.join(LOG_LEVELS)}")
            c.log_level = v
        else:
            v = _str(v, key, path)
            if k in ("state_dir", "tls_cert", "tls_key"):
                v = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(path)), v))
            setattr(c, k, v)


def drain_seconds(v, field: str) -> float:
    """Seconds from 0 to 3600 (a number, or its text from the command line)."""
    try:
        s = float(v) if not isinstance(v, bool) else -1.0
    except (TypeError, ValueError):
        s = -1.0
    if not 0 <= s <= 3600:
        raise UsageError("the drain timeout is seconds from 0 to 3600", field=field)
    return s


def _limits(c: Config, t: dict, path: str) -> None:
    from .limits import check_burst, parse_rate

    for k, v in t.items():
        key = f"limits.{k}"
        if k not in LIMIT_KEYS:
            raise _fail(path, key, f"unknown key; [limits] has {', '.join(LIMIT_KEYS)}")
        try:
            if k == "rate":
                c.limits["rate"] = parse_rate(v, key)
            elif k == "burst":
                c.limits["burst"] = check_burst(v, key)
            else:
                c.limits[k] = _int(v, key, path, 1, 1_000_000)
        except UsageError as e:
            raise _fail(path, key, e.message) from None
    if "burst" in c.limits and "rate" not in c.limits:
        raise _fail(path, "limits.burst", "a burst needs a rate (limits.rate = \"20/s\")")


def _secrets(c: Config, t: dict, path: str) -> None:
    for name, v in t.items():
        key = f"secrets.{name}"
        if not SECRET_NAME_RE.fullmatch(name):
            raise _fail(path, key, "a secret's name is letters, digits and _, as an "
                        "environment variable's")
        if isinstance(v, dict):
            for k in v:
                if k != "from":
                    hint = (": a value is never written here; name where the server reads it"
                            if k == "value" else "")
                    raise _fail(path, f"{key}.{k}", "unknown key; a server secret has only "
                                f"`from` (\"env:VAR\" or \"file:/abs/path\"){hint}")
            if "from" not in v:
                raise _fail(path, f"{key}.from", "missing: \"env:VAR\" or \"file:/abs/path\"")
            v = v["from"]
            key = f"{key}.from"
        if not isinstance(v, str):
            raise _fail(path, key, "must be \"env:VAR\" or \"file:/abs/path\"")
        check_source(v, key, path)
        c.secrets[name] = v


def check_source(source: str, key: str, path: str) -> None:
    """A source the server can read now (its value is read again for each sandbox):
    never reads or shows the value itself."""
    if source.startswith("env:") and ENV_RE.fullmatch(source[4:]):
        if source[4:] not in os.environ:
            raise _fail(path, key, f"the server's environment has no {source[4:]}")
        return
    if source.startswith("file:/") and "\0" not in source:
        import stat

        try:
            st = os.stat(source[5:])
        except OSError as e:
            raise _fail(path, key, f"cannot use {source[5:]}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode) or not os.access(source[5:], os.R_OK):
            raise _fail(path, key, f"{source[5:]} is not a file the server can read")
        return
    # not echoed: a value written where its source belongs must not reach a log
    raise _fail(path, key, "is not a source (not shown: it may be a value); write "
                "\"env:VAR\" or \"file:/abs/path\"")


def with_sources(ceiling: dict, secrets: dict[str, str] | None) -> dict:
    """The ceiling (a policy dict) with each secret that names no `from` given the
    server's source for it. `secrets` None: a placeholder source (checking a ceiling
    before any server reads it). A secret the server does not configure is dropped: the
    ceiling cannot grant it, and a request naming it is refused as beyond the ceiling."""
    table = ceiling.get("secrets") if isinstance(ceiling, dict) else None
    if not isinstance(table, dict) or not table:
        return ceiling
    out = {}
    for name, t in table.items():
        if not isinstance(t, dict) or "from" in t or "value" in t:
            out[name] = t
        elif secrets is None:
            out[name] = {**t, "from": PLACEHOLDER_SOURCE}
        elif name in secrets:
            out[name] = {**t, "from": secrets[name]}
    return {**ceiling, "secrets": out}
