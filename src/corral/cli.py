"""The `corral` command.

    corral run [options] -- CMD...     run CMD in a sandbox (tiers: namespace, gvisor, process)
    corral policy show [options]       print the effective policy as TOML
    corral explain [options]           what enforces each rule of a policy on a tier
    corral doctor                      what this host supports
    corral probe [options]             the attack catalogue against each tier
    corral --version

Exit status of `run`: the command's own; 128+N when signal N ended it; 124 on timeout; 137
on oom; 2 for a usage or policy error; 3 when the tier cannot enforce the policy; 125 when
corral failed to set the sandbox up. For 2, 3 and 125 no command ran.

This module is on the start-up path of every `corral run`: it imports only the standard
library pieces it needs and the sandbox code.
"""

from __future__ import annotations

import os
import sys

from . import __version__
from .errors import CorralError, UsageError, one_line


def _help(name: str) -> None:
    """Print a command's usage (cli_help.py: loaded only when asked for)."""
    from .cli_help import USAGE

    sys.stdout.write(USAGE[name])


_VALUE_FLAGS = {
    "--timeout": ("limits", "timeout"), "--cpu-time": ("limits", "cpu_time"),
    "--memory": ("limits", "memory"), "--cpus": ("limits", "cpus"),
    "--pids": ("limits", "pids"), "--scratch-size": ("limits", "scratch"),
    "--output-limit": ("limits", "output"),
}


class RunArgs:
    def __init__(self) -> None:
        self.policy_file: str | None = None
        self.overrides: dict = {}
        self.env_pass: list[str] = []
        self.env_set: dict[str, str] = {}
        self.ro_binds: list[str] = []
        self.net_lists: dict[str, list[str]] = {}
        self.secrets: dict[str, dict] = {}
        self.plain_http: list[str] = []
        self.stdin = False
        self.apply = self.discard = False   # review mode: what to do with the changes
        self.patch: str | None = None
        self.tty = False
        self.raw = False
        self.json = False
        self.help = False
        self.receipt: str | None = None
        self.command: list[str] = []


def parse_run_args(args: list[str], *, want_command: bool) -> RunArgs:
    """Hand-rolled (argparse costs start-up time): `--flag value` and `--flag=value`."""
    r = RunArgs()
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            r.command = args[i + 1:]
            break
        if not a.startswith("-") or a == "-":
            if want_command:
                r.command = args[i:]
                break
            raise UsageError(f"unexpected argument {a!r}", field=a)
        name, eq, inline = a.partition("=")

        def value() -> str:
            nonlocal i
            if eq:
                return inline
            i += 1
            if i >= len(args):
                raise UsageError(f"{name} needs a value", field=name)
            return args[i]

        if name in ("-h", "--help"):
            r.help = True
        elif name in ("--stdin", "--raw", "--json", "--tty", "--apply", "--discard") and not eq:
            setattr(r, name[2:], True)
        elif name == "-t" and not eq:
            r.tty = True
        elif name == "--patch":
            r.patch = value()
        elif name == "--receipt":
            r.receipt = os.path.abspath(value())
        elif name == "--policy":
            r.policy_file = value()
        elif name == "--isolation":
            r.overrides["isolation"] = value()
        elif name == "--image":
            r.overrides["image"] = value()
        elif name in _VALUE_FLAGS:
            section, key = _VALUE_FLAGS[name]
            r.overrides.setdefault(section, {})[key] = value()
        elif name == "--env":
            v = value()
            if "=" in v:
                k, _, val = v.partition("=")
                r.env_set[k] = val
            else:
                r.env_pass.append(v)
        elif name == "--workspace":
            path, mode, mount_at = parse_workspace_flag(value())
            ws = r.overrides.setdefault("filesystem", {})["workspace"] = {
                "path": os.path.abspath(path), "mode": mode}
            if mount_at:
                ws["mount_at"] = mount_at
        elif name == "--net":
            r.overrides.setdefault("network", {})["mode"] = value()
        elif name in ("--allow-domain", "--deny-domain", "--allow-private", "--nameserver"):
            key = {"--allow-domain": "allow", "--deny-domain": "deny",
                   "--allow-private": "allow_private", "--nameserver": "nameservers"}[name]
            r.net_lists.setdefault(key, []).append(value())
            if name == "--allow-domain":
                r.overrides.setdefault("network", {}).setdefault("mode", "allow")
        elif name == "--secret":
            r.secrets.update(parse_secret_flag(value()))
        elif name == "--plain-http":
            r.plain_http.append(value())
        elif name == "--upstream-ca":
            r.overrides.setdefault("network", {})["upstream_ca"] = os.path.abspath(value())
        elif name == "--ro-bind":
            r.ro_binds.append(os.path.abspath(value()))
        else:
            raise UsageError(f"unknown option {name}; see corral run --help", field=name)
        i += 1
    return r


