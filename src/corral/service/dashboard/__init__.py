"""The web dashboard of `corral serve` (docs/dashboard.md): routes.py (the pages and the
login), session.py (sessions, cookies, the same-origin check), pages.py and html.py (the
HTML, with everything from a sandbox escaped)."""
