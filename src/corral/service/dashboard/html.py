"""The dashboard's HTML: escaping, the page frame (its CSS and JavaScript inline, allowed by
a per-response nonce), small widgets and the denials chart as inline SVG.

Everything shown that came from a sandbox or a request (argv, output, file names, domains,
event fields, metadata) goes through `esc`: HTML-escaped, with the characters that reorder
or hide text (bidi controls, zero-width, other control characters) shown as visible \\u
escapes. Nothing here fetches anything from another origin.
"""

from __future__ import annotations

import html
import json
import re
import time

#: control characters, bidi overrides and isolates, zero-width characters: shown escaped
_HIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e"
                     "\u2060-\u2069\ufeff]")


def esc(v) -> str:
    """Text for HTML (element content or a quoted attribute)."""
    s = v if isinstance(v, str) else str(v)
    s = _HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", s)
    return html.escape(s, quote=True)


def clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n] + f"… ({len(s) - n} more characters)"


_BARE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def _quote(a: str) -> str:
    r"""One argument as a POSIX shell reads it back: bare, in '...', or in "..." with
    \, ", $ and ` escaped (an argument that holds a single quote)."""
    if _BARE.fullmatch(a):
        return a
    if "'" not in a:
        return f"'{a}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", a) + '"'


def argv_text(argv) -> str:
    """An argv as one line, each argument quoted the way a shell would need it."""
    if not isinstance(argv, list):
        return str(argv)
    return " ".join(_quote(str(a)) for a in argv)


def when(t) -> str:
    """A time as <time>: UTC in the page, local time once the script has run."""
    if not isinstance(t, (int, float)):
        return '<span class="dim">–</span>'
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    shown = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    return f'<time datetime="{iso}" data-ts="{t:.3f}">{shown}</time>'


def until(t) -> str:
    """A time to come as "in 5 min" (as of the page), the exact time in its title."""
    if not isinstance(t, (int, float)):
        return '<span class="dim">–</span>'
    left = t - time.time()
    text = "now" if left <= 0 else (f"in {left:.0f} s" if left < 120 else
                                    f"in {left / 60:.0f} min" if left < 7200 else
                                    f"in {left / 3600:.1f} h")
    shown = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    return f'<span class="nowrap" title="{shown}">{text}</span>'


def seconds(v) -> str:
    if not isinstance(v, (int, float)):
        return "–"
    if v < 1:
        return f"{v * 1000:.0f} ms"
    if v < 120:
        return f"{v:.2f} s"
    return f"{v / 60:.1f} min"


def size(v) -> str:
    if not isinstance(v, (int, float)):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return "–"


VERDICT_CLASS = {"ok": "ok", "error": "warn", "killed": "bad", "timeout": "bad",
                 "oom": "bad", "refused": "warn"}


def verdict(v) -> str:
    cls = VERDICT_CLASS.get(v, "dim")
    return f'<span class="badge {cls}">{esc(v if v is not None else "running")}</span>'


def pretty(v) -> str:
    return esc(json.dumps(v, indent=1, sort_keys=True, ensure_ascii=False, default=str))


def table(head: list[str], rows: list[list[str]], *, empty: str, cls: str = "") -> str:
    """A table of cells already made HTML (each a string)."""
    if not rows:
        return f'<p class="empty">{empty}</p>'
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{th}</tr></thead>' \
           f"<tbody>{body}</tbody></table></div>"


def select(name: str, options: list[tuple[str, str]], chosen: str | None) -> str:
    opts = "".join(f'<option value="{esc(v)}"{" selected" if v == (chosen or "") else ""}>'
                   f"{esc(label)}</option>" for v, label in options)
    return f'<label>{esc(name)} <select name="{esc(name)}" class="auto">{opts}</select></label>'


KIND_COLOUR = {"net": "#d9534f", "secret": "#8e44ad", "limit": "#e69500", "fs": "#2e86c1",
               "syscall": "#16a085", "refused": "#7f8c8d"}


