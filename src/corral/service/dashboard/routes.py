"""The dashboard's routes (docs/dashboard.md): server-rendered pages at / and under /ui/,
behind a login (session.py). None is in the OpenAPI document: they are for browsers.

    GET  /                    overview: live sandboxes, runs by verdict, denials chart,
                              most-refused domains, recent runs, the probe's summary
    GET  /ui/sandboxes        live sandboxes with their policy and usage
    GET  /ui/runs             recent runs (?verdict= &tier= &since=)
    GET  /ui/runs/{id}        one run: command, output while its sandbox holds it,
                              events, receipt and whether it verifies, policy
    GET  /ui/denials          denials over time (?since= &kind=) and grouped
    GET  /ui/probe            this host's last probe matrix
    GET  /ui/login            the login form; POST it (same-origin only)
    POST /ui/logout           same-origin only

Without a session a page is a 303 to the login. A token sees its own sandboxes and runs;
an admin token (corral token create --admin) sees every token's.
"""

from __future__ import annotations

import os
import secrets
import threading
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from . import pages
from .html import frame
from .session import (
    Sessions,
    Viewer,
    clear_cookie,
    safe_next,
    same_origin,
    session_id,
    set_cookie,
)

router = APIRouter(include_in_schema=False)
LOGIN_BODY_MAX = 8 << 10
RUNS_SHOWN = 200
#: what query.denials groups: network, secrets, limits, runs refused before they started
KINDS = ("net", "secret", "limit", "refused")


_MADE = threading.Lock()


def _sessions(request: Request) -> Sessions:
    """The app's sessions (made on first use, once: two first requests share one)."""
    st = request.app.state
    s = getattr(st, "dashboard_sessions", None)
    if s is None:
        with _MADE:
            s = getattr(st, "dashboard_sessions", None)
            if s is None:
                s = st.dashboard_sessions = Sessions()
    return s


def _headers(nonce: str) -> dict:
    return {"Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                "img-src data:; form-action 'self'; frame-ancestors 'none'; "
                "base-uri 'none'"),
            "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
            "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
            "Cross-Origin-Opener-Policy": "same-origin",
            "Cross-Origin-Resource-Policy": "same-origin"}


def _page(title: str, body_of, *, viewer=None, here: str = "", status: int = 200):
    nonce = secrets.token_urlsafe(16)
    body = body_of if isinstance(body_of, str) else body_of()
    return HTMLResponse(frame(title, body, nonce=nonce, viewer=viewer, here=here),
                        status_code=status, headers=_headers(nonce))


def _viewer(request: Request) -> Viewer | None:
    t = _sessions(request).lookup(session_id(request), request.app.state.service.tokens)
    return Viewer(t) if t is not None else None


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/login?next={quote(safe_next(target), safe='')}",
                            status_code=303, headers={"Cache-Control": "no-store"})


def _state_dir(request: Request) -> str:
    return os.path.dirname(request.app.state.service.tokens.dir)


def _live(request: Request, v: Viewer) -> list[tuple[str, dict]]:
    from ..common import view

    reg = request.app.state.service.registry
    entries = [e for e in reg.all() if v.sees(e.owner)
               and getattr(e.sandbox, "state", "running") != "ended"]
    out = []
    for e in sorted(entries, key=lambda e: -e.created):
        try:
            out.append((e.owner_name, view(e)))
        except Exception:    # noqa: BLE001 - it ended as we looked
            continue
    return out


def _age(text: str | None, field: str) -> float | None:
    from ...audit import query
    from ...errors import UsageError

    if not text:
        return None
    try:
        return query.parse_age(text, field)
    except UsageError as e:
        raise _Bad(str(e)) from None


class _Bad(Exception):
    pass


def _bad(v: Viewer, e: _Bad):
    return _page("bad request", pages.error_page(400, str(e)), viewer=v, status=400)


@router.get("/")
def overview(request: Request):
    v = _viewer(request)
    if v is None:
        return _to_login(request)
    from ...audit import query, record, series
    from ...probe import last

    live = _live(request, v)
    by = series.verdicts(since=86400, actor=v.actor)
    s = series.denials_over_time(since=86400, buckets=24, actor=v.actor)
    body = pages.overview(
        sandboxes=pages.sandboxes_table(live[:10], owner_col=v.admin),
        n_sandboxes=len(live), by_verdict=by,
        n_denials=sum(sum(x) for x in s["kinds"].values()), series=s,
        domains=query.denials(kind="net", actor=v.actor),
        recent=query.runs(actor=v.actor, limit=10),
        probe=last.load(_state_dir(request)), actor_col=v.admin, audit_on=record.enabled())
    return _page("Overview", body, viewer=v, here="/")


@router.get("/ui/sandboxes")
def sandboxes(request: Request):
    v = _viewer(request)
    if v is None:
        return _to_login(request)
    live = _live(request, v)
    body = (f"<h1>Live sandboxes</h1><p class=dim>{len(live)} live in this service, "
            f"newest first; usage as of this page (reload to refresh).</p>"
            f"{pages.sandbox_cards(live, owner_col=v.admin)}")
    return _page("Sandboxes", body, viewer=v, here="/ui/sandboxes")