def parse_workspace_flag(text: str) -> tuple[str, str, str | None]:
    """PATH[:ro|:rw|:review][:same] -> (path, mode, mount_at). A last `:part` without a slash that
    is not a mode is refused, naming it, unless the whole text is an existing path (a
    directory may have a colon in its name)."""
    mount_at = None
    if text.endswith(":same") and not os.path.exists(text):   # PATH[:MODE]:same
        text, mount_at = text[:-5], "same"
    path, colon, mode = text.rpartition(":")
    if not colon or "/" in mode or not mode:
        return text, "ro", mount_at
    if mode in ("ro", "rw", "review"):
        return path, mode, mount_at
    if os.path.exists(text):
        return text, "ro", mount_at
    raise UsageError(f'mode "{mode}" is not one of ro, rw, review (write PATH:ro, PATH:rw, '
                     f'PATH:review or PATH:rw:same)', field="--workspace")


def parse_secret_flag(text: str) -> dict[str, dict]:
    """NAME=SOURCE@host1,host2[/ttl] -> {NAME: {from, hosts, ttl?}}"""
    name, eq, rest = text.partition("=")
    source, at, hosts = rest.rpartition("@")
    if not eq or not at or not name or not source or not hosts:
        raise UsageError(f"{text!r} is not NAME=SOURCE@HOST[,HOST...][/TTL]; e.g. "
                         f"GITHUB_TOKEN=env:GITHUB_TOKEN@api.github.com/15m", field="--secret")
    table: dict = {"from": source}
    if "/" in hosts:
        hosts, _, table["ttl"] = hosts.rpartition("/")
    table["hosts"] = [h for h in hosts.split(",") if h]
    return {name: table}


def effective_policy(r: RunArgs):
    if not (r.policy_file or r.overrides or r.env_pass or r.env_set or r.net_lists
            or r.ro_binds or r.secrets or r.plain_http):
        from .audit.record import default_policy  # Policy(): policy_from_dict({})'s

        return default_policy()   # one per process: its audit record is found by identity
    from .policy import merge, policy_from_dict
    from .policy.load import read_toml

    data = read_toml(r.policy_file) if r.policy_file else {}
    data = merge(data, r.overrides)
    if r.env_pass or r.env_set:
        env = dict(data.get("env", {}))
        if r.env_pass:
            env["pass"] = [*env.get("pass", []), *r.env_pass]
        if r.env_set:
            env["set"] = {**env.get("set", {}), **r.env_set}
        data["env"] = env
    if r.net_lists:
        net = dict(data.get("network", {}))
        for key, items in r.net_lists.items():
            net[key] = [*net.get(key, []), *items]
        data["network"] = net
    if r.ro_binds:
        fs = dict(data.get("filesystem", {}))
        fs["ro_binds"] = [*fs.get("ro_binds", []), *r.ro_binds]
        data["filesystem"] = fs
    if r.secrets:
        data["secrets"] = {**data.get("secrets", {}), **r.secrets}
    for name in r.plain_http:
        secrets = data.get("secrets", {})
        if not isinstance(secrets.get(name), dict):
            raise UsageError(f"no secret {name!r} to send over plain HTTP; grant it with "
                             f"--secret {name}=SOURCE@HOST (or in the policy file) first",
                             field="--plain-http")
        data["secrets"] = {**secrets, name: {**secrets[name], "plain_http": True}}
    return policy_from_dict(data, allow_literal=False)


