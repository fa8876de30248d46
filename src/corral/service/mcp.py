"""`corral mcp`: an MCP server on stdio (the official `mcp` SDK) for coding assistants.

Sandboxes run in this process (corral.Sandbox, through the service's Registry). Every
sandbox of the session stays within one ceiling: the policy file given with --policy
(default: corral's default policy: no network, no secrets, no workspace). A tool call with
no sandbox_id uses the session's own sandbox, created on first use with the ceiling policy
itself, and every sandbox ends with the session. No tool applies changes to the host or
widens a policy: those stay with the human on the host.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ..errors import CorralError
from .ceiling import Exceeds, requested
from .registry import Registry

OWNER = "mcp"
OUTPUT_SHOWN = 64 << 10      # characters of a stream put into the short text of a result

Sid = Annotated[str | None, Field(description=(
    "a sandbox id from create_sandbox; omitted: the session's own sandbox (created on "
    "first use with the server's policy)"))]


def build(ceiling_data: dict | None = None, *, opener=None):
    """The MCPServer with corral's tools; returns (server, registry)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    ceiling_data = ceiling_data or {}
    registry = Registry(opener) if opener is not None else Registry()
    state = {"default": None}
    server = MCPServer("corral", instructions=(
        "Run commands and code in corral sandboxes: isolated from the host, no network "
        "unless the server's policy allows hosts, limits on memory, time and processes. "
        "Files under /scratch and /tmp persist between calls to the same sandbox."))

    def sandbox(sid: str | None):
        if sid is None:
            if state["default"] is None or registry.get(OWNER, state["default"]) is None:
                state["default"] = guard(lambda: registry.create(
                    OWNER, requested({}, ceiling_data))).id
            sid = state["default"]
        e = registry.get(OWNER, sid)
        if e is None:
            raise ToolError(f"no sandbox {sid!r}; create_sandbox makes one")
        return e

    def guard(fn):
        try:
            return fn()
        except Exceeds as e:
            raise ToolError(f"refused by the server's policy: {e.field}: {e.message}; ask the "
                            "user to widen the policy on the host") from None
        except CorralError as e:
            raise ToolError(str(e)) from None

    @server.tool(description=(
        "Create a sandbox and return its id. `policy` is a corral policy as JSON (the TOML "
        "layout of docs/policy.md, e.g. {\"limits\": {\"memory\": \"1G\", \"timeout\": "
        "\"2m\"}, \"network\": {\"mode\": \"allow\", \"allow\": [\"pypi.org\"]}}); it must "
        "stay within the server's policy (a wider one is refused naming the rule). Fields "
        "left out take the server's. The sandbox lives until kill_sandbox or the session's "
        "end."))
    def create_sandbox(policy: Annotated[dict[str, Any] | None, Field(
            description="a corral policy as JSON; omitted: the server's own")] = None,
                       ) -> dict[str, Any]:
        e = guard(lambda: registry.create(OWNER, requested(policy or {}, ceiling_data)))
        return {"sandbox_id": e.id, "isolation": e.sandbox.isolation}

    @server.tool(description=(
        "Run a shell command line (/bin/sh -c) in a sandbox and wait for it. Returns "
        "verdict (ok, error, killed, timeout, oom), exit_code, stdout and stderr (each kept "
        "up to the policy's limits.output, 1 MiB by default; *_truncated says if cut) and "
        "wall seconds. Each command is a fresh process tree; /scratch (the home directory) "
        "and /tmp persist between commands."))
    def run_command(
            command: Annotated[str, Field(description="a shell command line", min_length=1)],
            sandbox_id: Sid = None,
            timeout: Annotated[float | None, Field(description=(
                "seconds of wall clock; default the policy's limits.timeout (60 s)"),
                gt=0, le=86400)] = None) -> dict[str, Any]:
        e = sandbox(sandbox_id)
        with e.lock:
            r = guard(lambda: e.sandbox.exec(["/bin/sh", "-c", command], timeout=timeout))
        _remember(e, r.events)
        return {"verdict": r.verdict, "exit_code": r.exit_code, "signal": r.signal,
                "stdout": r.stdout, "stderr": r.stderr,
                "stdout_truncated": r.stdout_truncated, "stderr_truncated": r.stderr_truncated,
                "wall_s": r.usage.wall_s, "sandbox_id": e.id}

    @server.tool(description=(
        "Run code in a persistent interpreter of a sandbox (variables, imports and "
        "definitions persist between calls, like a notebook). Returns results (the last "
        "expression's value, as text and other formats), stdout, stderr and error (name, "
        "value, traceback) or null."))
    def run_code(
            code: Annotated[str, Field(description="the cell's source")],
            language: Annotated[Literal["python", "javascript", "bash"], Field(
                description="the interpreter")] = "python",
            sandbox_id: Sid = None,
            timeout: Annotated[float | None, Field(description="seconds; default 300", gt=0,
                                                   le=86400)] = None) -> dict[str, Any]:
        e = sandbox(sandbox_id)
        with e.lock:
            ex = guard(lambda: e.sandbox.run_code(code, language=language, timeout=timeout))
        d = ex.to_dict()
        d["sandbox_id"] = e.id
        return d

    @server.tool(description=(
        "Read a file in a sandbox as UTF-8 text (undecodable bytes replaced). Relative "
        "paths are from the working directory (/scratch). Refused past 64 MiB."))
    def read_file(path: Annotated[str, Field(description="the file's path in the sandbox")],
                  sandbox_id: Sid = None) -> dict[str, Any]:
        e = sandbox(sandbox_id)
        with e.lock:
            text = guard(lambda: e.sandbox.files.read(path))
        return {"path": path, "content": text}

    @server.tool(description=(
        "Write text to a file in a sandbox (made with its parent directories, replaced if "
        "it exists). Only /scratch, /tmp, /dev/shm and a writable workspace are writable."))
    def write_file(path: Annotated[str, Field(description="the file's path in the sandbox")],
                   content: Annotated[str, Field(description="the text to write (UTF-8)")],
                   sandbox_id: Sid = None) -> dict[str, Any]:
        e = sandbox(sandbox_id)
        with e.lock:
            info = guard(lambda: e.sandbox.files.write(path, content))
        return info.to_dict()

    @server.tool(description=(
        "List a directory in a sandbox: name, path, type (file, dir, symlink, ...), size in "
        "bytes, mode and mtime of each entry, `depth` levels down."))
    def list_files(path: Annotated[str, Field(description="a directory; default the working "
                                              "directory")] = ".",
                   depth: Annotated[int, Field(description="levels to descend", ge=1,
                                               le=8)] = 1,
                   sandbox_id: Sid = None) -> dict[str, Any]:
        e = sandbox(sandbox_id)
        with e.lock:
            entries = guard(lambda: e.sandbox.files.list(path, depth=depth))
        return {"entries": [x.to_dict() for x in entries]}

    @server.tool(description=(
        "Explain a sandbox's policy: what the code can see (filesystem), where it can "
        "connect (network), which credentials it holds (by name, never values), and what "
        "enforces each rule on its tier."))
    def explain_policy(sandbox_id: Sid = None) -> dict[str, Any]:
        from ..runtime.explain import explain

        e = sandbox(sandbox_id)
        return guard(lambda: explain(e.policy))

    @server.tool(description=(
        "What a sandbox tried and was refused (network connections, secret use, limits "
        "hit) in its recent commands, each with the policy rule that would allow it, so "
        "you can ask the user; no tool can widen the policy."))
    def recent_denials(sandbox_id: Sid = None) -> dict[str, Any]:
        e = sandbox(sandbox_id)
        return {"denials": list(getattr(e, "denials", []))}

    @server.tool(description="Kill a sandbox: its processes end and its files are deleted.")
    def kill_sandbox(sandbox_id: Annotated[str, Field(description="the sandbox's id")]) -> dict[str, Any]:
        if not registry.remove(OWNER, sandbox_id):
            raise ToolError(f"no sandbox {sandbox_id!r}")
        if state["default"] == sandbox_id:
            state["default"] = None
        return {"killed": sandbox_id}

    return server, registry


def _remember(e, events: list[dict], keep: int = 50) -> None:
    """Keep the denials of a sandbox's recent commands, with the rule that would allow each."""
    got = getattr(e, "denials", None)
    if got is None:
        got = e.denials = []
    for ev in events:
        kind = ev.get("kind")
        if kind == "net" and ev.get("decision") != "allow":
            got.append({**ev, "would_allow": f"network.allow += [\"{ev.get('host')}:"
                        f"{ev.get('port')}\"]"})
        elif kind == "secret" and ev.get("decision") != "allow":
            got.append({**ev, "would_allow": f"secrets.{ev.get('name')}.hosts += "
                        f"[\"{ev.get('host')}\"]"})
        elif kind == "limit":
            got.append({**ev, "would_allow": f"limits.{ev.get('limit')}"})
    del got[:-keep]


def run_stdio(policy_file: str | None = None) -> int:
    ceiling = {}
    if policy_file is not None:
        from ..policy.load import policy_from_dict, read_toml

        ceiling = read_toml(policy_file)
        policy_from_dict(ceiling, allow_literal=False)   # a bad policy fails here, not later
    server, registry = build(ceiling)
    try:
        server.run("stdio")
    finally:
        registry.close_all()     # the session's end is its sandboxes' end
    return 0


