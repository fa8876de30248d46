"""Live sandboxes on the namespace and gvisor tiers: one set of namespaces (one bwrap, one
runsc sandbox) for many commands, each command started from the host (runtime/live.py,
backends/namespace_live.py with linux/enter.py; backends/gvisor_live.py with runsc exec).
Real bwrap, real runsc, real namespaces, real cgroups. Where the tiers differ the test
says how, as docs/sessions.md does."""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import time

import pytest
from conftest import procs_of_uid, tier_unavailable
from livefix import TIERS, available, describe, gone, mounts_below, running, wait_for
from netfix import free_port

import corral
from corral.errors import BackendUnavailable, SandboxClosed, UsageError

_NAMESPACE = pytest.mark.skipif(tier_unavailable("namespace") is not None,
                                reason=f"namespace tier: {tier_unavailable('namespace')}")

SYSCALLS = textwrap.dedent("""
    import ctypes, errno
    libc = ctypes.CDLL(None, use_errno=True)
    out = []
    for nr in (250, 435):   # keyctl (refused: EPERM), clone3 (ENOSYS: libc falls back)
        rc = libc.syscall(nr, 0, 0, 0, 0, 0)
        out.append(errno.errorcode[ctypes.get_errno()] if rc == -1 else "allowed")
    print(" ".join(out))
""")

@pytest.fixture(params=TIERS)
def tier(request):
    return available(request.param)


@pytest.fixture
def sb(tier):
    s = corral.Sandbox.create({"isolation": tier}, timeout=120)
    yield s
    s.kill()

def test_state_survives_between_commands_variables_do_not(sb):
    assert sb.commands.run("echo kept > /scratch/a; export X=1; echo $X").stdout == "1\n"
    r = sb.commands.run('cat /scratch/a; echo "X=${X:-unset}"')
    assert r.stdout == "kept\nX=unset\n", r
    # a process a command leaves behind (output redirected) and a background command
    sb.commands.run("sleep 300 > /dev/null 2>&1 &")
    h = sb.commands.run(["sleep", "301"], background=True)
    ps = sb.commands.run("ps -e -o args").stdout.splitlines()
    assert "sleep 300" in ps and "sleep 301" in ps, ps
    assert h.running and h.pid in [c.pid for c in sb.commands.list()]
    if sb.isolation == "namespace":   # its own cgroup keeps what a command left behind
        assert any(c.detached and c.cmd[-1].startswith("sleep 300")
                   for c in sb.commands.list())
    else:   # gvisor: a left-behind process is init's (gVisor's tasks have no host cgroup)
        assert not any(c.detached for c in sb.commands.list())


def test_a_command_is_inside_every_namespace_without_capabilities(sb):
    r = sb.commands.run("hostname; echo $$; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' "
                        "/proc/self/status; cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
                        "id -u; pwd")
    lines = [ln.split() for ln in r.stdout.splitlines()]
    assert lines[0] == ["corral"], r
    assert int(lines[1][0]) < 50, r          # a pid of the sandbox's own namespace
    assert ["CapEff:", "0000000000000000"] in lines and ["CapBnd:", "0000000000000000"] in lines
    if sb.isolation == "namespace":
        assert ["NoNewPrivs:", "1"] in lines and ["Seccomp:", "2"] in lines
    else:   # runsc exec starts commands without the OCI deny list: every Result says so
        assert ["Seccomp:", "2"] not in lines
        assert any(e["kind"] == "unenforced" and e["rule"] == "Seccomp"
                   and "runsc exec" in e["reason"] for e in r.events), r.events
    assert ["lo"] in lines and len([x for x in lines if len(x) == 1 and x[0].isalpha()
                                    and x[0] not in ("corral", "lo")]) == 0, r
    assert lines[-2:] == [["0"], ["/scratch"]], r
    # commands share one pid namespace: each sees the other's process
    h = sb.commands.run(["sleep", "299"], background=True)
    assert str(h.pid) in sb.commands.run("ps -e -o pid").stdout.split()
    h.kill()


