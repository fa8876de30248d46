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
from .errors import CorralError, UsageError


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
            on_out, on_err = _writer(sys.stdout, r.raw), _writer(sys.stderr, r.raw)
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


def _review(sb, r: RunArgs) -> dict:
    """After the command: list the changes (stderr), write --patch, then apply them
    (--apply, or those accepted at the terminal), drop them (--discard) or leave the
    host untouched and say how to apply. Returns the summary for --json."""
    from .runtime.changes import show

    changes = sb.changes()
    say = sys.stderr.write
    out: dict = {"changes": [c.to_dict() for c in changes], "applied": [], "conflicts": [],
                 "refused": [], "patch": None}
    if not changes:
        say("corral: review: the command changed nothing in the workspace\n")
        return out
    say(f"corral: review: {len(changes)} change(s) to the workspace, none on the host yet:\n")
    for c in changes:
        say(f"  {c.summary()}\n")
    if r.patch:
        data, left = sb.changes_patch()
        with open(r.patch, "wb") as f:
            f.write(data)
        out["patch"] = r.patch
        say(f"corral: review: wrote the patch to {r.patch} (git apply {r.patch})\n")
        for path, why in left:
            say(f"corral: review: not in the patch: {show(path)}: {why}\n")
    paths = None
    if r.discard:
        sb.discard_changes()
        say("corral: review: changes discarded; the host workspace is untouched\n")
        return out
    if not r.apply:
        if r.patch or r.json or r.stdin or not (os.isatty(0) and os.isatty(2)):
            if not r.patch:
                say("corral: review: nothing was applied (no terminal to ask on); the host "
                    "workspace is untouched. Run again with --apply to copy the changes, or "
                    "--patch FILE to write them as a patch\n")
            return out
        paths = _ask(changes)
        if not paths:
            say("corral: review: nothing applied; the host workspace is untouched\n")
            return out
    done = sb.apply_changes(paths, exact=paths is not None)
    out.update(applied=list(done.applied), conflicts=[list(x) for x in done.conflicts],
               refused=[list(x) for x in done.refused])
    say(f"corral: review: applied {len(done.applied)} change(s) to the host workspace\n")
    for path, why in done.conflicts:
        say(f"corral: review: CONFLICT, left: {show(path)}: {why}\n")
    for path, why in done.refused:
        say(f"corral: review: REFUSED: {show(path)}: {why}\n")
    return out


def _ask(changes) -> list[str]:
    """y/n per change on the terminal (a: this and the rest, q: none of the rest). The
    directories a file needs come with it; a deleted directory goes once everything in
    it was accepted."""
    from .termsafe import neutralise

    picked: list[str] = []
    rest = None
    for c in changes:
        if c.refused or c.conflict or c.type == "dir" and c.kind != "modified":
            continue
        if rest is None:
            sys.stderr.write(c.summary() + "\n")
            if c.diff:
                sys.stderr.write(neutralise(c.diff if len(c.diff) < 4000 else
                                            c.diff[:4000] + "\n[...]\n"))
            sys.stderr.write("apply it? [y]es, [n]o, [a]ll the rest, [q]uit: ")
            sys.stderr.flush()
            answer = sys.stdin.readline().strip().lower()
            if answer in ("a", "all"):
                rest = True
            elif answer in ("q", "quit", ""):
                rest = False
            if answer not in ("y", "yes") and rest is not True:
                if rest is False:
                    break
                continue
        elif rest is False:
            break
        picked.append(c.path)
    for c in changes:   # deleted directories whose whole content was accepted
        inside = [d.path for d in changes if d.kind == "deleted" and d.type != "dir"
                  and d.path.startswith(c.path + "/")]
        if c.kind == "deleted" and c.type == "dir" and inside and all(
                p in picked for p in inside):
            picked.append(c.path)
    return picked


def _print_events(events: list[dict], *, output_limit: bool = True) -> None:
    for e in events:
        if e["kind"] == "audit":   # the record of this run was lost (docs/audit.md)
            sys.stderr.write(f"corral: audit: {e.get('message')}\n")
        elif e["kind"] in ("limit", "teardown", "unenforced") and (
                output_limit or e.get("limit") != "output"):
            what = e.get("limit") or e.get("rule") or e["kind"]
            text = e.get("message") or e.get("reason")
            if e["kind"] == "unenforced":
                from .runtime.notices import due_event, standing

                if standing(e):
                    if not due_event(e):
                        continue
                    text += " (shown once a day; --json reports it on every run)"
            sys.stderr.write(f"corral: {e['kind']} {what}: {text}\n")