def _fail(err: CorralError, as_json: bool) -> int:
    sys.stderr.write(f"corral: {err}\n")
    if as_json:
        import json

        sys.stdout.write(json.dumps({"error": err.to_dict()}) + "\n")
    return err.exit_code


def cmd_run(args: list[str]) -> int:
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    r = sb = None
    try:
        r = parse_run_args(args, want_command=True)
        if r.help:
            _help("RUN")
            return 0
        if not r.command:
            raise UsageError("no command given; write corral run [options] -- CMD...",
                             field="CMD")
        policy = effective_policy(r)
        review = _review_mode(r, policy)
        os.environ.setdefault("CORRAL_AUDIT_FACE", "cli")   # the audit store's face
        from .audit.record import flush, use_spool

        use_spool()   # a short-lived process: its record goes to the spool, no SQLite here
        from .backends.host.cgroups import POOL

        POOL.short_lived()   # and its sandbox's cgroups are removed at close, not pooled
        if r.tty:
            return _run_tty(r, policy)
        from .runtime.sandbox import Sandbox

        if not r.stdin and os.isatty(0):  # the user may think they typed into the sandbox
            sys.stderr.write("corral: stdin is a terminal and is not connected to the "
                             "sandbox (the command reads end of file); use -t for an "
                             "interactive shell\n")
        stdin = 0 if r.stdin else None
        on_out = on_err = None
        writers = []
        if not r.json:
            on_out, on_err = output_writer(sys.stdout, r.raw), output_writer(sys.stderr, r.raw)
            writers = [on_out, on_err]
        tee = None
        if r.receipt:   # the bytes the command wrote (and read) are hashed as they pass
            from .audit.cli import Hasher, StdinTee

            on_out, on_err = Hasher(on_out), Hasher(on_err)
            writers = [on_out, on_err]
            if r.stdin and not os.isatty(0):   # a terminal: refused by exec, as without
                tee = StdinTee(0)
                stdin = tee.r

        with _terminate_cleanly():
            with Sandbox(policy, _argv=r.command) as sb:
                gc_back_on()
                try:
                    result = sb.exec(r.command, stdin=stdin, on_stdout=on_out,
                                     on_stderr=on_err)
                finally:
                    if tee is not None:
                        os.close(tee.r)
                for w in writers:
                    if hasattr(w, "finish"):
                        w.finish()
                if review:
                    review = _review(sb, r)
                if r.receipt:
                    from .audit.cli import write_receipt

                    write_receipt(r.receipt, sb, result, r.command, tee, on_out, on_err,
                                  review.get("changes") if review else None)
        flush()   # the record (one spool line), before the Result is shown: a lost one
        #         is in its events
    except CorralError as e:
        if sb is None and r is not None and r.command and e.kind != "usage":
            _refused(r.command, e)   # refused before it started: recorded (docs/audit.md)
        return _fail(e, as_json)
    if r.json:
        if review:
            import json

            d = json.loads(result.to_json())
            d["review"] = review
            sys.stdout.write(json.dumps(d) + "\n")
        else:
            sys.stdout.write(result.to_json() + "\n")
    else:
        _print_events(result.events)
    return result.cli_exit_status()


def _refused(argv: list[str], e: CorralError) -> None:
    os.environ.setdefault("CORRAL_AUDIT_FACE", "cli")
    from .audit.record import flush, use_spool
    from .runtime.sandbox import refused

    use_spool()
    refused(e, argv, None)   # once: a Sandbox that refused its policy has recorded it
    flush()


