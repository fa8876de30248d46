"""`corral mcp`: corral's tools for coding assistants over MCP (the official `mcp` SDK), on
stdio (`corral mcp`) and over streamable HTTP at /mcp (`corral serve --mcp`, mcp_http.py).

The tools are the same on both; who calls decides the rest (a `Caller`): on stdio, one
user and the ceiling given with --policy (default: corral's default policy: no network,
no secrets, no workspace); over HTTP, the bearer token of the request, its ceiling and its
limits, its sandboxes shared with the REST API. A tool call with no sandbox_id uses the
session's own sandbox, created on first use with the ceiling policy itself and killed
when the session ends. No tool applies changes to the host or widens a policy: those stay
with the human on the host (`corral changes apply`, the policy file).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Annotated, Any, Literal, NamedTuple

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field

from ..errors import CorralError
from .ceiling import Exceeds, requested
from .commands import Threads
from .common import local_name, wire_name, wire_names
from .registry import Registry, owner_name

OWNER = "mcp"
#: seconds a sandbox of an MCP session lives at most (the session's end kills it sooner)
SANDBOX_S = 8 * 3600
OUTPUT_SHOWN = 2000          # characters of a stream put into the short text of a result
CHANGES_MAX = 1 << 20        # characters of diffs in one get_changes answer

Sid = Annotated[str | None, Field(description=(
    "a sandbox id from create_sandbox; omitted: the session's own sandbox (created on "
    "first use with the server's policy, killed when the session ends)"))]


class Caller(NamedTuple):
    """Who a tool call is for: the registry owner of its sandboxes, the ceiling they stay
    within (a policy dict, secrets given their sources), the key of its session's own
    sandbox, and its token (for its limits; None on stdio)."""

    owner: str
    ceiling: dict
    session: str
    token: Any = None


def build(ceiling_data: dict | None = None, *, opener=None, registry: Registry | None = None,
          caller=None, busy=None, quota=None, metrics=None, running=None,
          max_sandboxes: int | None = None):
    """The MCPServer with corral's tools; returns (server, registry).
    `caller(ctx) -> Caller` (default: the one stdio user within `ceiling_data`); `busy`:
    a limits.Concurrency and `quota` a limits.Quota shared with the REST API, holding the
    server's max_sandboxes too (None, as on stdio: no token limits, and a bound of this
    process's own on its live sandboxes: `max_sandboxes`, default config.MAX_SANDBOXES); `metrics`: the service's metrics.Metrics, which counts
    run_command's runs as the REST API's (None on stdio); `running`: the service's
    limits.Gate of commands and cells running (config max_running; None on stdio). server.corral_end_session(key, owner)
    kills a session's own sandbox (mcp_http calls it when an HTTP session ends)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ImageContent

    ceiling_data = ceiling_data or {}
    if registry is None:
        registry = Registry(opener) if opener is not None else Registry()
    if caller is None:
        def caller(ctx):
            return Caller(OWNER, ceiling_data, "stdio")
    bound = quota
    if bound is None:    # stdio: a bound of its own on its live sandboxes, as serve's
        from .config import MAX_SANDBOXES
        from .limits import Quota

        bound = Quota(MAX_SANDBOXES if max_sandboxes is None else max_sandboxes,
                      registry.count, "this session holds {} live sandboxes (or is making "
                      "them), corral mcp's --max-sandboxes")
    defaults: dict[str, str] = {}
    used: dict[str, float] = {}          # session key -> when its own sandbox was last used
    defaults_mu = threading.Lock()
    server = MCPServer("corral", instructions=(
        "Run commands and code in corral sandboxes: isolated from the host, no network "
        "unless the server's policy allows hosts, limits on memory, time and processes. "
        "Files under /scratch and /tmp persist between calls to the same sandbox. When "
        "something is refused, recent_denials says which policy rule would allow it: ask "
        "the user; no tool can widen the policy or apply changes to the host."))

    def guard(fn):
        from .limits import Limited

        try:
            return fn()
        except Exceeds as e:
            raise ToolError(f"refused by the server's policy: {e.field}: {e.message}; ask the "
                            "user to widen the policy on the host") from None
        except Limited as e:
            raise ToolError(f"refused: {e.field}: {e.message}; retry in {e.retry_after} s") \
                from None
        except CorralError as e:
            from .common import wire_error

            raise ToolError(str(wire_error(e))) from None

    def create(who: Caller, raw: dict, timeout: float = SANDBOX_S):
        most = getattr(who.token, "max_lifetime", None)
        if most is not None:     # the token's max lifetime (--max-lifetime) caps it
            timeout = min(timeout, most)
        policy = guard(lambda: _requested(who, raw))
        tok = who.token
        # the token's max_sandboxes (none on stdio) and the server's, every token's and
        # face's together (stdio: this process's own, the same default)
        hold = bound.reserve(who.owner, getattr(tok, "max_sandboxes", None),
                             lambda: registry.count(who.owner))
        return guard(lambda: _made(hold, who, policy, timeout))

    def _requested(who: Caller, raw: dict):
        try:
            return requested(raw, who.ceiling)
        except (Exceeds, CorralError) as e:   # refused before it started: recorded
            from ..audit.record import record_refused

            face = os.environ.get("CORRAL_AUDIT_FACE") or "service"   # as registry.create
            actor = None if face == "mcp" else f"token:{owner_name(who.owner)}"
            record_refused([], getattr(e, "kind", "ceiling"), e.message, e.field,
                           who=(face, actor))
            raise

    def _made(hold, who, policy, timeout):
        with hold, slot(who):
            return registry.create(who.owner, policy, timeout=timeout)

    def slot(who: Caller):
        from contextlib import nullcontext

        if busy is None or who.token is None:
            return nullcontext()

        class _S:
            def __enter__(self):
                guard(lambda: busy.enter(who.owner, who.token.max_concurrent))

            def __exit__(self, *exc):
                busy.leave(who.owner)

        return _S()

    def held(who):
        """The caller's max_concurrent slot and a place among the server's commands and
        cells running (max_running), taken now (ToolError past either): a function that
        gives both back."""
        s = slot(who)
        s.__enter__()
        if running is None:
            return lambda: s.__exit__(None, None, None)
        try:
            guard(running.enter)
        except BaseException:
            s.__exit__(None, None, None)
            raise

        def release() -> None:
            try:
                running.leave()
            finally:
                s.__exit__(None, None, None)
        return release

    #: the threads calls run in, by name: kept for the next call once one is done (a new
    #: one when none is idle), as routes/code.py's cells: no thread's start per call
    pools = {n: Threads(n) for n in ("corral-mcp-command", "corral-mcp-cell")}

    async def in_own_thread(ctx, sid: str | None, work, name: str):
        """work(e) under the sandbox's lock, in a thread of its own (service.common's
        own_thread), never one of anyio's 40 shared worker threads, which every sync route
        and every other token's requests need: a command or cell runs (or waits for the
        sandbox's lock) as long as the sandbox's code likes. Its slot and place are held
        until it ends, whether or not the client still waits."""
        import asyncio

        import anyio

        from .common import own_thread

        # an existing sandbox's lookup on the loop (no blocking work: dict lookups under
        # locks held only for them); else (a sandbox to make, an ended one to forget) in
        # a worker thread: one thread hop a call instead of two
        found = existing(ctx, sid)
        who, e = found if found is not None else await anyio.to_thread.run_sync(
            lambda: sandbox(ctx, sid))
        release = held(who)

        def run():
            try:
                with e.lock:
                    return work(e)
            finally:
                release()
        try:
            fut = own_thread(asyncio.get_running_loop(), run, name, pools[name])
        except BaseException:
            release()
            raise
        return await fut

    def existing(ctx, sid: str | None):
        """sandbox(ctx, sid) when that is a lookup only, without blocking: (caller, entry),
        or None when it takes more (making the session's sandbox, forgetting an ended
        one, an answer of no such sandbox) or the defaults' lock is held (it is while a
        session's own sandbox is made): sandbox() does it then, off the loop."""
        who = caller(ctx)
        if sid is None:
            if not defaults_mu.acquire(blocking=False):
                return None
            try:
                sid = defaults.get(who.session)
                e = registry.running(who.owner, sid) if sid is not None else None
                if e is not None:
                    used[who.session] = time.monotonic()
            finally:
                defaults_mu.release()
        else:
            e = registry.running(who.owner, sid)
        return (who, e) if e is not None else None

    def sandbox(ctx, sid: str | None):
        who = caller(ctx)
        if sid is None:
            with defaults_mu:
                sid = defaults.get(who.session)
                if sid is None or registry.get(who.owner, sid) is None:
                    sid = defaults[who.session] = create(who, _whole(who.ceiling)).id
                used[who.session] = time.monotonic()
        e = registry.get(who.owner, sid)
        if e is None:
            raise ToolError(f"no sandbox {sid!r}; create_sandbox makes one")
        return who, e

    @server.tool(description=(
        "Create a sandbox and return its id (sandbox_id). `policy` is a corral policy as "
        "JSON (the TOML layout of docs/policy.md, e.g. {\"limits\": {\"memory\": \"1G\", "
        "\"timeout\": \"2m\"}, \"network\": {\"mode\": \"allow\", \"allow\": "
        "[\"pypi.org\"]}}); it must stay within the server's policy (a wider one is refused "
        "naming the rule). Fields left out take the server's. The sandbox lives until "
        "kill_sandbox, the session's end or its timeout."))
    def create_sandbox(ctx: Context, policy: Annotated[dict[str, Any] | None, Field(
            description="a corral policy as JSON; omitted: the server's own")] = None,
                       timeout: Annotated[float, Field(description=(
                           "seconds the sandbox lives at most (then every process of it "
                           "is killed); default 28800 (8 h), at most 7 days"), gt=0,
                           le=7 * 86400)] = SANDBOX_S) -> CallToolResult:
        e = create(caller(ctx), policy or {}, timeout)
        return _result({"sandbox_id": e.id, "isolation": e.sandbox.isolation},
                       f"sandbox {e.id} ({e.sandbox.isolation} tier)")

    @server.tool(description=(
        "Run a shell command line (/bin/sh -c) in a sandbox and wait for it. Returns "
        "verdict (ok, error, killed, timeout, oom, ...), exit_code, stdout and stderr (each "
        "kept up to the policy's limits.output, 1 MiB by default; *_truncated says if cut) "
        "and wall_s (seconds). Each command is a fresh process tree; /scratch (the home "
        "and working directory) and /tmp persist between commands."))
    async def run_command(
            ctx: Context,
            command: Annotated[str, Field(description="a shell command line", min_length=1)],
            sandbox_id: Sid = None,
            timeout: Annotated[float | None, Field(description=(
                "seconds of wall clock, above 0, at most 86400; default the policy's "
                "limits.timeout (60 s)"), gt=0, le=86400)] = None) -> CallToolResult:
        e, r = await in_own_thread(ctx, sandbox_id, lambda e: (e, guard(
            lambda: e.sandbox.exec(["/bin/sh", "-c", command], timeout=timeout))),
            "corral-mcp-command")
        _remember(e, r.events)
        if metrics is not None:
            metrics.run(r.verdict, r.usage.wall_s or 0.0, r.events)
        d = {"verdict": r.verdict, "exit_code": r.exit_code, "signal": r.signal,
             "stdout": r.stdout, "stderr": r.stderr,
             "stdout_truncated": r.stdout_truncated, "stderr_truncated": r.stderr_truncated,
             "wall_s": r.usage.wall_s, "sandbox_id": e.id}
        denied = sum(1 for ev in r.events if _denial(ev))
        text = f"{r.verdict} (exit {r.exit_code})" + (
            f"; {denied} refused by the policy: see recent_denials" if denied else "")
        return _result(d, text + _shown("stdout", r.stdout) + _shown("stderr", r.stderr))

    @server.tool(description=(
        "Run code in a persistent interpreter of a sandbox (variables, imports and "
        "definitions persist between calls, like a notebook). Returns results (the last "
        "expression's value and display()ed values, as text and other formats; images "
        "also come back as image content), logs (stdout, stderr), and error (name, value, "
        "traceback) or null."))
    async def run_code(
            ctx: Context,
            code: Annotated[str, Field(description="the cell's source")],
            language: Annotated[Literal["python", "javascript", "bash"], Field(
                description="the interpreter")] = "python",
            sandbox_id: Sid = None,
            timeout: Annotated[float | None, Field(description=(
                "seconds, above 0, at most 86400; default 300"), gt=0,
                le=86400)] = None) -> CallToolResult:
        e, ex = await in_own_thread(ctx, sandbox_id, lambda e: (e, guard(
            lambda: e.sandbox.run_code(code, language=language, timeout=timeout))),
            "corral-mcp-cell")
        d = ex.to_dict()
        d["sandbox_id"] = e.id
        images = []
        for res in ex.results:
            for attr, mime in (("png", "image/png"), ("jpeg", "image/jpeg")):
                data = getattr(res, attr, None)
                if isinstance(data, str) and data:
                    images.append(ImageContent(type="image", data=data, mime_type=mime))
        if ex.error is not None:
            text = f"{ex.error.name}: {ex.error.value}"
        else:
            text = ex.text if ex.text is not None else "(no value)"
        logs = "".join(ex.logs.stdout)
        text = text[:OUTPUT_SHOWN] + _shown("stdout", logs)
        if images:
            text += f"\n{len(images)} image(s)"
        return _result(d, text, images)

    @server.tool(description=(
        "Read a file in a sandbox as UTF-8 text (undecodable bytes replaced). Relative "
        "paths are from the working directory (/scratch). Refused past 64 MiB."))
    def read_file(ctx: Context,
                  path: Annotated[str, Field(description="the file's path in the sandbox")],
                  sandbox_id: Sid = None) -> CallToolResult:
        _, e = sandbox(ctx, sandbox_id)
        local = guard(lambda: local_name(path))
        with e.files_lock:
            text = guard(lambda: e.sandbox.files.read(local))
        return _result({"path": path, "content": text}, text[:OUTPUT_SHOWN] + (
            f"\n[{len(text)} characters; the whole file is in the structured content]"
            if len(text) > OUTPUT_SHOWN else ""))

    @server.tool(description=(
        "Write text to a file in a sandbox (made with its parent directories, replaced if "
        "it exists). Only /scratch, /tmp, /dev/shm and a writable workspace are writable."))
    def write_file(ctx: Context,
                   path: Annotated[str, Field(description="the file's path in the sandbox")],
                   content: Annotated[str, Field(description="the text to write (UTF-8)")],
                   sandbox_id: Sid = None) -> CallToolResult:
        _, e = sandbox(ctx, sandbox_id)
        local = guard(lambda: local_name(path))
        with e.files_lock:
            info = guard(lambda: e.sandbox.files.write(local, content))
        return _result(wire_names(info), f"wrote {len(content.encode())} bytes to "
                       f"{wire_name(info.path)}")

    @server.tool(description=(
        "List a directory in a sandbox: name, path, type (file, dir, symlink, ...), size in "
        "bytes, mode and mtime of each entry, `depth` levels down (1 to 8)."))
    def list_files(ctx: Context,
                   path: Annotated[str, Field(description="a directory; default the working "
                                              "directory")] = ".",
                   depth: Annotated[int, Field(description="levels to descend", ge=1,
                                               le=8)] = 1,
                   sandbox_id: Sid = None) -> CallToolResult:
        _, e = sandbox(ctx, sandbox_id)
        local = guard(lambda: local_name(path))
        with e.files_lock:
            entries = guard(lambda: e.sandbox.files.list(local, depth=depth))
        names = [wire_name(x.path) + ("/" if x.type == "dir" else "") for x in entries]
        return _result({"entries": [wire_names(x) for x in entries]},
                       "\n".join(names[:200]) or "(empty)")

    @server.tool(description=(
        "Explain a sandbox's policy: what the code can see (filesystem), where it can "
        "connect (network), which credentials it holds (by name, never values), and what "
        "enforces each rule on its tier."))
    def explain_policy(ctx: Context, sandbox_id: Sid = None) -> CallToolResult:
        from ..runtime.explain import explain

        _, e = sandbox(ctx, sandbox_id)
        d = guard(lambda: explain(e.policy))
        return _result(d, f"tier {e.sandbox.isolation}; the three questions in the "
                       "structured content")

    @server.tool(description=(
        "What a sandbox changed in its workspace so far, for review: each path added, "
        "modified or deleted, with a unified diff of text files (diffs up to 1 MiB in all "
        "per answer). Needs a workspace in review mode (filesystem.workspace mode = "
        "\"review\"). Nothing is applied to the host: the user reviews and applies on the "
        "host (`corral changes apply`)."))
    def get_changes(ctx: Context, sandbox_id: Sid = None) -> CallToolResult:
        _, e = sandbox(ctx, sandbox_id)
        with e.lock:
            changes = guard(lambda: e.sandbox.changes())
        out, budget, cut = [], CHANGES_MAX, False
        for c in changes:
            d = wire_names(c)
            diff = d.get("diff") or ""
            if len(diff) > budget:
                d["diff"], d["diff_truncated"], cut = diff[:budget], True, True
            budget -= len(d.get("diff") or "")
            out.append(d)
        text = "\n".join(f"{c.kind} {wire_name(c.path)}" for c in changes[:200]) or \
            "no changes"
        return _result({"changes": out, "truncated": cut}, text)

    @server.tool(description=(
        "What a sandbox tried and was refused (network connections, secret use, limits "
        "hit) in its recent commands (the last 50), each with the policy rule that would "
        "allow it, so you can ask the user; no tool can widen the policy."))
    def recent_denials(ctx: Context, sandbox_id: Sid = None) -> CallToolResult:
        _, e = sandbox(ctx, sandbox_id)
        got = list(getattr(e, "denials", []))
        text = "\n".join(f"{d.get('kind')} {d.get('host') or d.get('limit') or ''}: "
                         f"would need {d['would_allow']}" for d in got) or "nothing refused"
        return _result({"denials": got}, text)

    @server.tool(description=(
        "Kill a sandbox: its processes end and its files are deleted (changes not applied "
        "on the host are lost)."))
    def kill_sandbox(ctx: Context, sandbox_id: Annotated[str, Field(
            description="the sandbox's id")]) -> CallToolResult:
        who = caller(ctx)
        if not registry.remove(who.owner, sandbox_id):
            raise ToolError(f"no sandbox {sandbox_id!r}")
        with defaults_mu:
            if defaults.get(who.session) == sandbox_id:
                del defaults[who.session]
        return _result({"killed": sandbox_id}, f"killed {sandbox_id}")

    def end_session(key: str, owner: str) -> None:
        """Kill the session's own sandbox (its others live on until killed)."""
        with defaults_mu:
            sid = defaults.pop(key, None)
            used.pop(key, None)
        if sid is not None:
            registry.remove(owner, sid)

    def idle(key: str) -> float:
        """Seconds since the session's own sandbox was last used."""
        with defaults_mu:
            return time.monotonic() - used.get(key, time.monotonic())

    server.corral_end_session = end_session
    server.corral_idle = idle
    server.corral_defaults = defaults
    return server, registry