def _run_tty(r: RunArgs, policy) -> int:
    """`corral run -t`: the sandbox's own pty, relayed to this process's stdin and stdout
    (corral.linux.tty); this terminal in raw mode from the start of the command to its end."""
    from .linux.tty import raw_mode
    from .runtime.sandbox import Sandbox

    try:
        on_out = None if r.json else _write_fd1
        with _terminate_cleanly():
            with Sandbox(policy) as sb:
                sb.open()   # set-up errors show before the terminal goes raw
                gc_back_on()
                with raw_mode(0):
                    result = sb.exec(r.command, stdin=0, tty=True, on_stdout=on_out)
    except CorralError as e:
        return _fail(e, r.json)
    if r.json:
        sys.stdout.write(result.to_json() + "\n")
    else:   # the terminal showed all the output: no note that the Result kept only part
        _print_events(result.events, output_limit=False)
    return result.cli_exit_status()


def cmd_shell(args: list[str]) -> int:
    """`corral shell`: sb.pty.create on this terminal. (`corral shell ID`, for a live
    sandbox, comes with live sandboxes.)"""
    as_json = False
    try:
        r = parse_run_args(args, want_command=True)
        if r.help:
            _help("SHELL")
            return 0
        if r.command and "--" not in args:
            raise UsageError(f"corral shell {r.command[0]}: attaching to a live sandbox "
                             "by id is not in this build; corral shell alone opens a "
                             "fresh one (a command goes after --)", field="ID")
        if not os.isatty(0):
            raise UsageError("corral shell needs a terminal on stdin; for a pipe use "
                             "corral run -- CMD", field="stdin")
        as_json = r.json
        policy = effective_policy(r)
        os.environ.setdefault("CORRAL_AUDIT_FACE", "cli")   # the audit store's face
        return _shell(policy, r.command or None, r.json)
    except CorralError as e:
        return _fail(e, as_json)


def _shell(policy, cmd, as_json: bool) -> int:
    import _signal
    import select

    from .linux.tty import raw_mode, window_size
    from .runtime.sandbox import Sandbox

    with _terminate_cleanly():
        with Sandbox(policy) as sb:
            sb.open()   # set-up errors show before the terminal goes raw
            rows, cols = window_size(0) or (24, 80)
            with raw_mode(0):
                term = sb.pty.create(cols, rows, cmd, on_data=None if as_json else _write_fd1)

                def resized(signum, frame):
                    size = window_size(0)
                    if size:
                        term.resize(size[1], size[0])
                old = _signal.signal(28, resized)   # SIGWINCH
                try:
                    reading = True
                    while True:
                        try:
                            result = term.wait(0 if reading else None)
                            break
                        except TimeoutError:
                            pass
                        if select.select([0], [], [], 0.1)[0]:
                            try:
                                data = os.read(0, 65536)
                            except OSError:
                                data = b""
                            try:
                                if data:
                                    term.send_input(data)
                            except BrokenPipeError:
                                data = b""
                            reading = bool(data)
                finally:
                    _signal.signal(28, old)
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        _print_events(result.events, output_limit=False)
    return result.cli_exit_status()


def _write_fd1(data: bytes) -> None:
    """The terminal's output, from the relay thread: straight to fd 1 (no buffer lock a
    blocked write could hold at exit)."""
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _writer(stream, raw: bool):
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