def _review_mode(r: RunArgs, policy) -> bool:
    """Whether the workspace is in review mode; --apply, --discard and --patch need it."""
    ws = policy.filesystem.workspace
    on = ws is not None and ws.mode == "review"
    flag = "--apply" if r.apply else "--discard" if r.discard else "--patch" if r.patch \
        else None
    if flag and not on:
        raise UsageError(f"{flag} is for a workspace in review mode; give --workspace "
                         f"PATH:review", field=flag)
    if r.apply and r.discard:
        raise UsageError("--apply and --discard exclude each other", field="--apply")
    if on and r.tty:
        raise UsageError("review mode does not take -t yet; run without it",
                         field="--tty")
    return on


def _review(sb, r: RunArgs) -> dict:   # cli_review.py: loaded only in review mode
    from .cli_review import review

    return review(sb, r)


def _print_events(events: list[dict], *, output_limit: bool = True) -> None:
    """The events a person should see, on stderr, each field one line of printable text
    (errors.one_line): what corral writes there today is its own (paths it named, an
    errno's text, a guest's frame kind by repr), but an event's text may quote a name
    a sandbox chose, and an escape sequence or a bidi control in it must not reach the
    user's terminal."""
    for e in events:
        if e["kind"] == "audit":   # the record of this run was lost (docs/audit.md)
            sys.stderr.write(f"corral: audit: {one_line(str(e.get('message')))}\n")
        elif e["kind"] in ("limit", "teardown", "unenforced") and (
                output_limit or e.get("limit") != "output"):
            what = e.get("limit") or e.get("rule") or e["kind"]
            text = str(e.get("message") or e.get("reason"))
            if e["kind"] == "unenforced":
                from .runtime.notices import due_event, standing

                if standing(e):
                    if not due_event(e):
                        continue
                    text += " (shown once a day; --json reports it on every run)"
            sys.stderr.write(f"corral: {e['kind']} {one_line(str(what))}: "
                             f"{one_line(text)}\n")


def _run_tty(r: RunArgs, policy) -> int:   # cli_terminal.py: loaded only for -t
    from .cli_terminal import run_tty

    return run_tty(r, policy)


def cmd_shell(args: list[str]) -> int:   # cli_terminal.py
    from .cli_terminal import cmd_shell as shell

    return shell(args)


def output_writer(stream, raw: bool = False):
    """Where a command's output goes as it comes (`corral run`, `corral learn`): to a
    terminal through termsafe's SafeWriter unless `raw`, else its bytes as they are."""
    if raw or not stream.isatty():
        buf = stream.buffer

        def write(data: bytes) -> None:
            buf.write(data)
            buf.flush()
        return write
    from .termsafe import SafeWriter

    return SafeWriter(stream)


class _terminate_cleanly:
    """SIGTERM and SIGHUP become KeyboardInterrupt, so teardown runs on the way out."""

    def __enter__(self):
        import _signal  # the C module: `signal` would import enum on the start-up path

        self._old = {s: _signal.signal(s, self._raise) for s in (_signal.SIGTERM, _signal.SIGHUP)}
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        import _signal

        for s, h in self._old.items():
            _signal.signal(s, h)


