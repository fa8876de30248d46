"""The Python SDK for `corral serve`: the in-process API's names, over HTTP.

    from corral.client import Sandbox

    with Sandbox.create(policy={"limits": {"memory": "1G"}}, timeout=600,
                        api_url="http://127.0.0.1:8787", api_key="corral_...") as sb:
        print(sb.commands.run("echo hi").stdout)
        srv = sb.commands.run("python3 -m http.server 8000", background=True)
        sb.files.write("/scratch/x.txt", "kept")
        print(sb.files.read("/scratch/x.txt"))
        print(sb.run_code("1+1").text)
        term = sb.pty.create(80, 24, on_data=lambda b: print(b.decode(), end=""))
        sb.set_timeout(60); sb.get_info()

api_url and api_key default to $CORRAL_API_URL and $CORRAL_API_KEY. Errors come back as
corral's own exception classes (corral.errors, FilesError and FileNotFound of the files
API, ReviewError of the changes, TimeoutError of a wait), plus ApiError (a CorralError)
for what the service refuses: `.status` is the HTTP status, `.kind` and `.field` those of
the service's error body. AsyncSandbox is the same with `await`.
"""

from ._common import (
    ApiError,
    AuthError,
    CeilingError,
    CommandInfo,
    Execution,
    NotFound,
    RateLimited,
    SandboxInfo,
)
from .aio import AsyncCommandHandle, AsyncPtyHandle, AsyncSandbox
from .sync import CommandHandle, PtyHandle, Sandbox

__all__ = ["ApiError", "AsyncCommandHandle", "AsyncPtyHandle", "AsyncSandbox", "AuthError",
           "CeilingError", "CommandHandle", "CommandInfo", "Execution", "NotFound",
           "PtyHandle", "RateLimited", "Sandbox", "SandboxInfo"]
