"""The containment matrix (cases x tiers, a one-line reason per cell): text, Markdown,
HTML."""

from __future__ import annotations

import html

from .cases import CATEGORIES

MARK = {"contained": "contained", "not-contained": "NOT contained", "not-run": "NOT contained (not run)",
        "invalid": "invalid", "unsupported": "n/a", "refused": "refused", "inconclusive": "inconclusive"}


def label(cell) -> str:
    """The cell's headline: what happened, and whether that breaks a claim."""
    head = MARK[cell.status]
    if cell.failing:
        return f"FAIL: {head}"
    if not cell.expected and cell.status in ("not-contained", "not-run"):
        return f"{head} (not claimed)"
    if not cell.expected and cell.status == "contained":
        return "contained (not claimed)"
    return head


def summary(cells, tiers) -> dict:
    out = {}
    for t in tiers:
        mine = [c for c in cells if c.tier == t]
        out[t] = {"cases": len(mine),
                  "claimed": sum(c.expected for c in mine),
                  "claims_held": sum(c.expected and c.status == "contained" for c in mine),
                  "broken": sum(c.failing for c in mine),
                  "contained": sum(c.status == "contained" for c in mine),
                  "not_contained_unclaimed": sum((not c.expected) and c.status in (
                      "not-contained", "not-run") for c in mine),
                  "null": sum(c.contained is None for c in mine)}
    return out


def _grid(cells, tiers):
    by = {}
    order = []
    for c in cells:
        if c.case.id not in by:
            order.append(c.case)
            by[c.case.id] = {}
        by[c.case.id][c.tier] = c
    return order, by


def text(cells, tiers) -> str:
    s = summary(cells, tiers)
    lines = []
    for t in tiers:
        x = s[t]
        lines.append(f"{t}: {x['claims_held']}/{x['claimed']} claimed cases contained, "
                     f"{x['broken']} broken; {x['not_contained_unclaimed']} not contained "
                     f"where the tier does not claim it; {x['null']} could not be scored")
    bad = [c for c in cells if c.failing]
    if bad:
        lines.append("broken claims:")
        lines += [f"  {c.tier:<9} {c.case.id:<28} {label(c)}: {c.reason}" for c in bad]
    info = [c for c in cells if not c.failing and c.status in ("not-contained", "not-run")]
    if info:
        lines.append("not contained, not claimed (informational):")
        lines += [f"  {c.tier:<9} {c.case.id:<28} {c.reason}" for c in info]
    return "\n".join(lines) + "\n"


def markdown(cells, tiers) -> str:
    order, by = _grid(cells, tiers)
    s = summary(cells, tiers)
    out = ["# corral probe: containment matrix", "",
           "Each cell: the outcome, then one line of why. *FAIL* marks a claim of the tier "
           "(from `corral explain`) that did not hold; *(not claimed)* an outcome the tier "
           "never promised.", "", "| tier | claimed | held | broken | not claimed, not contained | null |",
           "|---|---|---|---|---|---|"]
    for t in tiers:
        x = s[t]
        out.append(f"| {t} | {x['claimed']} | {x['claims_held']} | {x['broken']} | "
                   f"{x['not_contained_unclaimed']} | {x['null']} |")
    for cat, title in CATEGORIES.items():
        cases = [c for c in order if c.category == cat]
        if not cases:
            continue
        out += ["", f"## {title} (`{cat}`)", "", "| case | " + " | ".join(tiers) + " |",
                "|---" * (len(tiers) + 1) + "|"]
        for case in cases:
            row = [f"`{case.id}`: {_md(case.description)}"]
            for t in tiers:
                c = by[case.id].get(t)
                row.append("" if c is None else f"**{label(c)}**: {_md(c.reason)}")
            out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_html(cells, tiers) -> str:
    order, by = _grid(cells, tiers)
    s = summary(cells, tiers)
    colour = {"contained": "#d7f5d7", "not-contained": "#ffd6d6", "not-run": "#ffd6d6",
              "invalid": "#ffe9b3", "inconclusive": "#ffe9b3", "unsupported": "#eeeeee",
              "refused": "#eeeeee"}
    e = html.escape
    rows = []
    for cat, title in CATEGORIES.items():
        cases = [c for c in order if c.category == cat]
        if not cases:
            continue
        rows.append(f'<tr><th colspan="{len(tiers) + 1}" class="cat">{e(title)}</th></tr>')
        for case in cases:
            tds = []
            for t in tiers:
                c = by[case.id].get(t)
                if c is None:
                    tds.append("<td></td>")
                    continue
                bg = colour[c.status] if c.expected or c.status != "not-contained" else "#f3e0e0"
                tds.append(f'<td style="background:{bg}"><b>{e(label(c))}</b><br>'
                           f'<small>{e(c.reason)}</small></td>')
            rows.append(f"<tr><td><code>{e(case.id)}</code><br><small>{e(case.description)}"
                        f"</small></td>{''.join(tds)}</tr>")
    summ = "".join(f"<li><b>{e(t)}</b>: {x['claims_held']}/{x['claimed']} claimed cases "
                   f"contained, {x['broken']} broken, {x['not_contained_unclaimed']} not "
                   f"contained where not claimed, {x['null']} null</li>" for t, x in s.items())
    head = "".join(f"<th>{e(t)}</th>" for t in tiers)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>corral probe</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse}}
td,th{{border:1px solid #999;padding:4px;vertical-align:top}} th.cat{{background:#ccd}}</style>
</head><body><h1>corral probe: containment matrix</h1><ul>{summ}</ul>
<table><tr><th>case</th>{head}</tr>{''.join(rows)}</table></body></html>
"""