def chart(series: dict, *, width: int = 960, height: int = 170) -> str:
    """Stacked bars of denials per time bucket, one colour a kind, as inline SVG (no
    style attributes: the page's CSP allows none)."""
    kinds = sorted(series["kinds"])
    n = series["buckets"]
    totals = [sum(series["kinds"][k][i] for k in kinds) for i in range(n)] if kinds else [0]
    top = max(totals + [1])
    left, bottom, right, topm = 36, 28, 8, 10
    w, h = width - left - right, height - bottom - topm
    bw = w / max(n, 1)
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="denials over time" xmlns="http://www.w3.org/2000/svg">']
    ticks = sorted({0, top, top // 2} if top >= 4 else {0, top})
    for tick in ticks:
        y = topm + h - h * tick / top
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#d0d4da" stroke-width="1"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
                     f'font-size="11" fill="#5b6470">{tick}</text>')
    for i in range(n):
        y = topm + h
        for k in kinds:
            c = series["kinds"][k][i]
            if not c:
                continue
            bh = h * c / top
            y -= bh
            t0 = series["start"] + i * series["step"]
            tip = esc(f"{c} {k} denial(s) from "
                      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}")
            parts.append(f'<rect x="{left + i * bw + 1:.1f}" y="{y:.1f}" '
                         f'width="{max(bw - 2, 1):.1f}" height="{bh:.1f}" '
                         f'fill="{KIND_COLOUR.get(k, "#7f8c8d")}"><title>{tip}</title></rect>')
    for frac, anchor in ((0, "start"), (0.5, "middle"), (1, "end")):
        t = series["start"] + frac * series["step"] * n
        x = left + w * frac
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" text-anchor="{anchor}" '
                     f'font-size="11" fill="#5b6470">'
                     f'{time.strftime("%m-%d %H:%M", time.gmtime(t))} UTC</text>')
    if not kinds:
        parts.append(f'<text x="{left + w / 2:.1f}" y="{topm + h / 2:.1f}" '
                     'text-anchor="middle" font-size="13" fill="#5b6470">no denials in '
                     'this period</text>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key key-{esc(k)}"></span>{esc(k)} '
                     f'({sum(series["kinds"][k])}) ' for k in kinds)
    return "".join(parts) + (f'<div class="legend">{legend}</div>' if kinds else "")


