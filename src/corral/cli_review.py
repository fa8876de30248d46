"""`corral run --workspace PATH:review`: after the command, the changes listed, written as a
patch, applied (--apply, or those accepted at the terminal) or dropped (cli.py runs it;
loaded only in review mode)."""

from __future__ import annotations

import os
import sys

from .cli import RunArgs


def review(sb, r: RunArgs) -> dict:
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
    from .termsafe import review as shown

    picked: list[str] = []
    rest = None
    for c in changes:
        if c.refused or c.conflict or c.type == "dir" and c.kind != "modified":
            continue
        if rest is None:
            sys.stderr.write(c.summary() + "\n")
            if c.diff:
                # bidi controls and zero-width characters shown, not obeyed: a
                # hostile change cannot hide code from the person judging it
                sys.stderr.write(shown(c.diff if len(c.diff) < 4000 else
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
