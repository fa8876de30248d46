"""`corral sandbox create|ls|exec|kill`: live sandboxes from the command line
(runtime/supervisor.py, runtime/remote.py; cli.py hands the command here)."""

from __future__ import annotations

import os
import sys

from .cli import _fail, _help, _print_events, effective_policy, output_writer, parse_run_args
from .errors import CorralError, UsageError


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
                on_out, on_err = output_writer(sys.stdout, r.raw), output_writer(sys.stderr, r.raw)
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
