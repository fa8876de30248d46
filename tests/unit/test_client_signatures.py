"""corral.client has the in-process API's names and shapes (issue 17: "code moves between
local and remote by changing one import"): every public method, property and attribute of
the live sandbox and its sub-APIs (commands, command handles, files, watchers, terminals)
is on corral.client.Sandbox and AsyncSandbox's counterparts, each in-process parameter
with the same kind (positional or keyword-only) and default, and the async twin's
methods are coroutines. What differs is in ALLOWED below, each with its reason; a
parameter or method added in-process later fails here until the SDK has it too (or it is
allowed, with a reason). No server: signatures only (tests/faces/test_client_parity.py
runs both sides for real)."""

from __future__ import annotations

import inspect

import pytest

from corral.client import aio, sync
from corral.runtime import commands, files, pty, watch
from corral.runtime.live import Live

PAIRS = {
    "Sandbox": (Live, sync.Sandbox, aio.AsyncSandbox),
    "Commands": (commands.Commands, sync.Commands, aio.AsyncCommands),
    "CommandHandle": (commands.CommandHandle, sync.CommandHandle, aio.AsyncCommandHandle),
    "Files": (files.Files, sync.Files, aio.AsyncFiles),
    "Watcher": (watch.Watcher, sync.Watcher, aio.AsyncWatcher),
    "Pty": (pty.Pty, sync.Pty, aio.AsyncPty),
    "PtyHandle": (pty.PtyHandle, sync.PtyHandle, aio.AsyncPtyHandle),
}

# (class, name) or (class, method, parameter): in-process only, and why. "both" applies to
# the sync and the async SDK; "async" to AsyncSandbox & co only.
HOST_SIDE = "a host-side internal of the in-process sandbox (fds, host uids, setup)"
NO_ACCOUNT = ("files as the unprivileged account are not on the REST API yet (the E2B "
              "face has them: docs/e2b.md); sb.files is root's")
NO_LEARN = "learn mode is not offered over the service (runtime/learn.py runs in-process)"
NO_AWAIT = "a property cannot await: `(await sb.get_info()).state` / `.ends`"
ALLOWED: dict[tuple, tuple[str, str]] = {
    # the host's environment for env.pass: on the service it is the server's, which a
    # client must not read through a policy; secrets are by name in the server's config
    ("Sandbox", "create", "env"): ("both", "the server's environment, not the client's"),
    ("Sandbox", "create", "backend"): ("both", "a test hook: a tier's Backend object"),
    ("Sandbox", "create", "detached"): ("both", "a service's sandbox outlives its client "
                                                "already (Sandbox.connect(id))"),
    ("Sandbox", "create", "learn"): ("both", NO_LEARN),
    ("Sandbox", "learned"): ("both", NO_LEARN),
    ("Sandbox", "learned_policy"): ("both", NO_LEARN),
    ("Sandbox", "files_for"): ("both", NO_ACCOUNT),
    ("Sandbox", "user_files"): ("both", NO_ACCOUNT),
    ("Sandbox", "enter_target"): ("both", HOST_SIDE),
    ("Sandbox", "ids"): ("both", HOST_SIDE),
    ("Sandbox", "open"): ("both", HOST_SIDE + ": a remote sandbox is open once made"),
    # a live sandbox refuses exec(tty=True) in-process too: its terminals are sb.pty
    ("Sandbox", "exec", "tty"): ("both", "refused by a live sandbox: use sb.pty"),
    ("Sandbox", "exec", "tty_size"): ("both", "refused by a live sandbox: use sb.pty"),
    ("Commands", "run", "tty_fd"): ("both", "a host file descriptor (sb.pty's own use)"),
    ("Commands", "run", "on_start"): ("both", "corral serve's own hook; background=True "
                                              "gives a handle at once"),
    ("Commands", "stream"): ("both", "run_code's interpreters' channel (runtime/channels)"),
    ("Files", "close"): ("both", HOST_SIDE + ": the sandbox's end closes it"),
    ("Files", "over_mounts"): ("both", HOST_SIDE + ": a constructor"),
    ("Pty", "for_live"): ("both", HOST_SIDE + ": a constructor"),
    ("Pty", "for_sandbox"): ("both", HOST_SIDE + ": a constructor"),
    ("Sandbox", "state"): ("async", NO_AWAIT),
    ("Sandbox", "ends"): ("async", NO_AWAIT),
    ("CommandHandle", "running"): ("async", "a property cannot await: `await h.wait(0)` "
                                            "raises TimeoutError while it runs"),
}