def test_seccomp_refuses_as_in_one_shot_runs(sb):
    live = sb.commands.run(["/usr/bin/python3", "-c", SYSCALLS])
    once = corral.run(["/usr/bin/python3", "-c", SYSCALLS], {"isolation": sb.isolation})
    if sb.isolation == "namespace":
        assert live.stdout == once.stdout == "EPERM ENOSYS\n", (live, once)
    else:   # gVisor's Sentry answers; the deny list is not on runsc exec's commands,
        # as explain says and each Result's unenforced event
        from corral.policy import policy_from_dict
        from corral.runtime.explain import explain

        note = next(r["note"] for r in explain(policy_from_dict({}), "gvisor")["rules"]
                    if "seccomp" in r["rule"])
        assert "a live sandbox's commands (runsc exec) go without them" in note
        assert once.stdout.split()[0] == "EPERM", once
        assert live.stdout.split()[0] != "EPERM", live
        assert any(e["kind"] == "unenforced" and e["rule"] == "Seccomp" for e in live.events)


def test_background_server_reachable_inside_never_from_the_host(sb):
    port = free_port()
    srv = sb.commands.run(["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
                           "--directory", "/scratch"], background=True)
    sb.commands.run("echo served > /scratch/page")
    fetch = ("import sys, time, urllib.request as u\n"
             "for _ in range(200):\n"
             "    try:\n"
             f"        print(u.urlopen('http://127.0.0.1:{port}/page').read().decode(), end='')\n"
             "        sys.exit(0)\n"
             "    except OSError:\n"
             "        time.sleep(0.05)\n"
             "sys.exit(1)\n")
    r = sb.commands.run(["python3", "-c", fetch], timeout=60)
    assert r.stdout == "served\n", r
    with pytest.raises(OSError):   # the host's 127.0.0.1 is another network namespace
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert srv.running
    srv.kill()
    assert srv.wait(30).verdict == "killed"


def test_per_command_timeout_kills_only_that_command(sb):
    bg = sb.commands.run(["sleep", "300"], background=True)
    r = sb.commands.run("sleep 60 & sleep 61; echo never", timeout=1)
    assert r.verdict == "timeout" and "never" not in r.stdout, r
    assert any(e.get("limit") == "timeout" for e in r.events)
    ps = sb.commands.run("ps -e -o args").stdout.splitlines()
    assert "sleep 300" in ps and "sleep 60" not in ps and "sleep 61" not in ps, ps
    assert bg.running


def test_background_handle_stdin_streams_and_its_own_result(sb):
    got = []
    h = sb.commands.run("while read l; do echo \"got $l\"; done; echo bye >&2; exit 3",
                        background=True, on_stdout=got.append)
    h.send_stdin("a\n")
    wait_for(lambda: b"".join(got) == b"got a\n", "the first line streamed back")
    h.send_stdin(b"b\n")
    h.close_stdin()
    r = h.wait(30)
    assert (r.verdict, r.exit_code, r.stdout, r.stderr) == ("error", 3, "got a\ngot b\n", "bye\n")
    assert b"".join(got) == b"got a\ngot b\n"
    with pytest.raises(BrokenPipeError):
        h.send_stdin("late")


def test_a_foreground_command_is_killed_from_another_thread_through_on_start(sb):
    """on_start hands the running foreground command's handle out (corral serve kills a
    foreground command when its client goes away); an exec failure never calls it."""
    seen = []

    def started(h):
        seen.append(h.pid)
        threading.Timer(0.3, h.kill).start()

    t0 = time.monotonic()
    r = sb.commands.run("sleep 60; echo never", on_start=started)
    assert r.verdict == "killed" and "never" not in r.stdout, r
    assert time.monotonic() - t0 < 30 and len(seen) == 1 and seen[0] > 0
    r = sb.commands.run(["no-such-command"], on_start=seen.append)
    assert r.exit_code == 127 and len(seen) == 1
    assert sb.commands.run("echo still").stdout == "still\n"


# gvisor's 150 commands take ~13 s: that variant runs with the slow group (CI runs it too)
@pytest.mark.parametrize("tier", ["namespace", pytest.param("gvisor", marks=pytest.mark.slow)],
                         indirect=True)
