"""The commands on this terminal: `corral run -t` and `corral shell` (cli.py hands them
here; loaded only for them)."""

from __future__ import annotations

import os
import sys

from .cli import (
    RunArgs,
    _fail,
    _help,
    _print_events,
    _terminate_cleanly,
    effective_policy,
    gc_back_on,
    parse_run_args,
)
from .errors import CorralError, UsageError


def run_tty(r: RunArgs, policy) -> int:
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
