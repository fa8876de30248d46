"""`corral batch JOBS.jsonl --out RESULTS.jsonl [--policy FILE] [--ray ADDRESS]
[--concurrency N]` (cli_help.BATCH_USAGE; docs/scale.md). cli.py only dispatches here."""

from __future__ import annotations

import sys

from ..errors import CorralError, UsageError, option_values


def parse(args: list[str]) -> dict:
    opts: dict = {"jobs": None, "out": None, "policy": None, "ray": None,
                  "concurrency": None}
    flags = {"--out": "out", "--policy": "policy", "--ray": "ray",
             "--concurrency": "concurrency"}
    for name, a in option_values(args, flags):
        if name is not None:
            opts[flags[name]] = a
        elif a.startswith("-") and a != "-":
            raise UsageError(f"unknown option {a!r}; see corral batch --help", field=a)
        elif opts["jobs"] is None:
            opts["jobs"] = a
        else:
            raise UsageError(f"one JOBS file only, not also {a!r}", field="JOBS")
    if opts["jobs"] is None:
        raise UsageError("give the jobs file: corral batch JOBS.jsonl --out RESULTS.jsonl",
                         field="JOBS")
    if opts["out"] is None:
        raise UsageError("give the output file: --out RESULTS.jsonl", field="--out")
    if opts["concurrency"] is not None:
        try:
            opts["concurrency"] = int(opts["concurrency"])
        except ValueError:
            raise UsageError(f"{opts['concurrency']!r} is not a whole number",
                             field="--concurrency") from None
    return opts


def main(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):
        from ..cli_help import USAGE

        sys.stdout.write(USAGE["BATCH"])
        return 0
    from .driver import check_concurrency, run_batch
    from .jobs import base_policy, read_jobs
    from .output import Output, Progress, done_ids

    try:
        opts = parse(args)
        check_concurrency(opts["concurrency"])
        base = base_policy(opts["policy"])
        jobs = read_jobs(opts["jobs"])
        done = done_ids(opts["out"])
        out = Output(opts["out"])
    except CorralError as e:
        sys.stderr.write(f"corral: {e}\n")
        return e.exit_code
    skipped = sum(j.key() in done for j in jobs)
    if skipped and sys.stderr.isatty():
        sys.stderr.write(f"corral batch: {skipped} of {len(jobs)} jobs already in "
                         f"{opts['out']}: skipped\n")
    progress = Progress(len(jobs) - skipped)
    errors = 0
    try:
        for line in run_batch(jobs, base, ray_address=opts["ray"],
                              concurrency=opts["concurrency"], skip=done):
            out.write(line)
            progress.add(line)
            errors += "verdict" not in line
    except CorralError as e:
        progress.finish()
        sys.stderr.write(f"corral: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        progress.finish()
        sys.stderr.write(f"corral: interrupted; {progress.done} results are in "
                         f"{opts['out']}: run the same command again to resume\n")
        return 130
    finally:
        out.close()
        from ..audit.record import flush

        flush()
    progress.finish()
    if errors:
        sys.stderr.write(f"corral batch: {errors} job(s) not run; their lines in "
                         f"{opts['out']} have \"error\"\n")
    return 1 if errors else 0


__all__ = ["main", "parse"]
