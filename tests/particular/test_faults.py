"""Fault injection (issue 23), namespace tier, real processes: a supervisor SIGKILLed at
each stage of a run leaves nothing running, and the next corral start sweeps what it left
on the host; live sandboxes ended every way leave no fd or thread in the supervisor; an
egress proxy SIGKILLed mid-download cuts its client and says so in the Result.

Each case runs `corral.run` in a child supervisor process that prints the id of every
run directory it makes (its own and its cgroup pool's), and is killed:

  planning   at the moment it would spawn bwrap: the run directory is made and locked, the
             scratch tmpfs and the workspace's idmapped clone are mounted, the run's
             cgroup exists (the child replaces namespace.spawn with a SIGKILL of itself)
  bwrap      bwrap started, moved into the run's cgroup, its options written, the gate
             (its seccomp program) still empty (namespace._pidfd, the step after the
             limits, replaced the same way)
  running    the command is running: the test waits for the marker file it writes to the
             workspace (and for a daemon it double-forked), then SIGKILLs the supervisor
             from outside: no hook at all
  teardown   the command has ended and the run directory is half torn down: the first
             unmount of the teardown succeeds, then the child SIGKILLs itself
             (rundir._umount wrapped)

The hooks are monkeypatches in the child's own script: corral has no fault switch.
Afterwards: no process is left in any of the run's cgroups or mentions the run's token;
once a new supervisor starts (`corral run /bin/true`, after rundir.SWEEP_EVERY_S), no run
directory, mount, cgroup or registry entry of the dead one is left. The command ran only
in the stages after the gate (running, teardown), and wrote nothing in the others.
"""

import os
import subprocess
import sys
import time
import uuid

import pytest
from conftest import CORRAL, procs_mentioning

from corral.linux import limits, rundir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the root path: /run/corral, uids")

CHILD = r"""
import os, sys
import corral
from corral.backends import namespace
from corral.linux import rundir

ws, token, stage = sys.argv[1:]
real_init = rundir.RunDir.__init__

def init(self, *a, **kw):
    real_init(self, *a, **kw)
    # the test's handle on what this run made; one write a line: the teardown thread
    # makes a run dir ahead while the main thread prints "finished"
    os.write(1, f"{self.id}\n".encode())

rundir.RunDir.__init__ = init

def die(*a, **kw):
    os.kill(os.getpid(), 9)

if stage == "planning":
    namespace.spawn = die
elif stage == "bwrap":
    namespace._pidfd = die
elif stage == "teardown":
    real_umount = rundir._umount

    def umount(path):
        problem = real_umount(path)
        die()
    rundir._umount = umount
cmd = (f"echo {token} > /workspace/ran; (setsid sleep 300 > /dev/null 2>&1 &); "
       f"echo {token} > /workspace/daemon; " + ("sleep 300" if stage == "running" else "true"))
r = corral.run(["/bin/sh", "-c", cmd, token],
               {"filesystem": {"workspace": {"path": ws, "mode": "rw"}},
                "limits": {"timeout": "120s"}})
os.write(1, f"finished {r.verdict}\n".encode())
"""


def _in_cgroup_of(pid: str, ids: set[str]) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return False
    return any(f"/{i}-" in text for i in ids)


def _running(token: str, ids: set[str]) -> list[int]:
    found = set(procs_mentioning(token))
    found.update(int(p) for p in os.listdir("/proc") if p.isdigit() and _in_cgroup_of(p, ids))
    return sorted(found)


def _left(ids: set[str]) -> list[str]:
    base = rundir.base_dir()
    found = [f"run dir {i}" for i in ids if os.path.lexists(os.path.join(base, i))]
    found += [f"registry {i}" for i in ids
              if os.path.lexists(os.path.join(base, rundir.REGISTRY, i + ".json"))]
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f
                  if any(f"{base}/{i}" in line.split()[4] for i in ids)]
    for _, parent in limits.detect().parents:
        if os.path.isdir(parent):
            found += [f"cgroup {parent}/{n}" for n in os.listdir(parent)
                      if n.split("-")[0] in ids]
    return found


