"""The service's routes, one module a resource; app.py includes every router here."""

from . import code, commands, explain, files, sandboxes, system

ROUTERS = [system.router, sandboxes.router, commands.router, code.router, files.router,
           explain.router]