def test_a_command_that_ends_at_once_still_has_its_pid_inside(sb):
    """A handle's pid is the command's pid inside the sandbox (what `$$` says), also for a
    command that has exited, and been reaped, before its start is handled: the host's
    pid (which says where the host's other processes are) never shows. Before, one
    such command in ~8 had the host's pid."""
    wrong = []
    for _ in range(150):
        seen = []
        r = sb.commands.run("echo $$", on_start=lambda h: seen.append(h.pid))
        if [str(p) for p in seen] != [r.stdout.strip()]:
            wrong.append((seen, r.stdout.strip()))
    assert wrong == [], wrong[:5]


def test_foreground_stdin_env_cwd_and_exec_failure(sb):
    sb.commands.run("mkdir -p /scratch/d")
    r = sb.commands.run("cat; echo \"$GREETING\"; pwd", stdin=b"in\n", env={"GREETING": "hi"},
                        cwd="d")
    assert r.stdout == "in\nhi\n/scratch/d\n", r
    r = sb.commands.run(["no-such-command"])
    assert (r.exit_code, r.verdict) == (127, "error") and "not found" in r.stderr, r
    with pytest.raises(UsageError, match="working directory"):
        sb.commands.run("true", cwd="/no/such/dir")
    assert sb.commands.run("echo still").stdout == "still\n"
    with pytest.raises(UsageError):
        sb.commands.run("true", env={"A=B": "x"})
    with pytest.raises(UsageError):
        sb.commands.run([])


def test_sandbox_wide_pids_limit_holds_across_commands(tier):
    with corral.Sandbox.create({"isolation": tier, "limits": {"pids": 24}}, timeout=120) as sb:
        hold = sb.commands.run("for i in $(seq 16); do sleep 300 & done; wait",
                               background=True)
        wait_for(lambda: sb.commands.run("ps -e -o args").stdout.splitlines().count("sleep 300") == 16,
                  "16 sleepers")
        r = sb.commands.run("for i in $(seq 12); do sleep 1 & done; wait")
        assert "fork" in r.stderr.lower() or "resource" in r.stderr.lower(), r
        assert hold.running


def test_sandbox_timeout_leaves_nothing_behind(tier):
    sb = corral.Sandbox.create({"isolation": tier}, timeout=2)
    sb.commands.run("sleep 300 > /dev/null 2>&1 &")
    bg = sb.commands.run(["sleep", "301"], background=True)
    run_dir = sb._live.dir.path
    cgroups = sb._live.sandbox_cg.paths
    uid = sb.ids[0]
    assert procs_of_uid(uid) and mounts_below(run_dir) and all(map(os.path.isdir, cgroups))
    wait_for(lambda: sb.state == "ended", "the timeout")
    assert sb.get_info().ended_by == "timeout"
    assert any("timeout" in e["message"] for e in sb.events)
    assert bg.wait(30).verdict == "killed"
    # nothing runs; an entrant that was never used may still be a zombie for a moment,
    # until the zygote that forked it reaps it (linux/enter.py)
    left = running(procs_of_uid(uid) + gone(sb.id))
    assert left == [], describe(left)
    wait_for(lambda: not procs_of_uid(uid) + gone(sb.id), "the zombies to be reaped")
    assert mounts_below(run_dir) == [] and not os.path.exists(run_dir)
    assert not any(map(os.path.exists, cgroups))
    with pytest.raises(SandboxClosed, match="timeout"):
        sb.commands.run("true")


def test_killing_init_from_inside_closes_the_sandbox_with_an_event(sb):
    run_dir = sb._live.dir.path
    if sb.isolation == "namespace":
        # init (pid 1) ignores signals from inside its own namespace: SIGKILL does nothing
        r = sb.commands.run("kill -KILL 1; echo rc=$?")
        assert r.stdout == "rc=0\n" and sb.state == "running"
        # killing what init waits for ends init, and the namespace with every process
        r = sb.commands.run("kill -KILL -1; sleep 5; echo survived")
    else:   # gVisor lets pid 1 be killed from inside: that ends the container at once
        r = sb.commands.run("kill -KILL 1; sleep 5; echo survived")
    assert r.verdict == "killed" and "survived" not in r.stdout, r
    assert any(e["kind"] == "teardown" and "init" in e["message"] for e in r.events), r
    assert sb.state == "ended" and sb.get_info().ended_by == "init"
    assert not os.path.exists(run_dir) and gone(sb.id) == []
    with pytest.raises(SandboxClosed, match="init"):
        sb.commands.run("true")


