"""The dashboard's pages as HTML bodies, each from data the routes gathered (routes.py).
Every value that came from a sandbox or a request goes through html.esc."""

from __future__ import annotations

import json
from urllib.parse import quote, urlencode

from .html import (
    argv_text,
    chart,
    clip,
    esc,
    pretty,
    seconds,
    select,
    size,
    table,
    until,
    verdict,
    when,
)

ARGV_SHOWN = 150          # characters of an argv in a list
OUTPUT_SHOWN = 64 << 10   # characters of one stream on a run's page
EVENTS_SHOWN = 2000


def run_link(run_id: str, text: str | None = None) -> str:
    return f'<a class="mono" href="/ui/runs/{quote(run_id, safe="")}">{esc(text or run_id)}</a>'


def _usage(u: dict, short: bool = False) -> str:
    if not isinstance(u, dict) or not u:
        return '<span class="dim">–</span>'
    bits = []
    if "wall_s" in u:
        bits.append(f"wall {seconds(u['wall_s'])}")
    if "cpu_s" in u and not short:
        bits.append(f"cpu {seconds(u['cpu_s'])}")
    mem = u.get("memory_peak_bytes", u.get("memory_bytes"))
    if mem is not None:
        bits.append(f"mem {size(mem)}")
    if not bits:
        return '<span class="dim">–</span>'
    return "<br>".join(f'<span class="nowrap">{esc(b)}</span>' for b in bits)


def runs_table(runs: list[dict], *, actor_col: bool) -> str:
    head = ["started", "run", "command", "verdict", "tier", "face", "usage"]
    if actor_col:
        head.append("actor")
    rows = []
    for r in runs:
        code = r.get("exit_code")
        sig = r.get("signal")
        ex = f"exit {esc(code)}" if code is not None else (f"signal {esc(sig)}" if sig else "")
        row = [when(r.get("started")), run_link(r["id"]),
               f'<code class="argv">{esc(clip(argv_text(r.get("argv")), ARGV_SHOWN))}</code>',
               f'{verdict(r.get("verdict"))}<br><span class="dim nowrap">{ex}</span>',
               esc(r.get("tier") or "–"), esc(r.get("face") or "–"),
               _usage(r.get("usage"), short=True)]
        if actor_col:
            row.append(esc(r.get("actor") or "–"))
        rows.append(row)
    return table(head, rows, empty="No runs recorded yet.", cls="runs")


def _policy_lines(policy: dict) -> str:
    """The policy view (common.policy_view: secrets by name and hosts only) as TOML-like
    lines."""
    out = []
    for section, v in policy.items():
        if isinstance(v, dict):
            flat = {k: x for k, x in v.items() if not isinstance(x, dict)}
            out += ["", f"[{section}]"]
            out += [f"{k} = {json.dumps(x)}" for k, x in flat.items()]
            for k, x in v.items():
                if isinstance(x, dict):
                    out += ["", f"[{section}.{k}]"]
                    out += [f"{kk} = {json.dumps(xx)}" for kk, xx in x.items()]
        else:
            out.insert(0, f"{section} = {json.dumps(v)}")
    return "\n".join(out).strip("\n")


def sandboxes_table(views: list[tuple[str, dict]], *, owner_col: bool) -> str:
    head = ["sandbox", "tier", "created", "ends", "cpu", "memory", "commands", "network",
            "policy"]
    if owner_col:
        head.insert(1, "token")
    rows = []
    for owner, v in views:
        u = v.get("usage") or {}
        pol = v.get("policy") or {}
        net = pol.get("network") or {}
        mode = net.get("mode", "none")
        allow = net.get("allow") or []
        netcell = esc(mode) + (f'<br><span class="dim">{esc(clip(", ".join(map(str, allow)), 120))}'
                               "</span>" if allow else "")
        meta = v.get("metadata") or {}
        metacell = ("<br>" + " ".join(f'<span class="badge dim">{esc(k)}={esc(clip(str(x), 40))}'
                                       "</span>" for k, x in list(meta.items())[:6])
                    if meta else "")
        row = [f'<span class="mono">{esc(v.get("id"))}</span>{metacell}',
               esc(v.get("isolation")), when(v.get("created")), until(v.get("ends")),
               seconds(u.get("cpu_s")),
               f'<span class="nowrap">now {size(u.get("memory_bytes"))}</span><br>'
               f'<span class="nowrap">peak {size(u.get("memory_peak_bytes"))}</span>',
               f'{esc(u.get("commands", "–"))}<br><span class="dim">{esc(u.get("running", 0))}'
               " running</span>",
               netcell,
               f'<a href="/ui/sandboxes#sb-{quote(str(v.get("id")), safe="")}">policy</a>']
        if owner_col:
            row.insert(1, esc(owner))
        rows.append(row)
    return table(head, rows, empty="No live sandboxes.")


