"""`corral probe`: a catalogue of real attacks run against each tier on this host, scored
against canaries planted outside the sandbox (docs/probe.md).

Loaded only by `corral probe` (never on `corral run`'s path)."""

from __future__ import annotations

import json
import os
import sys

from ..errors import BackendUnavailable, CorralError, UsageError, option_values

USAGE = """\
usage: corral probe [--isolation T]... [--category C]... [--case ID]... [--json]
                    [--image NAME] [--report FILE.md|FILE.html] [--list]

Run corral's attack catalogue against each tier named (default: every tier available
here), scored from what is seen outside the sandbox: canary bytes in any output or sink,
host files changed, processes escaped, the supervisor crashed. Each case has a positive
control that must succeed, and is expected to be contained only where `corral explain`
says the tier enforces what it relies on.

  --isolation T   namespace, gvisor, process (repeatable); wasm when asked for (its
                  cases that need a shell, processes or a terminal are "n/a", with why);
                  microvm when asked for, with --image (it boots an image, never the
                  host's root; its cases that need a terminal are "n/a")
  --image NAME    the image the microvm tier boots for every case (corral image ls)
  --category C    only this category (repeatable); --list shows them
  --case ID       only this case (repeatable; a prefix ending in "." selects a group)
  --json          {"cases": [{"id", "category", "tier", "expected", "contained",
                  "reason", "status", "seconds"}], "summary": {...}}
  --report FILE   write the matrix (cases x tiers) as Markdown (.md) or HTML (.html)
  --list          list the cases and exit

On a terminal, stderr gets a line per case as it finishes ([n/total] tier case status).

Exit status: 0 when every case a tier claims holds; 1 when any does not (not contained,
invalid control, or not scorable); 2 on usage errors; 3 when a tier named is not
available here.
"""

DEFAULT_TIERS = ("namespace", "gvisor", "process")
#: tiers the probe runs only when named (--isolation): wasm runs Python code only
OPTIONAL_TIERS = ("wasm", "microvm")


def _parse(args: list[str]) -> dict:
    opts = {"tiers": [], "categories": [], "cases": [], "json": False, "report": None,
            "list": False, "help": False, "image": None}
    values = ("--isolation", "--category", "--case", "--report", "--image")
    for name, v in option_values(args, values):
        if name == "--image":
            opts["image"] = v
        elif name == "--report":
            if not v.endswith((".md", ".html")):
                raise UsageError(f"--report {v!r}: the file must end in .md or .html",
                                 field="--report")
            opts["report"] = v
        elif name is not None:
            opts[{"--isolation": "tiers", "--category": "categories",
                  "--case": "cases"}[name]].append(v)
        elif v in ("--json", "--list"):
            opts[v[2:]] = True
        elif v in ("-h", "--help"):
            opts["help"] = True
        else:
            raise UsageError(f"unknown argument {v!r}; see corral probe --help", field=v)
    return opts


def available_tiers(tiers=DEFAULT_TIERS) -> tuple[list[str], dict[str, str]]:
    from ..backends import get_backend

    ok, why = [], {}
    for t in tiers:
        try:
            get_backend(t).check(_empty_plan())
            ok.append(t)
        except BackendUnavailable as e:
            why[t] = e.message
    return ok, why


def _empty_plan():
    from ..plan import build_plan
    from ..policy import Policy

    return build_plan(Policy(), dict(os.environ))