def test_idle_timeout_ends_an_unused_sandbox(tier):
    sb = corral.Sandbox.create({"isolation": tier, "limits": {"idle_timeout": "1s"}},
                               timeout=120)
    try:
        assert sb.get_info().idle_timeout == 1
        h = sb.commands.run(["sleep", "2"], background=True)   # running: not idle
        assert h.wait(30).verdict == "ok"
        assert sb.state == "running"
        wait_for(lambda: sb.state == "ended", "the idle timeout")
        assert sb.get_info().ended_by == "idle"
    finally:
        sb.kill()


def test_set_timeout_get_info_kill(sb):
    info = sb.get_info()
    assert info.id == sb.id and info.state == "running" and info.isolation == sb.isolation
    assert info.policy_digest.startswith("sha256:") and len(info.policy_digest) == 71
    assert 110 < info.ends - info.created <= 120
    sb.set_timeout(600)
    assert sb.get_info().ends - time.time() > 590
    sb.commands.run("head -c 1000000 /dev/zero > /scratch/z")
    u = sb.get_info().usage
    assert u["commands"] == 1 and u["memory_peak_bytes"] > 1_000_000, u
    with pytest.raises(UsageError):
        sb.set_timeout(0)
    assert sb.kill() == []
    assert sb.get_info().state == "ended"
    with pytest.raises(SandboxClosed):
        sb.set_timeout(10)


def test_concurrent_foreground_commands(sb):
    results = {}

    def one(i):
        results[i] = sb.commands.run(f"sleep 0.3; echo {i}").stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: f"{i}\n" for i in range(4)}


@_NAMESPACE
def test_the_process_tier_refuses_a_live_sandbox():
    with pytest.raises(BackendUnavailable, match="live sandbox"):
        corral.Sandbox.create({"isolation": "process"})


@_NAMESPACE
def test_one_shot_sandbox_and_exec_are_unchanged():
    with corral.Sandbox() as sb:
        sb.exec(["sh", "-c", "echo x > /scratch/f; sleep 300 > /dev/null 2>&1 &"])
        assert sb.exec(["cat", "/scratch/f"]).stdout == "x\n"
        assert "sleep 300" not in sb.exec(["ps", "-e", "-o", "args"]).stdout


def test_pool_claims_distinct_never_used_sandboxes(tier):
    with corral.Pool({"isolation": tier}, size=2, timeout=60) as pool:
        wait_for(lambda: pool.ready() == 2, "two ready sandboxes")
        a, b = pool.claim(), pool.claim()
        c = pool.claim()     # made behind the first claims
        try:
            ids = {a.id, b.id, c.id}
            assert len(ids) == 3
            for sb in (a, b, c):
                info = sb.get_info()
                assert info.usage["commands"] == 0 and info.state == "running"
                assert 50 < info.ends - time.time() <= 60
                # nothing of anyone else's: a fresh scratch
                assert sb.commands.run("ls -A /scratch").stdout == ""
            a.commands.run("touch /scratch/mine")
            assert b.commands.run("ls -A /scratch").stdout == ""
        finally:
            for sb in (a, b, c):
                sb.kill()
    assert pool.ready() == 0


# gvisor's variant (~8-12 s, its memory part a sandbox of its own) runs with the slow group
@pytest.mark.parametrize("tier", ["namespace", pytest.param("gvisor", marks=pytest.mark.slow)],
                         indirect=True)