def sandbox_cards(views: list[tuple[str, dict]], *, owner_col: bool) -> str:
    """The Sandboxes page: one card a sandbox, its facts beside its whole policy."""
    if not views:
        return '<div class="card"><p class="empty">No live sandboxes.</p></div>'
    out = []
    for owner, v in views:
        u = v.get("usage") or {}
        pol = v.get("policy") or {}
        net = pol.get("network") or {}
        meta = v.get("metadata") or {}
        facts = [("tier", esc(v.get("isolation"))), ("created", when(v.get("created"))),
                 ("ends", until(v.get("ends"))), ("cpu", seconds(u.get("cpu_s"))),
                 ("memory", f"{size(u.get('memory_bytes'))} now, "
                            f"{size(u.get('memory_peak_bytes'))} at its peak"),
                 ("commands", f"{esc(u.get('commands', '–'))} run, "
                              f"{esc(u.get('running', 0))} running"),
                 ("network", esc(net.get("mode", "none")) + (
                     ": " + esc(clip(", ".join(map(str, net.get("allow") or [])), 300))
                     if net.get("allow") else "")),
                 ("policy digest", f'<span class="mono">{esc(v.get("policy_digest", "–"))}'
                                   "</span>")]
        if owner_col:
            facts.insert(0, ("token", esc(owner)))
        facts += [(f"metadata {esc(k)}", esc(clip(str(x), 200)))
                  for k, x in list(meta.items())[:16]]
        dl = "".join(f"<dt>{k}</dt><dd>{x}</dd>" for k, x in facts)
        out.append(f'<div class="card" id="sb-{esc(v.get("id"))}"><h2 class="mono">'
                   f'{esc(v.get("id"))}</h2><div class="split"><dl class="facts">{dl}</dl>'
                   f"<pre>{esc(_policy_lines(pol))}</pre></div></div>")
    return "".join(out)


def denials_table(denials: list[dict], *, limit: int | None = None,
                  reason: bool = True) -> str:
    rows = []
    for d in denials[:limit] if limit else denials:
        row = [f'<b>{esc(d.get("count"))}×</b>', esc(d.get("kind")),
               f'<code>{esc(clip(str(d.get("what")), 200))}</code>',
               esc(d.get("runs")), f'<code class="rule">{esc(d.get("rule") or "–")}</code>',
               when(d.get("last"))]
        if reason:
            row.insert(5, f'<span class="dim">{esc(clip(str(d.get("reason") or ""), 160))}'
                          "</span>")
        rows.append(row)
    head = ["refused", "kind", "what", "runs", "rule that would allow it", "last"]
    if reason:
        head.insert(5, "reason")
    return table(head, rows, empty="Nothing was refused.")


