"""A namespace-tier live sandbox keeps an entrant ready, and READY_ENTRANTS once its
commands came faster than it prepared them (backends/namespace_live.py): a command started
right after another, with no pause for the sandbox's thread to prepare one, still finds
one entered and waiting, never forks one on its own path; and the sandbox's thread forks
them with the sandbox's lock let go."""

from __future__ import annotations

import threading
import time

import pytest
from livefix import available, loop_run, running, wait_for

import corral
from corral.backends import namespace_live


def _ready(live, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(live._entrants) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(live._entrants)


def test_back_to_back_commands_find_prepared_entrants():
    available("namespace")
    assert namespace_live.READY_ENTRANTS >= 2
    with corral.Sandbox.create({"isolation": "namespace"}, timeout=120) as sb:
        live = sb._live
        assert sb.commands.run(["true"]).exit_code == 0
        # one kept while the commands leave it time to prepare the next
        assert _ready(live, 1) == 1 and live._want == 1
        time.sleep(0.2)
        assert len(live._entrants) == 1
        # a command that finds none ready (the thread kept from refilling: commands come
        # faster than it prepares them) makes the sandbox keep READY_ENTRANTS from then on
        real_prepare = live.prepare
        live.prepare = lambda *a, **k: None
        try:
            sb._drop_entrant()
            assert sb.commands.run(["true"]).exit_code == 0
        finally:
            live.prepare = real_prepare
        assert live._want == namespace_live.READY_ENTRANTS
        assert sb.commands.run(["true"]).exit_code == 0
        assert _ready(live, namespace_live.READY_ENTRANTS) == namespace_live.READY_ENTRANTS
        on_path = []
        real = live._prepare_one

        def watched(lock=None):
            if threading.current_thread() is threading.main_thread():
                on_path.append(1)     # a command's own start had none ready
            return real(lock)

        live._prepare_one = watched
        for _ in range(namespace_live.READY_ENTRANTS):
            r = sb.commands.run("true")
            assert r.exit_code == 0 and r.verdict == "ok", r
        assert on_path == []
        # the thread refills them; a command started while it forks one is not held up
        assert _ready(live, namespace_live.READY_ENTRANTS) == namespace_live.READY_ENTRANTS
        assert sb.commands.run("echo hi").stdout == "hi\n"


def test_a_sandbox_killed_while_its_entrants_are_forked_closes_cleanly():
    available("namespace")
    for _ in range(5):
        sb = corral.Sandbox.create({"isolation": "namespace"}, timeout=120)
        sb.commands.run(["true"])
        sb.commands.run(["true"])
        live = sb._live
        problems = sb.kill()   # the watchdog may be forking the next entrants right now
        assert not problems, problems
        assert live._entrants == [] and live._forks == 0 and live.target is None


def test_an_entrant_killed_while_it_waited_is_never_handed_a_command():
    """A prepared entrant can die while it waits (the OOM killer at the sandbox's memory
    limit weighs the pages it shares with the zygote as its own; CI saw the next command
    fail with BrokenPipeError after an OOM kill). The next commands take a live one."""
    import os
    import signal

    available("namespace")
    with corral.Sandbox.create({"isolation": "namespace"}, timeout=120) as sb:
        live = sb._live
        assert sb.commands.run(["true"]).exit_code == 0
        for _ in range(3):
            assert _ready(live, live._want) == live._want
            for entrant, _cg in list(live._entrants):
                os.kill(entrant.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while (any(e.waiting() for e, _ in list(live._entrants))
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            r = sb.commands.run("echo fine")
            assert (r.exit_code, r.stdout) == (0, "fine\n"), r
        assert sb.commands.run(["true"]).exit_code == 0


def _killing_takes(live, n: int) -> list[int]:
    """Make live's next `n` entrant takes hand out an entrant killed (SIGKILL, exited) just
    after it was taken, once ready, and before the request is sent: the race in which an
    entrant dies between _take_entrant's look and its read of the request. Returns the
    pids killed."""
    import os
    import signal

    take, killed = live._take_entrant, []

    def taking():
        entrant, cg = take()
        if len(killed) < n:
            entrant.wait_ready()     # entered and confined, its "ready" read: then killed
            os.kill(entrant.pid, signal.SIGKILL)
            wait_for(lambda: not running([entrant.pid]), "the killed entrant's exit", 10)
            killed.append(entrant.pid)
        return entrant, cg

    live._take_entrant = taking
    return killed


def _fresh_killed_takes(live, n: int) -> list[bytes]:
    """Make live's next `n` entrant takes hand out a new entrant SIGKILLed as soon as the
    zygote has forked it, most often before it is ready (entered and confined, its "ready"
    sent): what it had sent by its death is recorded (b"" for nothing, b"r" for a ready
    one: the race the test above covers)."""
    import os
    import signal
    import socket

    take, seen = live._take_entrant, []

    def taking():
        if len(seen) >= n:
            return take()
        while live._entrants:                 # not a prepared one: a new one, killed at once
            live._let_go(*live._entrants.pop())
        live._prepare_one()
        entrant, cg = live._entrants.pop()
        os.kill(entrant.pid, signal.SIGKILL)
        wait_for(lambda: not running([entrant.pid]), "the killed entrant's exit", 10)
        seen.append(entrant.sock.recv(1, socket.MSG_PEEK))
        return entrant, cg

    live._take_entrant = taking
    return seen


def test_an_entrant_killed_before_it_is_ready_is_replaced():
    """An entrant that dies before it is ready (the OOM killer, a kill of the sandbox's
    processes) never had the command: the command goes to a new entrant, on the thread
    path and the event loop's, and nothing fails. Killed at once after its fork, most die
    before their "ready"; at least one of ten must have, for the test to say anything."""
    available("namespace")
    with corral.Sandbox.create({"isolation": "namespace"}, timeout=120) as sb:
        live = sb._live
        assert sb.commands.run(["true"]).exit_code == 0
        seen = []
        for i in range(5):
            got = _fresh_killed_takes(live, 1)
            r = sb.commands.run(f"echo run{i}")
            assert (r.exit_code, r.stdout) == (0, f"run{i}\n"), (got, r)
            seen += got
            got = _fresh_killed_takes(live, 1)
            r = loop_run(sb, ["/bin/echo", f"loop{i}"])
            assert (r.verdict, r.stdout) == ("ok", f"loop{i}\n"), (got, r)
            seen += got
        del live._take_entrant
        assert len(seen) == 10 and b"" in seen, seen
        r = sb.commands.run("echo still")
        assert (r.exit_code, r.stdout) == (0, "still\n"), r


def test_an_entrant_that_dies_after_it_is_taken_is_replaced_once():
    """The entrant taken for a command dies before it reads the request (it never had it,
    nothing ran): the command goes to a new entrant, once (start() and start_send(), the
    event loop's half); a second death in a row is a one-line SandboxSetupError, and the
    sandbox goes on serving commands."""
    available("namespace")
    with corral.Sandbox.create({"isolation": "namespace"}, timeout=120) as sb:
        live = sb._live
        assert sb.commands.run(["true"]).exit_code == 0
        killed = _killing_takes(live, 1)
        r = sb.commands.run("echo fine")
        assert (r.exit_code, r.stdout) == (0, "fine\n"), r
        assert len(killed) == 1

        killed = _killing_takes(live, 2)
        with pytest.raises(corral.SandboxSetupError, match="died before it took the command"):
            sb.commands.run("echo never")
        assert len(killed) == 2

        # the event loop's half (corral serve): the request sent, the answer read later
        killed = _killing_takes(live, 1)
        time.sleep(0.2)
        r = loop_run(sb, ["/bin/echo", "hi"])
        assert (r.verdict, r.stdout) == ("ok", "hi\n"), r
        assert len(killed) == 1
        killed = _killing_takes(live, 2)
        with pytest.raises(corral.SandboxSetupError, match="died before it took the command"):
            sb.commands._begin(["/bin/echo", "never"])
        assert len(killed) == 2
        del live._take_entrant          # the class's own again
        r = sb.commands.run("echo still")
        assert (r.exit_code, r.stdout) == (0, "still\n"), r
