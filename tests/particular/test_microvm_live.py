"""Live sandboxes on the microvm tier (`corral.Sandbox.create` and `corral.Pool`), with real
QEMU guests restored from the warm snapshot (TCG here), the real egress proxy and dnsmasq:
commands in the foreground and background at once, stdin, limits with their verdicts,
files and run_code through the guest agent, network allow for the sandbox's life, a guest
that stops answering ended with an event, and nothing left on the host after kill."""

import json
import os
import signal
import time

import pytest
from conftest import net_events
from netfix import PRIV, SRV
from vmfix import qemus

import corral
from corral.runtime.files import FilesError

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_live_microvm_sandbox(vm_image, dnsmasq, servers):
    before = set(qemus())
    policy = {"isolation": "microvm", "image": vm_image,
              "limits": {"cpu_time": "3s", "scratch": "16MiB"},
              "network": {"mode": "allow", "allow": ["allowed.test"], "allow_private": [PRIV],
                          "nameservers": [f"127.0.0.1:{dnsmasq['port']}"]}}
    sb = corral.Sandbox.create(policy, timeout=300)
    try:
        info = sb.get_info()
        assert info.isolation == "microvm" and info.offers["pty"], info
        # foreground: output, exit code, the guest's own kernel
        r = sb.commands.run("uname -r; echo oops >&2; exit 7")
        assert (r.verdict, r.exit_code) == ("error", 7), r
        assert r.stdout == "6.1.0-57-cloud-amd64\n" and r.stderr == "oops\n", r
        # background commands run at once with a foreground one; stdin reaches them
        echo = sb.commands.run(["python3", "-c", "import sys\nfor l in sys.stdin: "
                                "print('got', l.strip(), flush=True)"], background=True)
        sleeper = sb.commands.run("sleep 60", background=True)
        assert len(sb.commands.list()) == 2
        echo.send_stdin("a\nb\n")
        assert sb.commands.run("echo meanwhile").stdout == "meanwhile\n"
        echo.close_stdin()
        r = echo.wait(60)
        assert (r.verdict, r.stdout) == ("ok", "got a\ngot b\n"), r
        assert sleeper.running
        sleeper.kill()
        r = sleeper.wait(30)
        assert r.verdict == "killed" and r.signal == signal.SIGKILL, r
        # a signal to the command's own process, inside
        h = sb.commands.run(["sleep", "60"], background=True)
        assert h.send_signal(signal.SIGTERM)
        r = h.wait(30)
        assert r.signal == signal.SIGTERM, r
        # limits: the wall clock, CPU time (the guest kernel's RLIMIT_CPU), output
        r = sb.commands.run(["sleep", "30"], timeout=2)
        assert r.verdict == "timeout" and any(e.get("limit") == "timeout" for e in r.events)
        r = sb.commands.run(["python3", "-c", "while True: pass"])
        assert r.verdict == "timeout", r
        assert any(e.get("limit") == "cpu_time" for e in r.events), r.events
        # what a command leaves running is killed at its end
        sb.commands.run("setsid sleep 1000 > /dev/null 2>&1 &")
        r = sb.commands.run(["python3", "-c", "import os; print(sum(open(f'/proc/{p}/comm')"
                             ".read() == 'sleep\\n' for p in os.listdir('/proc') if p.isdigit()))"])
        assert r.stdout.strip() == "0", r
        # files, through the agent, as the sandbox's user
        sb.files.write("/scratch/d/a.txt", "hello files")
        sb.files.write("/scratch/d/b.bin", bytes(range(256)))
        assert sb.files.read("/scratch/d/a.txt") == "hello files"
        assert sb.files.read("/scratch/d/b.bin", format="bytes") == bytes(range(256))
        assert [e.name for e in sb.files.list("/scratch/d")] == ["a.txt", "b.bin"]
        assert sb.files.exists("/scratch/d/a.txt") and not sb.files.exists("/scratch/nope")
        assert sb.commands.run("cat /scratch/d/a.txt; id -u").stdout == "hello files1000\n"
        with pytest.raises(FilesError):
            sb.files.write("/usr/x", "read-only root")
        sb.files.remove("/scratch/d/a.txt")
        assert not sb.files.exists("/scratch/d/a.txt")
        # run_code keeps its state between cells
        ex = sb.run_code("x = 6 * 7\nprint(x)")
        assert ex.error is None and ex.logs.stdout == ["42\n"], ex
        assert sb.run_code("print(x + 1)").logs.stdout == ["43\n"]
        # network allow for the sandbox's life: through the proxy, with its events
        r = sb.commands.run(["python3", "-c", "import urllib.request as u; "
                             "print(u.urlopen('http://allowed.test/', timeout=20).read().decode())"])
        assert r.verdict == "ok" and f"hello from {SRV}" in r.stdout, r
        ev = net_events(r)
        assert [(e["host"], e["decision"]) for e in ev] == [("allowed.test", "allow")], r.events
        # a terminal: a pty of the guest's (its size, its line discipline), input, resize
        screen = bytearray()
        t = sb.pty.create(100, 30, ["sh", "-c", "stty size; tty; read x; echo got-$x; "
                                    "read y; stty size"], on_data=screen.extend)
        _until(lambda: b"/dev/pts/" in screen)
        assert screen.startswith(b"30 100\r\n/dev/pts/"), bytes(screen)
        t.send_input(b"abc\r")
        _until(lambda: b"got-abc\r\n" in screen)
        assert b"abc\r\n" in screen.split(b"got-")[0]     # echoed by the guest's pty
        t.resize(120, 40)   # the relay sends the new size before the input that follows
        t.send_input(b"\r")
        r = t.wait(30)
        assert r.exit_code == 0 and screen.endswith(b"40 120\r\n"), (r, bytes(screen))
    finally:
        problems = sb.kill()
    assert problems == []
    assert sb.state == "ended"
    assert set(qemus()) <= before, "a QEMU outlived its sandbox"


def test_a_guest_that_stops_answering_is_ended_with_an_event(vm_image):
    before = set(qemus())
    sb = corral.Sandbox.create({"isolation": "microvm", "image": vm_image}, timeout=300)
    try:
        assert sb.commands.run("echo up").stdout == "up\n"
        (qemu,) = set(qemus()) - before
        h = sb.commands.run(["sleep", "60"], background=True, timeout=2)
        os.kill(qemu, signal.SIGSTOP)   # the guest stops answering, even a kill
        r = h.wait(30)   # its timeout's kill is not answered: the VM is ended
        assert r.verdict in ("timeout", "killed"), r
        for _ in range(100):
            if sb.state == "ended":
                break
            time.sleep(0.1)
        assert sb.state == "ended" and sb.get_info().ended_by == "init"
        text = json.dumps(sb.events)
        assert "did not answer a kill" in text, sb.events
    finally:
        sb.kill()
    assert set(qemus()) <= before


def test_the_warm_pool_hands_out_microvm_sandboxes(vm_image):
    before = set(qemus())
    with corral.Pool({"isolation": "microvm", "image": vm_image}, size=1) as pool:
        sb = pool.claim(timeout=120)
        try:
            assert sb.isolation == "microvm"
            r = sb.commands.run("cat /etc/os-release | head -1; hostname")
            assert r.stdout.startswith('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\ncorral-'), r
        finally:
            sb.kill()
    for _ in range(100):   # the pool's refill, killed at close
        if set(qemus()) <= before:
            break
        time.sleep(0.1)
    assert set(qemus()) <= before