def main(args: list[str]) -> int:
    try:
        opts = _parse(args)
    except UsageError as e:
        sys.stderr.write(f"corral: {e}\n")
        return 2
    if opts["help"]:
        sys.stdout.write(USAGE)
        return 0
    from .cases import CATEGORIES, load_cases

    cases = load_cases()
    for c in opts["categories"]:
        if c not in CATEGORIES:
            sys.stderr.write(f"corral: --category: unknown category {c!r}; one of "
                             f"{', '.join(CATEGORIES)}\n")
            return 2
    for t in opts["tiers"]:
        if t not in DEFAULT_TIERS + OPTIONAL_TIERS:
            sys.stderr.write(f"corral: --isolation: unknown tier {t!r}; one of "
                             f"{', '.join(DEFAULT_TIERS + OPTIONAL_TIERS)}\n")
            return 2
    if "microvm" in opts["tiers"] and not opts["image"]:
        sys.stderr.write("corral: --isolation microvm needs --image NAME: the microvm tier "
                         "boots an image, never the host's root (corral image ls)\n")
        return 2
    if opts["categories"]:
        cases = [c for c in cases if c.category in opts["categories"]]
    if opts["cases"]:
        want = opts["cases"]
        cases = [c for c in cases if any(c.id == w or (w.endswith(".") and c.id.startswith(w))
                                         for w in want)]
        if not cases:
            sys.stderr.write(f"corral: --case: no case matches {', '.join(want)}; "
                             f"see corral probe --list\n")
            return 2
    if opts["list"]:
        for c in cases:
            sys.stdout.write(f"{c.id:<30} {c.category:<13} {c.description}\n")
        return 0
    avail, why = available_tiers(DEFAULT_TIERS + tuple(
        t for t in OPTIONAL_TIERS if t in opts["tiers"]))
    tiers = list(dict.fromkeys(opts["tiers"])) or avail
    for t in tiers:
        if t not in avail:
            sys.stderr.write(f"corral: --isolation {t}: not available here: {why.get(t)}\n")
            return BackendUnavailable.exit_code
    if not tiers:
        sys.stderr.write("corral: no tier is available here; see corral doctor\n")
        return BackendUnavailable.exit_code
    try:
        cells = run(cases, tiers, progress=sys.stderr.isatty(), image=opts["image"])
    except CorralError as e:
        sys.stderr.write(f"corral: {e}\n")
        return e.exit_code
    from . import report

    _keep(cells)
    if opts["report"]:
        body = (report.to_html(cells, tiers) if opts["report"].endswith(".html")
                else report.markdown(cells, tiers))
        with open(opts["report"], "w") as f:
            f.write(body)
    if opts["json"]:
        sys.stdout.write(json.dumps({"cases": [c.to_dict() for c in cells],
                                     "summary": report.summary(cells, tiers)}, indent=1) + "\n")
    else:
        sys.stdout.write(report.text(cells, tiers))
    return 1 if any(c.failing for c in cells) else 0


def _keep(cells) -> None:
    """The matrix, merged into the state directory's last probe report (the dashboard's
    Probe page, probe/last.py); a failure to keep it is a warning, never the probe's."""
    from . import last

    try:
        last.save(cells)
    except OSError as e:
        sys.stderr.write(f"corral: warning: could not keep the probe report in the state "
                         f"directory: {e}\n")


def run(cases, tiers, *, progress: bool = False, image: str | None = None):
    """Plant the canaries, run every case on every tier (one tier after the other, one
    case at a time), remove the canaries. Returns the cells. With `progress`, a line per
    case on stderr as it finishes (`corral probe` asks for it when stderr is a terminal)."""
    import signal

    from .canaries import Canaries
    from .runner import Runner

    def _stop(signum, frame):  # SIGTERM/SIGHUP: leave through the finally below
        raise KeyboardInterrupt

    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    cn = Canaries().plant()
    cells = []
    total, width = len(cases) * len(tiers), len(str(len(cases) * len(tiers)))
    idw = max((len(c.id) for c in cases), default=0)
    try:
        runner = Runner(cn, image=image)
        for tier in tiers:
            for case in cases:
                cell = runner.cell(case, tier)
                cells.append(cell)
                if progress:  # one line per case, as it finishes (stderr: stdout is the report)
                    mark = " BROKEN" if cell.failing else ""
                    sys.stderr.write(f"[{len(cells):>{width}}/{total}] {tier:<9} "
                                     f"{case.id:<{idw}}  {cell.status}{mark} "
                                     f"({cell.seconds:.1f} s)\n")
                    sys.stderr.flush()
    finally:
        cn.remove()
        for s, h in old.items():
            signal.signal(s, h)
    return cells