def overview(*, sandboxes: str, n_sandboxes: int, by_verdict: dict, n_denials: int,
             series: dict, domains: list[dict], recent: list[dict], probe: dict | None,
             actor_col: bool, audit_on: bool) -> str:
    total = sum(by_verdict.values())
    bad = sum(v for k, v in by_verdict.items() if k in ("killed", "timeout", "oom"))
    verd = " ".join(f"{verdict(k)} {esc(n)}" for k, n in sorted(by_verdict.items())) or \
        '<span class="dim">none</span>'
    if probe:
        broken = sum(c["failing"] for c in probe["cells"])
        ptxt = (f"<b>{len(probe['cells'])}</b><span>probe cells, "
                f"{'<span class=fail>' + str(broken) + ' broken</span>' if broken else '0 broken'}"
                f", {when(probe['date'])}</span>")
    else:
        ptxt = '<b>–</b><span>no probe report yet (corral probe)</span>'
    off = ("" if audit_on else '<div class="alert">The audit store is off '
           "(CORRAL_AUDIT=0): no runs are recorded.</div>")
    ptxt = f'<a class="stat" href="/ui/probe">{ptxt}</a>'
    return f"""{off}<h1>Overview</h1>
<div class="grid">
<a class="stat" href="/ui/sandboxes"><b>{n_sandboxes}</b><span>live sandboxes</span></a>
<a class="stat" href="/ui/runs?since=24h"><b>{total}</b><span>runs in the last 24 h; {bad}
killed, timed out or out of memory</span></a>
<a class="stat" href="/ui/denials"><b>{n_denials}</b><span>denials in the last 24 h</span></a>
{ptxt}
</div>
<div class="card"><h2>Runs by verdict, last 24 h</h2>{verd}</div>
<div class="card"><h2>Denials, last 24 h</h2>{chart(series)}</div>
<div class="card"><h2>Most-refused domains</h2>{denials_table(domains, limit=8, reason=False)}
<p><a href="/ui/denials">All denials</a></p></div>
<div class="card"><h2>Live sandboxes</h2>{sandboxes}</div>
<div class="card"><h2>Recent runs</h2>{runs_table(recent, actor_col=actor_col)}
<p><a href="/ui/runs">All runs</a></p></div>"""


SINCE = [("", "any time"), ("1h", "last hour"), ("24h", "last 24 h"), ("7d", "last 7 days"),
         ("30d", "last 30 days")]


def runs_page(runs: list[dict], *, verdict_: str | None, tier: str | None,
              since: str | None, verdicts, tiers, actor_col: bool) -> str:
    form = ('<form class="filters" method="get" action="/ui/runs">'
            + select("verdict", [("", "any")] + [(v, v) for v in verdicts], verdict_)
            + select("tier", [("", "any")] + [(t, t) for t in tiers], tier)
            + select("since", SINCE, since)
            + '<noscript><button type="submit">Filter</button></noscript></form>')
    return (f"<h1>Runs</h1><div class=card>{form}"
            f"<p class=dim>{len(runs)} run(s), newest first.</p>"
            f"{runs_table(runs, actor_col=actor_col)}</div>")


CHART_SINCE = [("1h", "last hour"), ("24h", "last 24 h"), ("7d", "last 7 days"),
               ("30d", "last 30 days")]


def denials_page(series: dict, denials: list[dict], *, since: str, kind: str | None) -> str:
    form = ('<form class="filters" method="get" action="/ui/denials">'
            + select("since", CHART_SINCE, since)
            + select("kind", [("", "any"), ("net", "net"), ("secret", "secret"),
                              ("limit", "limit"), ("refused", "refused runs")], kind)
            + '<noscript><button type="submit">Filter</button></noscript></form>')
    net = [d for d in denials if d.get("kind") == "net"]
    rest = [d for d in denials if d.get("kind") != "net"]
    return (f"<h1>Denials</h1><div class=card>{form}{chart(series)}</div>"
            f"<div class=card><h2>Most-refused domains</h2>"
            f"<p class=dim>Grouped by what was refused, most frequent first, with the policy "
            f"change that would have allowed it. Read it before you take it: a denial is often "
            f"the sandbox doing what it should not.</p>{denials_table(net)}</div>"
            f"<div class=card><h2>Other refusals (secrets, limits, runs refused before they "
            f"started)</h2>"
            f"{denials_table(rest)}</div>")