def cmd_policy(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        _help("POLICY")
        return 0 if args else 2
    if args[0] != "show":
        return _fail(UsageError(f"unknown policy command {args[0]!r}; use: corral policy show",
                                field="policy"), False)
    try:
        r = parse_run_args(args[1:], want_command=False)
        if r.help:
            _help("POLICY")
            return 0
        from .policy import dump_toml

        sys.stdout.write(dump_toml(effective_policy(r)))
    except CorralError as e:
        return _fail(e, False)
    return 0


def cmd_doctor(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write("usage: corral doctor [--json]\n\nWhat this host supports for "
                         "each tier, and how to fix what is missing.\n")
        return 0
    from .runtime.doctor import report

    return report(as_json="--json" in args)


def cmd_explain(args: list[str]) -> int:
    try:
        r = parse_run_args(args, want_command=False)
        if r.help:
            _help("EXPLAIN")
            return 0
        from .runtime.explain import explain, render

        d = explain(effective_policy(r))
    except CorralError as e:
        return _fail(e, r.json if "r" in locals() else False)
    if r.json:
        import json

        sys.stdout.write(json.dumps(d, indent=2) + "\n")
    else:
        sys.stdout.write(render(d))
    return 0 if d["runs"] else 3


def cmd_probe(args: list[str]) -> int:
    from .probe import main as probe_main  # loaded only here, never on run's path

    return probe_main(args)


def cmd_image(args: list[str]) -> int:
    from .images.cli import cmd_image as image_main  # loaded only here, never on run's path

    return image_main(args)


def cmd_install(args: list[str]) -> int:
    from .images.cli import cmd_install as install_main

    return install_main(args)


def cmd_sandbox(args: list[str]) -> int:   # cli_sandbox.py: loaded only here
    from .cli_sandbox import cmd_sandbox as sandbox

    return sandbox(args)


def cmd_audit(name: str):
    def run(args: list[str]) -> int:   # loaded only here (audit/cli.py): never on run's path
        from .audit.cli import main as audit_main

        return audit_main(name, args)
    return run


def cmd_learn(args: list[str]) -> int:   # audit/cli_learn.py: loaded only here
    from .audit.cli_learn import main as learn_main

    return learn_main(args, parse_run_args, effective_policy, output_writer)


def cmd_service(name: str):
    def run(args: list[str]) -> int:   # loaded only here: fastapi, uvicorn, mcp stay off run's path
        from .service.cli import main as service_main

        return service_main(name, args)
    return run


def cmd_batch(args: list[str]) -> int:   # scale/cli.py: ray stays off run's path
    from .scale.cli import main as batch_main

    return batch_main(args)


COMMANDS = {"run": cmd_run, "shell": cmd_shell, "policy": cmd_policy, "doctor": cmd_doctor,
            "explain": cmd_explain, "probe": cmd_probe, "image": cmd_image,
            "install": cmd_install, "sandbox": cmd_sandbox, "learn": cmd_learn,
            "serve": cmd_service("serve"),
            "token": cmd_service("token"), "mcp": cmd_service("mcp"), "batch": cmd_batch}
for _name in ("runs", "logs", "denials", "gc", "audit", "verify", "key"):
    COMMANDS[_name] = cmd_audit(_name)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        _help("MAIN")
        return 0 if args else 2
    if args[0] == "--version":
        sys.stdout.write(f"corral {__version__}\n")
        return 0
    cmd = COMMANDS.get(args[0])
    if cmd is not cmd_run:
        gc_back_on()
    if cmd is None:
        sys.stderr.write(f"corral: unknown command {args[0]!r}; see corral --help\n")
        return 2
    try:
        return cmd(args[1:])
    except KeyboardInterrupt:
        sys.stderr.write("corral: interrupted; the sandbox was torn down\n")
        return 130


def gc_back_on() -> None:
    """The launcher starts with the cyclic GC off (the run path's imports would set off
    ~1 ms of collections). On again, what exists by then frozen (gc.freeze), before a
    sandbox's command starts and first thing for every other command (serve runs for days)."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def entry() -> None:
    """`corral` (the launcher, [project.scripts]): main(), then Python's own exit without
    the interpreter's finalization (~1.4 ms of `corral run`): threads (one alive: the normal
    exit, which waits), atexit handlers, stdout and stderr flushed (failed: 120, as Python
    exits), os._exit. An exception other than SystemExit takes the normal path."""
    try:
        code = main()
    except SystemExit as e:
        if not isinstance(e.code, int | None):
            raise
        code = e.code
    code = code or 0
    th = sys.modules.get("threading")
    if th and any(t is not th.main_thread() and not t.daemon for t in th.enumerate()):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()   # each handler once: the list is cleared after
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            code = code or 120
    os._exit(code)


if __name__ == "__main__":
    entry()
