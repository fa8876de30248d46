"""The service's routes, one module a resource; app.py includes every router here (and the
dashboard's pages, service/dashboard/)."""

from ..dashboard import routes as dashboard
from . import audit, changes, code, commands, events, explain, files, pty, sandboxes, system

ROUTERS = [system.router, sandboxes.router, commands.router, code.router, files.router,
           changes.router, events.router, pty.router, explain.router,
           audit.router, dashboard.router]