def cmd_sandbox(args: list[str]) -> int:
    """`corral sandbox create|ls|exec|kill` (runtime/supervisor.py, runtime/remote.py)."""
    import json

    sub, rest = (args[0], args[1:]) if args else ("", [])
    os.environ.setdefault("CORRAL_AUDIT_FACE", "cli")   # the audit store's face
    as_json = "--json" in (rest[:rest.index("--")] if "--" in rest else rest)
    try:
        if sub in ("-h", "--help", ""):
            _help("SANDBOX")
            return 0 if sub else 2
        if sub == "create":
            timeout, flags = 300.0, []
            it = iter(rest)
            for a in it:
                name, eq, inline = a.partition("=")
                if name in ("--timeout", "--idle-timeout", "--command-timeout"):
                    v = inline if eq else next(it, None)
                    if v is None:
                        raise UsageError(f"{name} needs a value", field=name)
                    if name == "--timeout":
                        try:
                            timeout = float(v)
                        except ValueError:
                            raise UsageError(f"--timeout {v!r} is not seconds", field=name) from None
                    else:
                        key = "idle_timeout" if name == "--idle-timeout" else "timeout"
                        flags += ["--timeout" if key == "timeout" else "--idle", v]
                elif a != "--json":
                    flags.append(a)
            idle = None
            if "--idle" in flags:
                i = flags.index("--idle")
                idle = flags[i + 1]
                del flags[i:i + 2]
            r = parse_run_args(flags, want_command=False)
            for flag, given in (("--stdin", r.stdin), ("--raw", r.raw), ("--tty", r.tty),
                                ("--apply", r.apply), ("--discard", r.discard),
                                ("--patch", r.patch), ("--receipt", r.receipt)):
                if given:      # a run's option, not a policy's: it would be ignored here
                    raise UsageError("not an option of corral sandbox create (it "
                                     "takes run's policy options, --timeout, "
                                     "--idle-timeout, --command-timeout, --json)", field=flag)
            if idle is not None:
                r.overrides.setdefault("limits", {})["idle_timeout"] = idle
            from .runtime.remote import connect
            from .runtime.supervisor import start_detached

            sid = start_detached(effective_policy(r), timeout=timeout)
            info = connect(sid).get_info()
            sys.stdout.write((json.dumps(info.to_dict()) if as_json else sid) + "\n")
            return 0
        if sub == "ls":
            from .runtime.registry import entries

            found = entries()
            if as_json:
                sys.stdout.write(json.dumps(found) + "\n")
            else:
                import time

                for e in found:
                    left = max(0, e["ends"] - time.time())
                    sys.stdout.write(f"{e['id']}  {e['isolation']:9}  pid {e['pid']:<8} "
                                     f"ends in {left:.0f}s\n")
            return 0
        if sub in ("exec", "kill"):
            if not rest or rest[0].startswith("-"):
                raise UsageError(f"corral sandbox {sub} needs an ID", field="ID")
            from .runtime.remote import connect

            if sub == "exec":
                _exec_options_only(rest[1:])    # before connect: a refusal touches nothing
            sb = connect(rest[0])
            if sub == "kill":
                sb.kill()
                return 0
            r = parse_run_args(rest[1:], want_command=True)
            if not r.command:
                raise UsageError("no command given; write corral sandbox exec ID -- CMD...",
                                 field="CMD")
            timeout = r.overrides.get("limits", {}).get("timeout")
            if timeout is not None:
                from .policy.units import parse_duration

                try:
                    timeout = parse_duration(timeout)
                except ValueError as e:    # a traceback before
                    raise UsageError(str(e), field="--timeout") from None
            stdin = sys.stdin.buffer.read() if r.stdin else None
            on_out = on_err = None
            if not r.json:
                on_out, on_err = _writer(sys.stdout, r.raw), _writer(sys.stderr, r.raw)
            result = sb.commands.run(r.command, env=r.env_set or None, stdin=stdin,
                                     timeout=timeout, on_stdout=on_out, on_stderr=on_err)
            for w in (on_out, on_err):
                if hasattr(w, "finish"):
                    w.finish()
            if r.json:
                sys.stdout.write(result.to_json() + "\n")
            else:
                _print_events(result.events)
            return result.cli_exit_status()
        raise UsageError(f"unknown sandbox command {sub!r}; see corral sandbox --help",
                         field="sandbox")
    except CorralError as e:
        return _fail(e, as_json)


#: what `corral sandbox exec` takes besides the command: the sandbox's policy was set when
#: it was created, so a policy option here (--isolation, --memory, --workspace, ...) would
#: be silently ignored; it is refused instead
_EXEC_FLAGS = ("--stdin", "--json", "--raw")
_EXEC_VALUES = ("--timeout", "--env")


def _exec_options_only(args: list[str]) -> None:
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--" or not a.startswith("-") or a == "-":
            return
        name, eq, inline = a.partition("=")
        if name in _EXEC_VALUES:
            v = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            if name == "--env" and "=" not in v:
                raise UsageError("corral sandbox exec takes NAME=VALUE (passing a "
                                 "host variable is a policy option, set at create)",
                                 field="--env")
            i += 1 if eq else 2
            continue
        if name not in _EXEC_FLAGS or eq:
            raise UsageError("not an option of corral sandbox exec (the sandbox's "
                             "policy is set by corral sandbox create); exec takes "
                             "--timeout D, --env NAME=VALUE, --stdin, --json, --raw",
                             field=name)
        i += 1


def cmd_audit(name: str):
    def run(args: list[str]) -> int:   # loaded only here (audit/cli.py): never on run's path
        from .audit.cli import main as audit_main

        return audit_main(name, args)
    return run


def cmd_learn(args: list[str]) -> int:   # audit/cli_learn.py: loaded only here
    from .audit.cli_learn import main as learn_main

    return learn_main(args, parse_run_args, effective_policy)


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