def _whole(ceiling: dict) -> dict:
    """The ceiling itself as a request (a session's own sandbox gets all it allows): its
    secrets by name and hosts, their sources left to the ceiling."""
    raw = dict(ceiling)
    if isinstance(raw.get("secrets"), dict):
        raw["secrets"] = {n: {k: v for k, v in t.items() if k not in ("from", "value")}
                          if isinstance(t, dict) else t for n, t in raw["secrets"].items()}
    return raw


def _result(d: dict, text: str, extra=()):
    """A tool's answer; a name the sandbox made that is not UTF-8 is in its wire form
    (common.wire_name), in the text and the structured content alike."""
    from mcp_types import TextContent

    from .common import wire_json

    return CallToolResult(content=[TextContent(type="text", text=wire_json(text)), *extra],
                          structured_content=wire_json(d))


def _shown(name: str, text: str) -> str:
    if not text:
        return ""
    cut = text[:OUTPUT_SHOWN]
    more = f"\n[{len(text) - len(cut)} more characters]" if len(text) > len(cut) else ""
    return f"\n{name}:\n{cut}{more}"


def _denial(ev: dict) -> bool:
    kind = ev.get("kind")
    return (kind in ("net", "secret") and ev.get("decision") not in ("allow", "inject")) \
        or kind == "limit"