def _public(cls) -> dict:
    """Public names of `cls` (through its bases), attributes it annotates included."""
    out = {}
    for klass in reversed(cls.__mro__):
        for name in getattr(klass, "__annotations__", {}):
            if not name.startswith("_"):
                out[name] = None
    for name in dir(cls):
        if not name.startswith("_"):
            out[name] = inspect.getattr_static(cls, name)
    return out


def _allowed(key: tuple, label: str) -> bool:
    who = ALLOWED.get(key)
    return who is not None and who[0] in ("both", label)


def _gaps(key: str, local, remote, label: str) -> list[str]:
    gaps = []
    ours, theirs = _public(local), _public(remote)
    for name, attr in ours.items():
        if name not in theirs:
            if not _allowed((key, name), label):
                gaps.append(f"{label} {key}.{name} is missing")
            continue
        if attr is None or isinstance(attr, property) or not callable(attr):
            continue
        if isinstance(attr, (classmethod, staticmethod)):
            attr = attr.__func__
        mine = getattr(remote, name)
        if label == "async" and name not in ("create", "connect", "list") \
                and not isinstance(inspect.getattr_static(remote, name), property):
            # the sub-API's calls are coroutines; create/connect/list are too (classmethods)
            if not (inspect.iscoroutinefunction(mine) or inspect.isasyncgenfunction(mine)):
                gaps.append(f"async {key}.{name} is not a coroutine function")
        if label == "async" and name in ("create", "connect", "list") \
                and not inspect.iscoroutinefunction(mine):
            gaps.append(f"async {key}.{name} is not a coroutine function")
        want = inspect.signature(attr).parameters
        have = inspect.signature(mine).parameters
        for p in want.values():
            if p.name in ("self", "cls") or _allowed((key, name, p.name), label):
                continue
            q = have.get(p.name)
            if q is None:
                gaps.append(f"{label} {key}.{name} lacks {p.name}=")
            elif (q.kind, q.default) != (p.kind, p.default):
                gaps.append(f"{label} {key}.{name}({p.name}=): {q.kind.name} default "
                            f"{q.default!r}, in-process {p.kind.name} {p.default!r}")
        # what the SDK adds (api_url=, request_timeout=) must not be required
        for q in have.values():
            if q.name not in want and q.name not in ("self", "cls") \
                    and q.default is inspect.Parameter.empty \
                    and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
                gaps.append(f"{label} {key}.{name} requires {q.name}, in-process has none")
    return gaps


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_the_sdk_has_the_in_process_names_and_parameters(key):
    local, sync_cls, async_cls = PAIRS[key]
    gaps = _gaps(key, local, sync_cls, "sync") + _gaps(key, local, async_cls, "async")
    assert not gaps, "\n".join(gaps)


def test_every_allowance_is_still_needed():
    """An allowance whose gap was closed (or whose name went away) is removed here."""
    stale = []
    for key, (who, _why) in ALLOWED.items():
        cls, *rest = key
        local, sync_cls, async_cls = PAIRS[cls]
        assert rest[0] in _public(local), f"{key}: no such in-process name"
        for label, remote in (("sync", sync_cls), ("async", async_cls)):
            if who not in ("both", label):
                continue
            if len(rest) == 1:
                present = rest[0] in _public(remote)
            else:
                present = rest[1] in inspect.signature(getattr(remote, rest[0])).parameters
            if present:
                stale.append((label, key))
    assert not stale, stale


def test_the_check_catches_a_gap():
    """The comparison is not vacuous: a missing method and a missing parameter show."""
    class Local:
        def run(self, cmd, *, env=None, user=None):
            pass

        def extra(self):
            pass

    class Remote:
        def run(self, cmd, *, env=None):
            pass

    gaps = _gaps("X", Local, Remote, "sync")
    assert "sync X.extra is missing" in gaps and "sync X.run lacks user=" in gaps


def test_every_public_sdk_call_has_a_docstring():
    """Issue 17: the SDK is documented: each public method and property of the client's
    classes says what it does (units, defaults, what it raises)."""
    bare = []
    for mod in (sync, aio):
        for cname, cls in vars(mod).items():
            if not inspect.isclass(cls) or cls.__module__ != mod.__name__ \
                    or cname.startswith("_"):
                continue
            if not (cls.__doc__ or "").strip():
                bare.append(f"{mod.__name__}.{cname}")
            for name, attr in vars(cls).items():
                if name.startswith("_") and name not in ("__enter__", "__aenter__"):
                    continue
                fn = attr.fget if isinstance(attr, property) else getattr(
                    attr, "__func__", attr)
                if callable(fn) and not (fn.__doc__ or "").strip():
                    bare.append(f"{mod.__name__}.{cname}.{name}")
    assert not bare, bare