CSS = """
:root{--fg:#1d2430;--dim:#5b6470;--line:#dde1e6;--bg:#f5f6f8;--card:#fff;--acc:#24476b}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg)}
header{background:var(--acc);color:#fff;display:flex;align-items:center;gap:18px;
padding:0 20px;height:48px}
header .brand{font-weight:700;font-size:16px;letter-spacing:.5px;color:#fff;
text-decoration:none}
header nav a{color:#d8e4f0;text-decoration:none;padding:14px 8px;display:inline-block}
header nav a.on,header nav a:hover{color:#fff;box-shadow:inset 0 -3px #8fc1ef}
header .who{margin-left:auto;font-size:13px;color:#d8e4f0;display:flex;gap:10px;
align-items:center}
header .who button{background:transparent;border:1px solid #8fa9c4;color:#fff;
border-radius:4px;padding:3px 9px;cursor:pointer}
main{max-width:1240px;margin:0 auto;padding:18px 20px 40px}
h1{font-size:20px;margin:4px 0 14px}
h2{font-size:15px;margin:0 0 10px}
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;
padding:14px 16px;margin-bottom:16px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(200px,1fr));gap:16px;
margin-bottom:16px}
.stat{background:var(--card);border:1px solid var(--line);border-radius:6px;
padding:12px 16px}
a.stat{color:inherit;text-decoration:none}a.stat:hover{border-color:#8fa9c4}
.stat b{display:block;font-size:26px;font-weight:600}
.stat span{color:var(--dim);font-size:13px}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);
vertical-align:top}
th{font-size:12px;text-transform:uppercase;letter-spacing:.4px;color:var(--dim);
font-weight:600}
tbody tr:hover{background:#f0f4f9}
code,pre,.mono{font:12.5px/1.4 ui-monospace,"DejaVu Sans Mono",Menlo,monospace}
pre{background:#f3f5f7;border:1px solid var(--line);border-radius:4px;padding:8px 10px;
overflow:auto;max-height:420px;margin:6px 0;white-space:pre-wrap;word-break:break-all}
code.argv{display:block;max-width:300px;word-break:break-all}
time,.nowrap,a.mono,code.rule{white-space:nowrap}
a{color:#1f5f99}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;
font-weight:600;background:#e8eaed;color:#3c4450}
.badge.ok{background:#dcf3e1;color:#17612b}.badge.warn{background:#fdebd0;color:#8a4b08}
.badge.bad{background:#fadbd8;color:#922b21}.badge.dim{background:#eceff1;color:#5b6470}
.dim,.empty{color:var(--dim)}
form.filters{display:flex;gap:14px;flex-wrap:wrap;align-items:center;margin-bottom:12px}
select,input[type=password]{font:inherit;padding:4px 6px;border:1px solid #b9c0c8;
border-radius:4px;background:#fff}
button.primary{background:var(--acc);color:#fff;border:0;border-radius:4px;
padding:7px 16px;font:inherit;cursor:pointer}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0}
dl.facts dt{color:var(--dim)}dl.facts dd{margin:0;word-break:break-all}
.split{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:18px}
.split pre{margin:0;max-height:300px}
svg.chart{width:100%;height:auto;display:block}
.legend{font-size:12px;color:var(--dim);margin-top:4px}
.key{display:inline-block;width:10px;height:10px;border-radius:2px;margin:0 4px 0 10px}
.key-net{background:#d9534f}.key-secret{background:#8e44ad}.key-limit{background:#e69500}
.key-fs{background:#2e86c1}.key-syscall{background:#16a085}
.key-refused{background:#7f8c8d}
td.cell{font-size:12px;min-width:150px}
td.cell b{display:block;font-size:12.5px}
.s-contained{background:#e3f6e6}.s-not-contained,.s-not-run{background:#fde2e0}
.s-unclaimed{background:#f6ecec}.s-invalid,.s-inconclusive{background:#fff1cc}
.s-unsupported,.s-refused{background:#f0f1f3}
tr.cat th{background:#eef1f5;color:var(--fg);text-transform:none;font-size:13px}
.login{max-width:420px;margin:70px auto}
.login input{width:100%;margin:8px 0 12px}
.alert{background:#fadbd8;color:#922b21;border-radius:4px;padding:8px 10px;
margin-bottom:10px}
.good{color:#17612b;font-weight:600}.fail{color:#922b21;font-weight:600}
details summary{cursor:pointer;color:#1f5f99}
"""

JS = """
document.querySelectorAll('time[data-ts]').forEach(function(t){
  var d=new Date(parseFloat(t.dataset.ts)*1000), p=function(n){return String(n).padStart(2,'0');};
  t.title=t.textContent+' (shown here in local time)';
  t.textContent=d.getFullYear()+'-'+p(d.getMonth()+1)+'-'+p(d.getDate())+' '+
    p(d.getHours())+':'+p(d.getMinutes())+':'+p(d.getSeconds());
});
document.querySelectorAll('select.auto').forEach(function(s){
  s.addEventListener('change',function(){ s.form.submit(); });
});
"""

NAV = [("/", "Overview"), ("/ui/sandboxes", "Sandboxes"), ("/ui/runs", "Runs"),
       ("/ui/denials", "Denials"), ("/ui/probe", "Probe")]


def frame(title: str, body: str, *, nonce: str, viewer=None, here: str = "") -> str:
    """A whole page: the header (navigation, who is signed in, log out), then body."""
    nav = who = ""
    if viewer is not None:
        nav = "<nav>" + "".join(
            f'<a href="{href}"{" class=on" if href == here else ""}>{label}</a>'
            for href, label in NAV) + "</nav>"
        role = " (admin: every token)" if viewer.admin else ""
        who = (f'<div class="who"><span>token <b>{esc(viewer.name)}</b>{role}</span>'
               '<form method="post" action="/ui/logout"><button type="submit">Log out'
               "</button></form></div>")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<meta name="referrer" content="same-origin">'
            f'<link rel="icon" href="data:,"><title>{esc(title)} · corral</title>'
            f'<style nonce="{nonce}">{CSS}</style></head><body>'
            f'<header><a class="brand" href="/">corral</a>{nav}{who}</header>'
            f"<main>{body}</main>"
            f'<script nonce="{nonce}">{JS}</script></body></html>')