def probe_page(probe: dict | None) -> str:
    if not probe or not probe["cells"]:
        return ("<h1>Probe matrix</h1><div class=card><p class=empty>No probe report is "
                "stored for this host yet. Run <code>corral probe</code> on it (as the user "
                "the service runs as, with the same state directory) and reload: each run "
                "merges its cells into the matrix shown here.</p></div>")
    cells = probe["cells"]
    tiers = list(dict.fromkeys(c["tier"] for c in cells))
    cases: dict[str, dict] = {}
    for c in cells:
        cases.setdefault(c["id"], {"category": c["category"],
                                   "description": c["description"], "tiers": {}})
        cases[c["id"]]["tiers"][c["tier"]] = c
    summ = []
    for t in tiers:
        mine = [c for c in cells if c["tier"] == t]
        held = sum(c["expected"] and c["status"] == "contained" for c in mine)
        claimed = sum(c["expected"] for c in mine)
        broken = sum(c["failing"] for c in mine)
        summ.append(f"<div class=stat><b>{held}/{claimed}</b><span>{esc(t)}: claimed cases "
                    f"contained; {'<span class=fail>' if broken else ''}{broken} broken"
                    f"{'</span>' if broken else ''}; {len(mine)} cases</span></div>")
    rows = []
    for cat in sorted({c["category"] for c in cases.values()}):
        rows.append(f'<tr class="cat"><th colspan="{len(tiers) + 1}">{esc(cat)}</th></tr>')
        for cid, case in sorted(cases.items()):
            if case["category"] != cat:
                continue
            tds = []
            for t in tiers:
                c = case["tiers"].get(t)
                if c is None:
                    tds.append('<td class="cell dim">not run</td>')
                    continue
                st = c["status"]
                cls = "s-unclaimed" if st == "not-contained" and not c["expected"] else f"s-{st}"
                tds.append(f'<td class="cell {esc(cls)}"><b>{esc(c["label"])}</b>'
                           f'{esc(clip(c["reason"], 220))}</td>')
            rows.append(f"<tr><td><code>{esc(cid)}</code><br><span class=dim>"
                        f"{esc(case['description'])}</span></td>{''.join(tds)}</tr>")
    head = "".join(f"<th>{esc(t)}</th>" for t in tiers)
    return (f"<h1>Probe matrix</h1><p class=dim>Host <b>{esc(probe['host'])}</b>, corral "
            f"{esc(probe['corral_version'])}; last probe {when(probe['date'])}. Each cell: "
            f"the outcome of a real attack on that tier, and why (docs/probe.md). "
            f"<b>FAIL</b> marks a claim of the tier that did not hold.</p>"
            f"<div class=grid>{''.join(summ)}</div>"
            f'<div class="card scroll"><table><thead><tr><th>case</th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _event_row(e: dict) -> list[str]:
    kind = e.get("kind")
    rest = {k: v for k, v in e.items() if k != "kind"}
    summary = ""
    if kind == "net":
        summary = f"{e.get('decision')} {e.get('host')}:{e.get('port')}"
    elif kind == "limit":
        summary = f"{e.get('limit')}"
    elif kind == "secret":
        summary = f"{e.get('decision')} {e.get('name')} @ {e.get('host')}"
    elif "message" in e:
        summary = str(e.get("message"))
    return [f'<span class="badge dim">{esc(kind)}</span>', esc(clip(summary, 300)),
            f"<details><summary>fields</summary><pre>{pretty(rest)}</pre></details>"]


def run_page(run: dict, policy: str | None, events: list[dict], receipt: dict | None,
             verified: tuple[str, str] | None, output: dict | None) -> str:
    facts = [("verdict", verdict(run.get("verdict"))),
             ("exit code", esc(run.get("exit_code") if run.get("exit_code") is not None
                               else "–")),
             ("signal", esc(run.get("signal") or "–")),
             ("kind", esc(run.get("kind"))),
             ("sandbox", f'<span class="mono">{esc(run.get("sandbox") or "–")}</span>'),
             ("started", when(run.get("started"))), ("ended", when(run.get("ended"))),
             ("tier", esc(run.get("tier") or "–")),
             ("image", f'{esc(run.get("image") or "–")} <span class="mono dim">'
                       f'{esc(run.get("image_digest") or "")}</span>'),
             ("policy digest", f'<span class="mono">{esc(run.get("policy_digest") or "–")}'
                               "</span>"),
             ("usage", _usage(run.get("usage"))), ("actor", esc(run.get("actor") or "–")),
             ("face", esc(run.get("face") or "–"))]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    out = ""
    if output is not None:
        streams = "".join(
            f"<h2>{name}</h2><pre>{esc(clip(text, OUTPUT_SHOWN))}</pre>" if text else
            f'<h2>{name}</h2><p class="dim">(empty)</p>'
            for name, text in (("stdout", output["stdout"]), ("stderr", output["stderr"])))
        out = (f'<div class="card">{streams}<p class="dim">The output as the service still '
               f"holds it (its sandbox is live); the audit store keeps only its hashes, in "
               f"the receipt.</p></div>")
    evs = table(["kind", "what", ""], [_event_row(e) for e in events[:EVENTS_SHOWN]],
                empty="No events.")
    more = (f'<p class="dim">{len(events) - EVENTS_SHOWN} more events: corral logs '
            f"{esc(run['id'])}</p>" if len(events) > EVENTS_SHOWN else "")
    if receipt is None:
        rec = '<p class="dim">No receipt stored for this run (service runs have one; ' \
              "<code>corral run --receipt FILE</code> writes one to a file).</p>"
    else:
        ok, msg = verified or ("fail", "not checked")
        rec = (f'<p class="{"good" if ok == "good" else "fail"}">{esc(msg)}</p>'
               f"<details><summary>the receipt (JSON)</summary><pre>{pretty(receipt)}</pre>"
               f'</details><p class="dim">Check it anywhere: <code>corral verify '
               f"RECEIPT --key KEY --stdout FILE</code> (docs/audit.md).</p>")
    pol = (f"<pre>{esc(_strip_sources(policy))}</pre>" if policy else
           '<p class="dim">–</p>')
    return (f'<h1>Run <span class="mono">{esc(run["id"])}</span></h1>'
            f'<div class="card"><h2>Command</h2><pre>{esc(argv_text(run.get("argv")))}</pre>'
            f'<dl class="facts">{dl}</dl></div>{out}'
            f'<div class="card"><h2>Events ({len(events)})</h2>{evs}{more}</div>'
            f'<div class="card"><h2>Receipt</h2>{rec}</div>'
            f'<div class="card"><h2>Policy</h2>{pol}</div>')


def _strip_sources(toml: str) -> str:
    """A stored policy's TOML without its secrets' sources (`from = ...`): the dashboard
    shows a secret by name and hosts only, as the API does."""
    out, in_secret = [], False
    for line in toml.splitlines():
        s = line.strip()
        if s.startswith("["):
            in_secret = s.startswith("[secrets.")
        if in_secret and (s.startswith("from") or s.startswith("# from")):
            continue
        out.append(line)
    return "\n".join(out)


def login_page(*, next_: str, error: str | None) -> str:
    alert = f'<div class="alert">{esc(error)}</div>' if error else ""
    return f"""<div class="login card"><h1>Log in to corral</h1>{alert}
<form method="post" action="/ui/login?{esc(urlencode({"next": next_}))}">
<label for="token">Token (<code>corral token create</code> printed it)</label>
<input id="token" name="token" type="password" autocomplete="off" autofocus
 required placeholder="corral_…">
<button class="primary" type="submit">Log in</button></form>
<p class="dim">The token is sent once; this browser then holds only a session cookie
(HttpOnly, SameSite=Strict) that ends on log out, after 12 h, after 2 h unused, when the
service restarts, or when the token is revoked.</p></div>"""


def error_page(status: int, message: str) -> str:
    return f'<div class="card"><h1>{status}</h1><p>{esc(message)}</p>' \
           '<p><a href="/">Back to the overview</a></p></div>'