def test_per_command_output_and_cpu_limits_sandbox_wide_memory(tier):
    policy = {"isolation": tier, "limits": {"output": "1K", "cpu_time": "1s", "memory": "96M"}}
    with corral.Sandbox.create(policy, timeout=120) as sb:
        r = sb.commands.run("head -c 5000 /dev/zero | tr '\\0' x")
        assert len(r.stdout) == 1024 and r.stdout_truncated, r
        assert any(e.get("limit") == "output" for e in r.events)
        r = sb.commands.run("while :; do :; done", timeout=120)
        assert r.verdict == "timeout" and any(e.get("limit") == "cpu_time" for e in r.events), r
        # each command's own CPU counter: the next one starts from zero
        assert sb.commands.run("true").verdict == "ok"
        hold = ("import sys, time\nb = bytearray(40 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
                "print('held', flush=True)\ntime.sleep(300)\n")
        got = []
        h = sb.commands.run(["python3", "-c", hold], background=True, on_stdout=got.append)
        wait_for(lambda: b"held" in b"".join(got) or not h.running, "40 MB held")
        assert h.running
        # alone it fits (70 MB < 96 MB); with the other's 40 MB it does not, and the OOM
        # killer takes the largest process of the sandbox: this one
        take = "b = bytearray(70 << 20); b[::4096] = b'x' * len(b[::4096]); print('took')"
        if sb.isolation == "gvisor":
            # gvisor's per-command cpu_time is the sandbox's counter (gVisor's own CPU in
            # it): 1 s is gone in the allocations; the memory part runs without it below
            h.kill()
            return _gvisor_memory_ends_the_sandbox(take, hold)
        r = sb.commands.run(["python3", "-c", take], timeout=60)
        assert r.verdict == "oom" and "took" not in r.stdout, r
        assert any(e.get("limit") == "memory" for e in r.events)
        assert h.running
        h.kill()
        assert sb.commands.run(["python3", "-c", take], timeout=60).stdout == "took\n"


def _gvisor_memory_ends_the_sandbox(take: str, hold: str) -> None:
    """gvisor: the sandbox's memory limit holds across commands; the host's OOM killer
    takes one of gVisor's own processes (the Sentry holds the sandbox's memory), so
    gVisor's kernel ends, and the sandbox with it says why."""
    with corral.Sandbox.create({"isolation": "gvisor", "limits": {"memory": "96M"}},
                               timeout=120) as sb:
        got = []
        h = sb.commands.run(["python3", "-c", hold], background=True, on_stdout=got.append)
        wait_for(lambda: b"held" in b"".join(got) or not h.running, "40 MB held")
        assert h.running
        r = sb.commands.run(["python3", "-c", take], timeout=60)
        assert r.verdict == "oom" and "took" not in r.stdout, r
        assert any(e.get("limit") == "memory" for e in r.events)
        wait_for(lambda: sb.state == "ended", "the sandbox's end")
        assert sb.get_info().ended_by == "init"
        assert any("memory" in e["message"] and "OOM" in e["message"]
                   for e in sb.events), sb.events


def test_a_command_on_a_terminal_slave_has_it_as_controlling_terminal(sb):
    """The hook sb.pty builds on: tty_fd= gives the command a terminal of the caller's
    (here a host pty pair) as stdio and controlling terminal."""
    master, slave = os.openpty()
    try:
        h = sb.commands.run("test -t 0 && test -t 1 && echo is-a-tty; python3 -c "
                            "\"import os; os.tcgetpgrp(0) == os.getpgrp() and print('has-ctty')\"",
                            background=True, tty_fd=slave)
        os.close(slave)
        slave = -1
        r = h.wait(60)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:   # EIO: every slave is closed
                break
            if not chunk:
                break
            out += chunk
        assert r.verdict == "ok", r
        assert b"is-a-tty" in out and b"has-ctty" in out, out
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def test_network_allow_one_proxy_for_the_sandbox_events_in_each_result(tier):
    policy = {"isolation": tier, "network": {"mode": "allow", "allow": ["allowed.invalid"]}}
    if tier_unavailable(tier, policy):
        pytest.skip(tier_unavailable(tier, policy))
    fetch = ("import urllib.request as u, urllib.error as e\n"
             "try:\n    u.urlopen('http://{}/', timeout=30)\n"
             "except e.HTTPError as x:\n    print(x.code)\n")
    with corral.Sandbox.create(policy, timeout=120) as sb:
        proxy = sb._live.proxy
        assert proxy is not None
        for host in ("denied-one.invalid", "denied-two.invalid"):
            r = sb.commands.run(["python3", "-c", fetch.format(host)], timeout=60)
            assert r.stdout == "403\n", r
            nets = [e for e in r.events if e["kind"] == "net"]
            assert [(e["host"], e["decision"]) for e in nets] == [(host, "deny")], r.events
        assert sb._live.proxy is proxy      # one proxy for the sandbox's life
        pid = proxy.pid
    assert not os.path.exists(f"/proc/{pid}")