@router.get("/ui/runs")
def runs(request: Request, verdict: str | None = None, tier: str | None = None,
         since: str | None = None):
    v = _viewer(request)
    if v is None:
        return _to_login(request)
    from ...audit import query
    from ...policy.schema import TIERS
    from ...result import VERDICTS

    verdict, tier, since = verdict or None, tier or None, since or None
    verdicts = (*VERDICTS, "refused")      # a run corral refused before it started
    try:
        if verdict is not None and verdict not in verdicts:
            raise _Bad(f"verdict {verdict!r} is not one of {', '.join(verdicts)}")
        tiers = [t for t in TIERS if t != "auto"]
        if tier is not None and tier not in tiers:
            raise _Bad(f"tier {tier!r} is not one of {', '.join(tiers)}")
        age = _age(since, "since")
    except _Bad as e:
        return _bad(v, e)
    got = query.runs(since=age, verdict=verdict, tier=tier, actor=v.actor, limit=RUNS_SHOWN)
    body = pages.runs_page(got, verdict_=verdict, tier=tier, since=since, verdicts=verdicts,
                           tiers=tiers, actor_col=v.admin)
    return _page("Runs", body, viewer=v, here="/ui/runs")


@router.get("/ui/runs/{run_id}")
def run(request: Request, run_id: str):
    v = _viewer(request)
    if v is None:
        return _to_login(request)
    from ...audit import query

    got = query.get_run(run_id, actor=v.actor) if len(run_id) <= 64 else None
    if got is None:
        return _page("not found", pages.error_page(404, f"no run {run_id!r}"), viewer=v,
                     status=404)
    r, policy, receipt = got
    events = query.events(run_id, actor=v.actor) or []
    output = _output(request, r)
    verified = _verify(receipt, output) if receipt is not None else None
    return _page(f"run {run_id}", pages.run_page(r, policy, events, receipt, verified,
                                                 output), viewer=v, here="/ui/runs")


def _output(request: Request, r: dict) -> dict | None:
    """The command's output while the service still holds its sandbox and command."""
    sid = r.get("sandbox")
    if not sid:
        return None
    for e in request.app.state.service.registry.all():
        if e.id != sid:
            continue
        c = e.commands.by_run(r["id"])
        if c is None or c.result is None:
            return None
        return {"stdout": c.result.stdout, "stderr": c.result.stderr}
    return None


def _verify(receipt: dict, output: dict | None) -> tuple[str, str]:
    """Whether the stored receipt verifies with this host's key (and matches the output,
    when the service still holds it): ("good" | "fail", what was checked)."""
    from ...audit import receipt as rc
    from ...audit.record import db_path

    try:
        trusted = rc.parse_key(rc.public_key_text(os.path.dirname(db_path())))
        files = {}
        if output is not None:
            files = {k: output[k].encode("utf-8", "surrogateescape")
                     for k in ("stdout", "stderr")}
        rc.verify(rc.load(_dumps(receipt)), trusted, files)
    except rc.VerifyError as e:
        return "fail", f"does not verify: {e}"
    except Exception as e:     # noqa: BLE001 - shown, never a 500
        return "fail", f"could not be checked: {e}"
    what = " and the stdout and stderr shown match its hashes" if files else \
        " (the output is no longer held here: check it with corral verify)"
    return "good", f"verified: signed by this host's key ({rc.public_key_text(os.path.dirname(db_path()))[:24]}…){what}"


def _dumps(v) -> bytes:
    import json

    return json.dumps(v).encode()


@router.get("/ui/denials")
def denials(request: Request, since: str | None = None, kind: str | None = None):
    v = _viewer(request)
    if v is None:
        return _to_login(request)
    from ...audit import query, series

    since, kind = since or "24h", kind or None
    try:
        age = _age(since, "since")
        if kind not in (None, *KINDS):
            raise _Bad(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    except _Bad as e:
        return _bad(v, e)
    s = series.denials_over_time(since=age, buckets=min(48, max(12, int(age // 3600) or 12)),
                                 actor=v.actor)
    if kind is not None:
        s["kinds"] = {k: x for k, x in s["kinds"].items() if k == kind}
    body = pages.denials_page(s, query.denials(since=age, kind=kind, actor=v.actor),
                              since=since, kind=kind)
    return _page("Denials", body, viewer=v, here="/ui/denials")


@router.get("/ui/probe")
def probe(request: Request):
    v = _viewer(request)
    if v is None:
        return _to_login(request)
    from ...probe import last

    return _page("Probe", pages.probe_page(last.load(_state_dir(request))), viewer=v,
                 here="/ui/probe")


@router.get("/ui/login")
def login_form(request: Request, next: str | None = None):    # noqa: A002 - the query's
    return _page("Log in", pages.login_page(next_=safe_next(next), error=None))


@router.post("/ui/login")
async def login(request: Request, next: str | None = None):    # noqa: A002
    if not same_origin(request):
        return _page("Refused", pages.error_page(403, "a login must come from this "
                                                 "server's own login page (same origin)"),
                     status=403)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > LOGIN_BODY_MAX:
            break
    token = None
    if ctype == "application/x-www-form-urlencoded" and len(raw) <= LOGIN_BODY_MAX:
        try:
            form = parse_qs(raw.decode("ascii"), strict_parsing=True, max_num_fields=4)
            token = form.get("token", [None])[0]
        except (ValueError, UnicodeDecodeError):
            token = None
    t = request.app.state.service.tokens.verify((token or "").strip())
    target = safe_next(next)
    if t is None:         # one answer for unknown, revoked and malformed alike
        return _page("Log in", pages.login_page(
            next_=target, error="That token is not valid (unknown or revoked)."),
            status=401)
    sid = _sessions(request).create(t)
    resp = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
    set_cookie(resp, request, sid)
    return resp


@router.post("/ui/logout")
def logout(request: Request):
    if not same_origin(request):
        return _page("Refused", pages.error_page(403, "a logout must come from this "
                                                 "server's own pages (same origin)"),
                     status=403)
    _sessions(request).end(session_id(request))
    resp = RedirectResponse("/ui/login", status_code=303, headers={"Cache-Control": "no-store"})
    clear_cookie(resp, request)
    return resp