def _wait(cond, seconds: float = 15.0):
    deadline = time.monotonic() + seconds
    while True:
        got = cond()
        if not got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.mark.parametrize("stage", ["planning", "bwrap", "running", "teardown"])
def test_a_supervisor_killed_at_each_stage_leaves_nothing(tmp_path, stage):
    ws = tmp_path / "ws"
    ws.mkdir()
    token = f"corral-fault-{uuid.uuid4().hex}"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ws), token, stage],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ids: set[str] = set()
    try:
        if stage == "running":
            # observable state only: the command's marker file and its daemon's
            deadline = time.monotonic() + 60
            while not (ws / "daemon").exists():
                assert child.poll() is None, child.stderr.read()
                assert time.monotonic() < deadline, "the command never started"
                time.sleep(0.02)
            assert _running(token, set()), "the command's processes should be visible"
            child.kill()
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -9, (out, err)
    assert "finished" not in out
    ids = {line for line in out.split() if len(line) == rundir.ID_LEN}
    assert ids, out
    # nothing of the run keeps running: bwrap dies with its parent, and what is left in
    # the run's cgroup is inert until the sweep kills it
    if stage in ("running", "teardown"):
        assert (ws / "ran").read_text().strip() == token
    else:
        assert not (ws / "ran").exists(), "the command ran without its supervisor"
    # the next corral start (once a sweep is due again) sweeps what the dead one left
    time.sleep(rundir.SWEEP_EVERY_S + 0.1)
    r = subprocess.run([CORRAL, "run", "--", "/bin/true"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert _wait(lambda: _running(token, ids)) == [], "a process outlived the sweep"
    assert _wait(lambda: _left(ids)) == []
    if stage == "teardown":
        return
    # the control: the same run with a live supervisor runs the command and ends cleanly
    (ws / "ran").unlink(missing_ok=True)
    p = subprocess.run([sys.executable, "-c", CHILD, str(ws), token, "none"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "finished ok" in p.stdout, p
    assert (ws / "ran").read_text().strip() == token
    done = {line for line in p.stdout.split() if len(line) == rundir.ID_LEN}
    assert _wait(lambda: _running(token, done)) == []


def _fds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return found


def test_live_sandboxes_killed_leave_no_fd_or_thread_in_the_supervisor():
    """Found by bench/concurrency.py: each live sandbox left its watchdog's wake pipe (two
    fds) open in the supervisor after it ended, so a service making sandboxes all day ran
    out of fds."""
    import threading

    import corral

    warm = corral.Sandbox.create({"isolation": "namespace"}, timeout=120)
    warm.commands.run(["/bin/true"])
    warm.kill()
    before = _fds()
    sbs = [corral.Sandbox.create({"isolation": "namespace"}, timeout=120) for _ in range(4)]
    for sb in sbs:
        assert sb.commands.run(["/bin/true"]).exit_code == 0
    sbs[0].kill()                                   # killed by the caller
    sbs[1].set_timeout(0.2)                         # ended by its timeout
    # what init waits for killed from inside: init ends, and the sandbox with it
    sbs[2].commands.run(["/bin/sh", "-c", "kill -KILL -1; sleep 5"])
    sbs[3].close()

    def open_still():
        names = {f"corral-live-{sb.id}" for sb in sbs}
        threads = [t.name for t in threading.enumerate() if t.name in names]
        return threads + sorted(_fds() - before)
    assert _wait(open_still) == []
    assert all(sb.state == "ended" for sb in sbs)


# -- the egress proxy killed in the middle of a download ----------------------------------

def _slow_world():
    """A server on a loopback address of its own that sends the headers and the first 64
    KiB of a 4 MiB body, then waits (until `release` or 60 s); a dnsmasq naming it."""
    import http.server
    import threading

    from netfix import start_dnsmasq

    ip = "127.{}.{}.2".format(*os.urandom(2))
    started, release = threading.Event(), threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(4 << 20))
            self.end_headers()
            self.wfile.write(b"x" * 65536)
            self.wfile.flush()
            started.set()
            release.wait(60)
            try:
                self.wfile.write(b"x" * ((4 << 20) - 65536))
            except OSError:
                pass

    srv = http.server.ThreadingHTTPServer((ip, 80), Slow)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    dns, port = start_dnsmasq({"slow.test": ip})
    return srv, dns, port, ip, started, release


def _proxies_of(pid: int, mark: bytes) -> list[int]:
    """The egress proxy serving the run whose command line holds `mark`: a child of `pid`
    running corral.egress as the uid of that run's bwrap (a forked proxy keeps the
    zygote's command line; the zygote and its idle spare run as root)."""
    procs = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{p}/cmdline", "rb") as f:
                procs[int(p)] = (int(st["PPid"]), int(st["Uid"].split()[0]), f.read())
        except (OSError, KeyError):
            continue
    uids = {uid for ppid, uid, cmd in procs.values()
            if ppid == pid and cmd.startswith(b"/usr/bin/bwrap") and mark in cmd}
    return [p for p, (ppid, uid, cmd) in procs.items()
            if ppid == pid and uid in uids and b"corral.egress" in cmd]


def test_an_egress_proxy_killed_mid_download_cuts_the_client_and_says_so():
    """SIGKILL of a run's egress proxy while its command downloads through it: the client
    sees its connection cut (not a hang until the timeout, not a silent short body), and
    the Result has a teardown event saying the proxy died (before the fix: none; a proxy
    ended by signal 9 passed for one the supervisor had stopped)."""
    import signal
    import threading

    import corral

    srv, dns, port, ip, started, release = _slow_world()
    out: dict = {}
    try:
        policy = {"isolation": "namespace",
                  "network": {"mode": "allow", "allow": ["slow.test"],
                              "allow_private": [ip + "/32"],
                              "nameservers": [f"127.0.0.1:{port}"]},
                  "limits": {"timeout": "60s"}}
        client = ("import sys, urllib.request as u\n"
                  "r = u.urlopen('http://slow.test/big', timeout=50)\n"
                  "got = len(r.read(65536)); print('first', got, flush=True)\n"
                  "try:\n"
                  "    got += len(r.read())\n"
                  "    print('whole', got)\n"
                  "except Exception as e:\n"
                  "    print('cut', type(e).__name__, got)\n")
        first = threading.Event()
        t = threading.Thread(target=lambda: out.update(r=corral.run(
            ["/usr/bin/python3", "-c", client], policy,
            on_stdout=lambda data: b"first" in data and first.set())))
        t.start()
        assert first.wait(30), "the download never started"
        proxies = _wait(lambda: len(_proxies_of(os.getpid(), b"slow.test")) != 1, 5) or \
            _proxies_of(os.getpid(), b"slow.test")
        assert len(proxies) == 1, proxies
        os.kill(proxies[0], signal.SIGKILL)
        t.join(60)
        assert not t.is_alive()
    finally:
        release.set()
        dns.kill()
        dns.wait()
        srv.shutdown()
        srv.server_close()
    r = out["r"]
    # EOF before Content-Length (IncompleteRead), or a reset (ConnectionResetError)
    last = r.stdout.splitlines()[-1].split()
    assert last[0] == "cut" and last[1] in ("IncompleteRead", "ConnectionResetError"), r
    assert 65536 <= int(last[2]) < 4 << 20, r
    assert r.verdict == "ok" and r.usage.wall_s < 30, r
    teardown = [e for e in r.events if e["kind"] == "teardown"]
    assert len(teardown) == 1 and "proxy" in teardown[0]["message"] \
        and "signal 9" in teardown[0]["message"], r.events


def test_a_live_sandboxs_proxy_killed_mid_download_is_in_its_events():
    """The same in a live sandbox: the command running through the proxy gets the cut
    and its Result the teardown event, and so do the sandbox's own events (before the
    fix: nothing said the sandbox had lost its network)."""
    import signal
    import threading

    import corral

    srv, dns, port, ip, started, release = _slow_world()
    sb = None
    out: dict = {}
    try:
        sb = corral.Sandbox.create({"isolation": "namespace",
                                    "network": {"mode": "allow", "allow": ["slow.test"],
                                                "allow_private": [ip + "/32"],
                                                "nameservers": [f"127.0.0.1:{port}"]}},
                                   timeout=120)
        client = ("import urllib.request as u\n"
                  "r = u.urlopen('http://slow.test/big', timeout=50)\n"
                  "got = len(r.read(65536)); print('first', got, flush=True)\n"
                  "try:\n"
                  "    got += len(r.read()); print('whole', got)\n"
                  "except Exception as e:\n"
                  "    print('cut', type(e).__name__, got)\n")
        first = threading.Event()
        t = threading.Thread(target=lambda: out.update(r=sb.commands.run(
            ["/usr/bin/python3", "-c", client], timeout=60,
            on_stdout=lambda data: "first" in (data if isinstance(data, str) else
                                               data.decode()) and first.set())))
        t.start()
        assert first.wait(30), "the download never started"
        os.kill(sb._live.proxy.pid, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive()
        r = out["r"]
        assert r.stdout.splitlines()[-1].split()[0] == "cut", r
        assert any(e["kind"] == "teardown" and "proxy died" in e["message"]
                   for e in r.events), r.events
        _wait(lambda: not any("proxy died" in e.get("message", "") for e in sb.events), 10)
        assert [e["kind"] for e in sb.events if "proxy died" in e.get("message", "")] == \
            ["teardown"], sb.events
        assert sb.state == "running"
    finally:
        release.set()
        if sb is not None:
            sb.kill()
        dns.kill()
        dns.wait()
        srv.shutdown()
        srv.server_close()


def test_gvisor_reaps_runsc_strays_a_late_kill_left_as_zombies():
    """Found by bench/soak.py on gvisor under load (~2% of runs): a gofer or Sentry that a
    kill orphaned after the exec stopped waiting for it (1 s) became this process's zombie
    for good. A stray like it (a process named "exe", as runsc's re-executions are, of the
    sandbox's uid, our child, exited) is reaped by the sandbox's next exec and its close."""
    import shutil
    import subprocess

    from conftest import tier_unavailable

    import corral

    why = tier_unavailable("gvisor")
    if why:
        pytest.skip(why)
    import tempfile

    d = tempfile.mkdtemp(dir="/var/tmp")       # reachable by the sandbox uids
    os.chmod(d, 0o755)
    exe = os.path.join(d, "exe")
    shutil.copy("/bin/true", exe)

    def zombie(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return False

    def stray(uid: int) -> int:
        p = subprocess.Popen([exe], user=uid, group=uid, extra_groups=[])
        pid = p.pid
        p.returncode = 0            # never waited for here: the sandbox must reap it
        _wait(lambda: not zombie(pid))
        return pid

    with corral.Sandbox({"isolation": "gvisor"}) as sb:
        assert sb.exec(["/bin/true"]).verdict == "ok"
        live = sb._live
        first = stray(live.sentry_uid)
        other = stray(4242)                  # not the sandbox's: never touched
        assert zombie(first) and zombie(other)
        assert sb.exec(["/bin/true"]).verdict == "ok"
        assert not zombie(first) and zombie(other)
        second = stray(live.uid)
    assert not zombie(second) and zombie(other)
    os.waitpid(other, 0)
    shutil.rmtree(d)
