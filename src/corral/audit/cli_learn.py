"""`corral learn [run's flags] [--out FILE] [--margin X] [--json] -- CMD` (docs/audit.md,
"Learn mode"): run CMD once in learn mode (runtime/learn.py), show what it needed and
write the least-privilege policy that would have let it succeed.

A face: cli.py's `learn` dispatch hands this module its flag parser and policy builder
(nothing imports cli), so learn takes the same policy flags as `corral run`.
"""

from __future__ import annotations

import json
import os
import sys

from ..errors import CorralError, UsageError, option_values

#: run flags that make no sense for a learn run, with why
_REFUSED = {
    "receipt": ("--receipt", "a learn run is a trial: sign the run with the learned policy"),
    "tty": ("-t", "a learn run takes no terminal; run the command without -t"),
    "apply": ("--apply", "a learn run never writes the workspace"),
    "discard": ("--discard", "a learn run never writes the workspace"),
    "patch": ("--patch", "a learn run never writes the workspace"),
}


def split_learn_flags(args: list[str]) -> tuple[list[str], str | None, float]:
    """Take --out FILE and --margin X (before `--`) out of args; the rest are run's."""
    rest: list[str] = []
    out, margin = None, None
    for name, v in option_values(args, ("--out", "--margin"), end="--"):
        if name is None:
            rest.append(v)
        elif name == "--out":
            if not v:
                raise UsageError("--out needs a file name", field="--out")
            out = os.path.abspath(v)
        else:
            try:
                margin = float(v)
            except ValueError:
                margin = -1.0
            if not 1.0 <= margin <= 100:
                raise UsageError(f"--margin {v!r} is not a number from 1 to 100; write "
                                 f"--margin 1.5 for 50% headroom", field="--margin")
    from ..runtime.learn import MARGIN

    return rest, out, MARGIN if margin is None else margin


def main(args: list[str], parse_run_args, effective_policy, output_writer) -> int:
    as_json = "--json" in (args[: args.index("--")] if "--" in args else args)
    try:
        rest, out, margin = split_learn_flags(args)
        r = parse_run_args(rest, want_command=True)
        if r.help:
            from ..cli_help import USAGE

            sys.stdout.write(USAGE["LEARN"])
            return 0
        if not r.command:
            raise UsageError("no command given; write corral learn [options] -- CMD...",
                             field="CMD")
        for attr, (flag, why) in _REFUSED.items():
            if getattr(r, attr):
                raise UsageError(f"{flag} is not for corral learn: {why}", field=flag)
        # the learn run's network is the proxy (learn mode), so its rules load as given
        r.overrides.setdefault("network", {})["mode"] = "allow"
        policy = effective_policy(r)
        os.environ.setdefault("CORRAL_AUDIT_FACE", "cli")
        from ..runtime.sandbox import Sandbox
        from .record import flush, use_spool

        use_spool()   # as corral run: the learn run's record goes to the spool
        on_out = on_err = None
        if not r.json:
            on_out, on_err = output_writer(sys.stdout), output_writer(sys.stderr)
        with _learn_sandbox(Sandbox, policy) as sb:
            result = sb.exec(r.command, stdin=0 if r.stdin else None, on_stdout=on_out,
                             on_stderr=on_err)
            observed = sb.learned()
            text = sb.learned_policy(margin)
        flush()
        if out:
            _write_policy(out, text)
    except CorralError as e:
        sys.stderr.write(f"corral: {e}\n")
        if as_json:
            sys.stdout.write(json.dumps({"error": e.to_dict()}) + "\n")
        return e.exit_code
    if r.json:
        sys.stdout.write(json.dumps({"result": json.loads(result.to_json()),
                                     "observed": observed, "margin": margin,
                                     "policy": text, "out": out}) + "\n")
    else:
        sys.stderr.write(summary(observed, margin, out, text))
        if not out:
            sys.stdout.write(text)
    return result.cli_exit_status()


def summary(obs: dict, margin: float, out: str | None, text: str) -> str:
    """What the learn run needed, for a person (stderr)."""
    from ..termsafe import neutralise

    lines = [f"corral learn: {obs['commands']} command(s) on {obs['isolation']}: "
             f"{', '.join(obs['verdicts'])}"]
    if obs["verdicts"] and any(v != "ok" for v in obs["verdicts"]):
        lines.append("  the command did not succeed: the learned policy may not be enough")
    mem = obs["memory_peak_bytes"]
    lines.append(f"  wall {obs['wall_s']:.2f}s, CPU "
                 f"{'-' if obs['cpu_s'] is None else format(obs['cpu_s'], '.2f') + 's'}, "
                 f"peak memory {'-' if mem is None else f'{mem / (1 << 20):.1f} MiB'}, "
                 f"pids: not measured")
    if obs["hosts"]:
        lines.append(f"  contacted {len(obs['hosts'])} host:port(s):")
        for h in obs["hosts"]:
            lines.append(f"    {neutralise(h['host'])}:{h['port']}  ({h['connections']} "
                         f"connection(s), {h['bytes_in']} bytes in, {h['bytes_out']} out)")
    else:
        lines.append("  no network connection: the policy keeps the network closed")
    for h in obs["refused"]:
        lines.append(f"  refused even in learn mode: {neutralise(h['host'])}:{h['port']} "
                     f"({h['count']}x: {neutralise(h['reason'])})")
    sys_refused = obs.get("syscalls_refused")
    if sys_refused is None:
        lines.append("  refused syscalls: not observed on this tier (docs/audit.md)")
    elif not sys_refused:
        lines.append("  the seccomp profile refused no syscall")
    else:
        lines.append("  syscalls the seccomp profile refused (no policy allows them): "
                     + ", ".join(f"{neutralise(s['name'])} {s['count']}x "
                                 f"{neutralise(s['errno'])}" for s in sys_refused[:20])
                     + (f" and {len(sys_refused) - 20} more" if len(sys_refused) > 20 else ""))
    if obs["workspace_changes"]:
        lines.append(f"  wrote {len(obs['workspace_changes'])} path(s) in the workspace "
                     f"(kept in an overlay, discarded; the host's is untouched)")
    limits = [ln.split(" = ")[0] + " = " + ln.split(" = ")[1] for ln in text.splitlines()
              if ln.split(" = ")[0] in ("memory", "timeout", "cpu_time")]
    lines.append(f"  learned limits (x{margin:g}): {', '.join(limits)}")
    lines.append(f"  policy written to {out}; run with: corral run --policy {out} -- CMD"
                 if out else "  the policy follows on stdout (--out FILE writes it to a file)")
    return "\n".join(lines) + "\n"


def _learn_sandbox(Sandbox, policy):
    """The learn run's sandbox: a live one where the tier keeps one (the namespace tier's
    then reports the syscalls its seccomp profile refused: runtime/live.py), else a
    one-shot Sandbox (the process tier keeps no live sandbox; it reports them one-shot)."""
    from ..errors import BackendUnavailable
    from ..runtime.learn import LEARN_LIMITS

    life = max(float(policy.limits.timeout), LEARN_LIMITS["timeout"]) + 60
    try:
        return Sandbox.create(policy, learn=True, timeout=life)
    except BackendUnavailable as e:
        if "live sandbox" not in str(e):
            raise
    return Sandbox(policy, learn=True)


def _write_policy(path: str, text: str) -> None:
    """Write the policy: never through a symbolic link at the last component."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UsageError(f"cannot write the policy to {path}: {e.strerror}",
                         field="--out") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


__all__ = ["main", "split_learn_flags", "summary"]