@_NAMESPACE
def test_destroying_a_cgroup_kills_and_removes_its_children():
    """RunCgroup.child(): a live sandbox's command cgroups go with the sandbox's, even
    with processes still in them (cgroup v1 lists only a cgroup's own processes)."""
    import subprocess

    from corral.linux import limits

    if limits.detect().version is None:
        pytest.skip("no usable cgroups")
    parent = limits.RunCgroup.create(f"t{os.getpid()}-live", memory=64 << 20, pids=32,
                                     cpus=None)
    child = parent.child("c1")
    fds = child.attach_fds()
    p = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: limits.RunCgroup.attach_self(fds))
    for fd in fds:
        os.close(fd)
    try:
        assert child.pids() == [p.pid] and parent.pids() == []
        parent.destroy()
        assert p.wait(30) == -9
        assert not any(map(os.path.exists, (*parent.paths, *child.paths)))
    finally:
        p.kill()
        p.wait()


def test_files_on_a_live_sandbox_see_its_own_tree_and_never_the_hosts(tier):
    """sb.files on a live sandbox works on its running tree (init's root): a file a command
    wrote is read back, one written from the host is seen by the next command, and a link
    planted inside to a host path resolves inside the sandbox, never on the host."""
    import secrets

    host_secret = f"/var/tmp/corral-live-files-{secrets.token_hex(4)}"
    with open(host_secret, "w") as f:
        f.write("HOST ONLY\n")
    try:
        with corral.Sandbox.create({"isolation": tier, "limits": {"timeout": "30s"}},
                                   timeout=60) as sb:
            assert sb.commands.run("echo made inside > /scratch/a").verdict == "ok"
            assert sb.files.read("/scratch/a") == "made inside\n"
            data = os.urandom(1 << 20)
            sb.files.write("/tmp/b.bin", data)
            r = sb.commands.run("sha256sum /tmp/b.bin; python3 -c \"import os; "
                                "print(os.stat('/tmp/b.bin').st_uid)\"")
            import hashlib
            assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest(), r
            assert r.stdout.split()[-1] == "0", r          # owned by the sandbox's root
            sb.commands.run(f"ln -s {host_secret} /scratch/leak; ln -s /etc/shadow /scratch/sh")
            # namespace: resolved in the sandbox's root, where neither exists; gvisor: the
            # view is the host directories behind its mounts, and a link out is refused
            from corral.runtime.files import FilesError

            for link in ("/scratch/leak", "/scratch/sh"):
                if tier == "namespace":
                    with pytest.raises(FileNotFoundError):
                        sb.files.read(link)
                else:
                    with pytest.raises(FilesError, match="leads out of its mount: refused"):
                        sb.files.read(link)
    finally:
        os.unlink(host_secret)


def test_pty_in_a_live_sandbox_is_a_command_of_it(sb):
    """sb.pty on a live sandbox: a terminal whose command runs in the sandbox's own
    namespaces (it sees the sandbox's scratch), resized, killed, its Result its screen."""
    sb.commands.run("echo from-the-sandbox > /scratch/mark")
    out = []
    term = sb.pty.create(80, 24, ["bash", "--norc", "-i"], on_data=out.append)
    assert term.pid_inside and term.pid_inside in [c.pid for c in sb.commands.list()]
    term.send_input(b"cat /scratch/mark; test -t 0 && echo tty-yes\r")
    wait_for(lambda: b"tty-yes" in b"".join(out), "the terminal's echo")
    term.resize(120, 40)
    term.send_input(b"stty size\r")
    wait_for(lambda: b"40 120" in b"".join(out), "the new size")
    term.send_input(b"exit\r")
    r = term.wait(60)
    assert r.verdict == "ok" and "from-the-sandbox" in r.stdout and r.stderr == "", r
    t2 = sb.pty.create(80, 24, "sleep 1000")
    t2.kill()
    assert t2.wait(60).verdict == "killed"
    assert sb.commands.list() == []