def _remember(e, events: list[dict], keep: int = 50) -> None:
    """Keep the denials of a sandbox's recent commands, with the rule that would allow each."""
    got = getattr(e, "denials", None)
    if got is None:
        got = e.denials = []
    for ev in events:
        kind = ev.get("kind")
        if not _denial(ev):
            continue
        if kind == "net":
            got.append({**ev, "would_allow": f"network.allow += [\"{ev.get('host')}:"
                        f"{ev.get('port')}\"]"})
        elif kind == "secret":
            got.append({**ev, "would_allow": f"secrets.{ev.get('name')}.hosts += "
                        f"[\"{ev.get('host')}\"]"})
        elif kind == "limit":
            got.append({**ev, "would_allow": f"limits.{ev.get('limit')}"})
    del got[:-keep]


def run_stdio(policy_file: str | None = None, max_sandboxes: int | None = None) -> int:
    ceiling = {}
    if policy_file is not None:
        from ..policy.load import policy_from_dict, read_toml

        ceiling = read_toml(policy_file)
        policy_from_dict(ceiling, allow_literal=False)   # a bad policy fails here, not later
    server, registry = build(ceiling, max_sandboxes=max_sandboxes)
    try:
        server.run("stdio")
    finally:
        registry.close_all()     # the session's end is its sandboxes' end
    return 0