def test_review_mode_on_a_live_sandbox_holds_writes_until_apply(tier, tmp_path):
    """A review workspace on a live sandbox: every command's writes land in the overlay;
    the host directory is untouched until apply_changes."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("orig\n")
    # a host change just before the sandbox opens counts as made while it ran (the safe
    # side): wait until the coarse clock is well past the file's ctime (test_review.settle)
    while time.clock_gettime_ns(5) <= (ws / "a.txt").stat().st_ctime_ns + 100_000_000:
        time.sleep(0.005)
    policy = {"isolation": tier, "filesystem": {"workspace": {"path": str(ws),
                                                              "mode": "review"}}}
    if tier_unavailable(tier, policy):
        pytest.skip(tier_unavailable(tier, policy))
    with corral.Sandbox.create(policy, timeout=120) as sb:
        assert sb.commands.run("echo changed > /workspace/a.txt").verdict == "ok"
        h = sb.commands.run("echo new > /workspace/b.txt; sleep 300", background=True)
        wait_for(lambda: sb.commands.run("cat /workspace/b.txt").stdout == "new\n",
                  "the background command's write")
        assert (ws / "a.txt").read_text() == "orig\n" and not (ws / "b.txt").exists()
        assert sorted((c.path, c.kind) for c in sb.changes()) == [("a.txt", "modified"),
                                                                  ("b.txt", "added")]
        applied = sb.apply_changes()
        assert sorted(applied.applied) == ["a.txt", "b.txt"], applied
        h.kill()
    assert (ws / "a.txt").read_text() == "changed\n" and (ws / "b.txt").read_text() == "new\n"


def test_gvisor_a_signal_reaches_the_command_inside_and_runsc_exec_keeps_supervising():
    """On gvisor a command's host process is runsc exec, which forwards no signal and
    would die of one, leaving the command unsupervised: it runs in a session of its own
    (no ^C of the caller's terminal reaches it), and a signal for the command goes to it
    inside through runsc kill (CommandGroup.signal)."""
    import signal

    if tier_unavailable("gvisor"):
        pytest.skip(tier_unavailable("gvisor"))
    with corral.Sandbox.create({"isolation": "gvisor"}, timeout=60) as sb:
        got = []
        h = sb.commands.run("trap 'echo got-int' INT; echo ready; while :; do sleep 0.1; done",
                            background=True, on_stdout=got.append)
        wait_for(lambda: b"ready" in b"".join(got), "the trap set")
        assert os.getsid(h.host_pid) == h.host_pid != os.getsid(0)
        h._started.cgroup.signal(signal.SIGINT)
        wait_for(lambda: b"got-int" in b"".join(got), "the trap's output")
        assert h.running and os.path.exists(f"/proc/{h.host_pid}")
        h.kill()
        assert h.wait(30).verdict == "killed"


def test_a_sandbox_made_in_a_thread_outlives_the_thread(tier):
    """Parent-death signals (bwrap --die-with-parent, runsc's and the proxy's) fire when
    the thread that forked the child exits: a sandbox made in a pool's filler, a server's
    worker or any short-lived thread must keep running (linux/spawner.py)."""
    policy = {"isolation": tier, "network": {"mode": "allow", "allow": ["allowed.invalid"]}}
    if tier_unavailable(tier, policy):
        policy = {"isolation": tier}
    made = {}

    def make():
        made["sb"] = corral.Sandbox.create(policy, timeout=120)
        made["h"] = made["sb"].commands.run(["sleep", "300"], background=True)

    t = threading.Thread(target=make)
    t.start()
    t.join(120)
    sb = made["sb"]
    try:
        time.sleep(0.5)    # a parent-death signal would have ended it by now
        assert sb.state == "running", sb.events
        assert made["h"].running
        assert sb.commands.run("echo alive").stdout == "alive\n"
        proxy = sb._live.proxy
        if "network" in policy:
            assert proxy is not None and os.path.exists(f"/proc/{proxy.pid}")
    finally:
        sb.kill()


def test_gvisor_a_terminal_command_gets_sigwinch_through_resized():
    """gVisor reads a host terminal's new size but raises no SIGWINCH for it: the Started
    of a terminal command has resized(), which has runsc exec forward one to the
    terminal's foreground process group (the hook sb.pty's resize uses on gvisor)."""
    import fcntl
    import struct
    import termios

    if tier_unavailable("gvisor"):
        pytest.skip(tier_unavailable("gvisor"))
    with corral.Sandbox.create({"isolation": "gvisor"}, timeout=60) as sb:
        master, slave = os.openpty()
        out = []
        h = sb.commands.run("trap 'echo winch $(stty size)' WINCH; echo ready; "
                            "while :; do sleep 0.1; done", background=True, tty_fd=slave)
        os.close(slave)

        def read():
            while True:
                try:
                    data = os.read(master, 4096)
                except OSError:
                    return
                if not data:
                    return
                out.append(data)

        threading.Thread(target=read, daemon=True).start()
        wait_for(lambda: b"ready" in b"".join(out), "the trap set")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        time.sleep(0.5)
        assert b"winch" not in b"".join(out)     # gVisor raised none by itself
        h._started.resized()
        wait_for(lambda: b"winch 40 120" in b"".join(out), "the trap's output")
        h.kill()
        assert h.wait(30).verdict == "killed"
        os.close(master)


@_NAMESPACE
def test_user_account_is_a_distinct_unprivileged_uid():
    """Sandbox.create(user_account=True): commands.run(user="user") runs as uid 1000
    inside, a host uid of its own (not the sandbox root's), with /home/user its home; it
    cannot write what root made, and every process of both ids is gone after kill."""
    if os.geteuid() != 0:
        pytest.skip("a second uid in the sandbox's namespace needs corral as root")
    sb = corral.Sandbox.create({"isolation": "namespace"}, timeout=60, user_account=True)
    try:
        root_uid, user_uid = sb._live.uid, sb._live.user_uid
        assert root_uid != user_uid
        r = sb.commands.run("id -u; echo $HOME; touch /home/user/ok && echo made; "
                            "echo x >> /scratch/by-root || echo refused", user="user")
        assert r.stdout == "1000\n/home/user\nmade\nrefused\n", r.stderr
        h = sb.commands.run(["sleep", "30"], user="user", background=True)
        assert procs_of_uid(user_uid)          # a real process of that host uid
        h.kill()
        assert sb.commands.run("id -u").stdout == "0\n"            # root stays the default
        with pytest.raises(UsageError, match="user"):
            sb.commands.run("true", user="admin")
    finally:
        sb.kill()
    # nothing of either uid runs; a zombie may wait a moment for its reaper
    assert running(procs_of_uid(user_uid) + procs_of_uid(root_uid)) == []
    wait_for(lambda: not procs_of_uid(user_uid) + procs_of_uid(root_uid),
              "the zombies to be reaped")
    plain = corral.Sandbox.create({"isolation": "namespace"}, timeout=60)
    try:
        with pytest.raises(UsageError, match="no unprivileged account"):
            plain.commands.run("true", user="user")
    finally:
        plain.kill()


def test_user_account_refused_off_the_namespace_tier():
    why = tier_unavailable("gvisor")
    if why is not None:
        pytest.skip(why)
    from corral.errors import UnsupportedRule

    with pytest.raises(UnsupportedRule, match='isolation = "namespace"'):
        corral.Sandbox.create({"isolation": "gvisor"}, timeout=60, user_account=True)



@_NAMESPACE
def test_commands_whose_status_nobody_took_do_not_stall_the_next():
    """A command whose supervision ended early (here its on_stdout raised) leaves its wait
    status unread on the zygote's status socket. Some hundreds of them filled that socket
    and the zygote blocked in its send, so no entrant could be forked again for any live
    sandbox of this process: the next command hung for good."""
    s = corral.Sandbox.create({"isolation": "namespace"}, timeout=600)
    got: list = []

    def boom(_data):
        raise RuntimeError("the caller's callback failed")

    try:
        for _ in range(320):
            with pytest.raises(RuntimeError):
                s.commands.run(["/bin/sh", "-c", "echo x; exec sleep 0.02"], on_stdout=boom,
                               timeout=60)

        t = threading.Thread(target=lambda: got.append(s.exec(["/bin/echo", "still"])),
                             daemon=True)
        t.start()
        t.join(60)
        assert got and got[0].stdout.strip() == "still", "the next command never started"
    finally:
        if got:
            s.kill()
