"""The microvm tier with real QEMU boots (TCG here: /dev/kvm is a nested PVM that the KVM
probe finds unusable), on the suite's cached trixie image (imagefix.py).

Boots cost seconds under TCG, so the boot tests are marked slow and share one sandbox for
what can be checked in one guest; the refusals and the frame parser need no boot."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import CORRAL, ROOT
from imagefix import corral_in
from vmfix import children, is_qemu, microvm_unusable

import corral
from corral.backends import AUTO_ORDER
from corral.backends.microvm import FrameReader, frame, parse_exit
from corral.errors import UnsupportedRule

pytestmark = pytest.mark.timeout(600)


def policy(name, **limits):
    return {"isolation": "microvm", "image": name, "limits": limits}


# -- no boot: refusals, auto, explain, the frame parser -------------------------------------

def test_the_host_root_is_refused_in_one_line():
    if microvm_unusable():
        pytest.skip(microvm_unusable())
    p = subprocess.run([CORRAL, "run", "--isolation", "microvm", "--", "true"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("corral: image: the microvm tier cannot enforce it")
    assert "boots an image, not the host's /usr" in p.stderr and 'image = "NAME"' in p.stderr
    assert 'isolation = "namespace" could' in p.stderr


def test_what_it_cannot_do_yet_is_refused_naming_a_tier_that_could(vm_store, tmp_path):
    state, name = vm_store
    for extra in (["--ro-bind", str(tmp_path)], ["--tty"]):
        p = corral_in(state, "run", "--isolation", "microvm", "--image", name, *extra,
                      "--", "true", check=False)
        assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
        assert 'isolation = "namespace"' in p.stderr, p.stderr
    with pytest.raises(UnsupportedRule):
        corral.run(["true"], {**policy(name), "filesystem": {"ro_binds": ["/usr/share/doc"]}})


def test_auto_never_picks_it_and_explain_says_own_kernel(vm_store):
    state, name = vm_store
    assert "microvm" not in AUTO_ORDER
    d = json.loads(corral_in(state, "explain", "--isolation", "microvm", "--image", name,
                             "--json").stdout)
    assert d["runs"] and d["own_kernel"] is True
    assert ("emulated by QEMU's TCG" in d["kernel_note"]
            or "accelerated by KVM" in d["kernel_note"]), d["kernel_note"]
    assert "restored from a warm snapshot" in d["kernel_note"]
    text = corral_in(state, "explain", "--isolation", "microvm", "--image", name).stdout
    assert "1. its own kernel? yes; Debian's cloud kernel" in text


def test_frames_from_the_guest_are_parsed_strictly():
    r = FrameReader(b"OEX")
    assert r.feed(frame(b"O", b"hi") + frame(b"X", b'{"code": 0, "signal": null, '
                                              b'"cpu": 0.5, "oom": 0, "full": 0}')[:3]) == [(b"O", b"hi")]
    assert r.feed(b"") == [] and len(r.buf) == 3
    with pytest.raises(ValueError):   # an unknown type
        FrameReader(b"OEX").feed(frame(b"R", b"{}"))
    with pytest.raises(ValueError):   # a length past the bound, before its bytes arrive
        FrameReader(b"OEX").feed(b"O" + (1 << 20).to_bytes(4, "big"))
    assert parse_exit(b'{"code": 3, "signal": null, "cpu": 0.1, "oom": 0, "full": 0}')["code"] == 3
    for bad in (b'{"code": 3, "signal": 9, "cpu": 0, "oom": 0, "full": 0}',
                b'{"code": 300, "signal": null, "cpu": 0, "oom": 0, "full": 0}',
                b'{"code": null, "signal": null, "cpu": 0, "oom": 0, "full": 0}', b'[]',
                b'{"code": 0, "signal": null, "cpu": 0, "oom": 0, "full": 0, "x": 1}',
                b'{"code": true, "signal": null, "cpu": 0, "oom": 0, "full": 0}',
                b'{"code": 0, "signal": null, "cpu": 0, "oom": -1, "full": 0}',
                b'{"code": 0, "signal": null, "cpu": 0, "oom": 0, "full": 4}',
                b'{"code": 0, "signal": null, "cpu": 0, "oom": 0}', b"\xff"):
        with pytest.raises(ValueError):
            parse_exit(bad)


# -- real boots ------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_command_in_a_vm_of_its_own(vm_store):
    state, name = vm_store
    with open("/etc/os-release") as f:
        host = f.readline().strip()
    with corral.Sandbox(policy(name, timeout="60s", cpu_time="3s", output="64KiB",
                               scratch="16MiB")) as sb:
        r = sb.exec(["sh", "-c", "head -1 /etc/os-release; echo oops >&2; exit 7"])
        assert r.isolation == "microvm"
        assert (r.verdict, r.exit_code) == ("error", 7), r
        assert r.stdout == 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\n' != host + "\n"
        assert r.stderr == "oops\n"
        # the guest's kernel, not the host's; the root is read-only; /scratch is writable
        r = sb.exec(["sh", "-c", "uname -r; touch /usr/x 2>/dev/null && echo WROTE || "
                     "echo ro; echo hi > /scratch/f && cat /scratch/f; id -u"])
        assert r.stdout.split() == ["6.1.0-57-cloud-amd64", "ro", "hi", "1000"], r
        assert os.uname().release != "6.1.0-57-cloud-amd64"
        # wall clock: the command is killed, the sandbox lives on
        # (a child in a session of its own holding stdout open is killed too)
        r = sb.exec(["sh", "-c", "setsid sleep 30 & sleep 30"], timeout=2)
        assert r.verdict == "timeout" and r.exit_code is None
        assert any(e.get("limit") == "timeout" for e in r.events), r.events
        # CPU time: the guest kernel's RLIMIT_CPU
        r = sb.exec(["python3", "-c", "while True: pass"])
        assert r.verdict == "timeout", r
        assert any(e.get("limit") == "cpu_time" for e in r.events), r.events
        # output past the cap is dropped, with the limit event
        r = sb.exec(["sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x"])
        assert r.verdict == "ok" and r.stdout_truncated and len(r.stdout) == 64 << 10
        assert any(e.get("limit") == "output" for e in r.events), r.events
        # no network device at all, only loopback
        assert sb.exec(["ls", "/sys/class/net"]).stdout.split() == ["lo"]
        # the scratch cap: ENOSPC, and the limit event
        r = sb.exec(["sh", "-c", "head -c 32000000 /dev/zero > /scratch/big"])
        assert r.verdict == "error" and "No space left" in r.stderr, r
        assert any(e.get("limit") == "scratch" for e in r.events), r.events
        sb.exec(["rm", "/scratch/big"])
        # nothing a command starts outlives it, even in a session of its own
        r = sb.exec(["python3", "-c", "import subprocess as s; s.Popen(['sleep', '1000'], "
                     "start_new_session=True, stdout=s.DEVNULL, stderr=s.DEVNULL); "
                     "print('started')"])
        assert r.stdout == "started\n", r
        r = sb.exec(["python3", "-c", "import os; print(sum(open(f'/proc/{p}/comm').read() "
                     "== 'sleep\\n' for p in os.listdir('/proc') if p.isdigit()))"])
        assert r.stdout == "0\n", r
        assert sb.exec(["echo", "alive"]).stdout == "alive\n"


@pytest.mark.slow
def test_stdin_run_code_and_one_command_at_a_time(vm_store):
    state, name = vm_store
    with corral.Sandbox(policy(name)) as sb:
        r = sb.exec(["sh", "-c", "wc -c"], stdin=b"x" * 200000)
        assert (r.verdict, r.stdout) == ("ok", "200000\n"), r
        ex = sb.run_code("x = 6 * 7\nprint(x)")
        assert ex.error is None and ex.logs.stdout == ["42\n"], ex
        # the context's interpreter holds the one command slot: a second is refused in
        # one line, and the guest lives on
        with pytest.raises(corral.BackendUnavailable, match="one command at a time"):
            sb.exec(["true"])
        assert sb.run_code("print(x + 1)").logs.stdout == ["43\n"]


@pytest.mark.slow
def test_memory_gives_oom_and_a_guest_that_stops_answering_is_killed(vm_store):
    from corral.errors import SandboxSetupError

    state, name = vm_store
    with corral.Sandbox(policy(name, memory="256MiB", timeout="60s")) as sb:
        r = sb.exec(["python3", "-c", "b = b'x' * (1 << 30); print('survived')"])
        assert r.verdict == "oom" and "survived" not in r.stdout, r
        assert any(e.get("limit") == "memory" for e in r.events), r.events
        (qemu,) = [p for p in children(os.getpid()) if is_qemu(p)]
        os.kill(qemu, signal.SIGSTOP)   # the guest stops answering, even to a kill
        r = sb.exec(["sleep", "30"], timeout=2)
        assert r.verdict == "timeout", r
        assert not is_qemu(qemu) or open(f"/proc/{qemu}/stat").read().split()[2] == "Z"
        with pytest.raises(SandboxSetupError, match="gone"):
            sb.exec(["true"])


@pytest.mark.slow
def test_sandboxes_restored_from_one_snapshot_get_different_random_bytes_and_identity(
        vm_store):
    state, name = vm_store
    code = ("import os, random, socket; print(open('/dev/urandom', 'rb').read(16).hex(), "
            "os.urandom(16).hex(), random.getrandbits(64), socket.gethostname(), "
            "open('/etc/machine-id').read().strip())")
    outs = []
    for _ in range(2):
        with corral.Sandbox(policy(name)) as sb:
            sb.open()
            assert sb._live.mode == "restore"   # from the warm template, not a boot
            r = sb.exec(["python3", "-c", code])
            assert r.verdict == "ok", r
            outs.append(r.stdout.split())
            # the host's wall clock, not the template's (saved when it was made)
            r = sb.exec(["python3", "-c", "import time; print(time.time())"])
            assert abs(float(r.stdout) - time.time()) < 10, r.stdout
    # random bytes, and a fresh identity: hostname and /etc/machine-id differ too
    assert len(outs[0]) == 5 and all(a != b for a, b in zip(*outs)), outs
    for out in outs:
        assert out[3].startswith("corral-") and len(out[4]) == 32, out
        assert out[4] != "0" * 32    # not the template's


@pytest.mark.slow
def test_killing_the_supervisor_leaves_no_qemu(vm_store):
    state, name = vm_store
    code = ("import corral, sys\n"
            f"sb = corral.Sandbox({policy(name, timeout='300s')!r}).open()\n"
            "print('up', flush=True)\n"
            "sb.exec(['sleep', '300'])\n")
    sup = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
    try:
        assert sup.stdout.readline() == b"up\n"
        (qemu,) = [p for p in children(sup.pid) if is_qemu(p)]
        assert os.stat(f"/proc/{qemu}").st_uid >= 1_500_000_000   # its own uid, not root
        with open(f"/proc/{qemu}/cgroup") as f:   # the run's cgroup, recorded in its run dir
            cgs = [line.strip().split(":", 2)[2] for line in f if "-mvm" in line]
        assert cgs, "QEMU is not in a run cgroup of its own"
        # a stopped QEMU cannot notice its control channel's end: only the kernel's
        # parent-death signal (SIGKILL) ends it
        os.kill(qemu, signal.SIGSTOP)
        sup.send_signal(signal.SIGKILL)
        sup.wait()
        for _ in range(200):   # bounded wait for the kernel to deliver PDEATHSIG
            if not is_qemu(qemu):
                break
            time.sleep(0.05)
        assert not is_qemu(qemu), f"QEMU {qemu} outlived its supervisor"
        # the dead supervisor's cgroup is left; the next start's sweep removes it
        from corral.linux.rundir import sweep_stale

        def left():
            return [c for c in cgs for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory",
                                                "/sys/fs/cgroup/unified")
                    if os.path.isdir(root + c)]
        assert left()
        sweep_stale()
        assert not left()
    finally:
        if "qemu" in locals() and is_qemu(qemu):
            os.kill(qemu, signal.SIGKILL)
        sup.kill()
        sup.wait()
        sup.stdout.close()


@pytest.mark.slow
def test_a_read_only_workspace_is_copied_in(vm_store, tmp_path):
    state, name = vm_store
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("hello ws\n")
    (ws / "sub" / "b").write_text("private\n")
    (ws / "sub" / "b").chmod(0o600)
    os.symlink("a.txt", ws / "link")          # inside: copied as a link
    os.symlink("/etc/passwd", ws / "out")     # leading out: left out, with a notice
    pol = {**policy(name), "filesystem": {"workspace": {"path": str(ws), "mode": "ro"}}}
    with corral.Sandbox(pol) as sb:
        r = sb.exec(["sh", "-c", "pwd; cat a.txt link sub/b; ls; echo x > new || echo ro; "
                     "touch a.txt || echo ro"])
        assert r.stdout.split() == ["/workspace", "hello", "ws", "hello", "ws", "private",
                                    "a.txt", "link", "sub", "ro", "ro"], r
        assert "Read-only file system" in r.stderr, r
        assert any(e["kind"] == "notice" and "1 entries" in e["message"] for e in r.events)
    assert sorted(os.listdir(ws)) == ["a.txt", "link", "out", "sub"]   # the host's: as it was
    for mode in ("rw", "review"):
        with pytest.raises(UnsupportedRule, match="copies a workspace in read-only"):
            corral.run(["true"], {**pol, "filesystem": {"workspace": {"path": str(ws),
                                                                      "mode": mode}}})


@pytest.mark.slow
def test_the_probe_runs_on_microvm_and_its_claims_hold(vm_store):
    state, name = vm_store
    cases = ["fs.ssh-key", "kernel.no-new-privs", "net.direct-tcp", "dos.proxy-huge-header",
             "term.escape-sequences"]
    p = corral_in(state, "probe", "--isolation", "microvm", "--image", name, "--json",
                  *(a for c in cases for a in ("--case", c)), check=False, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    cells = {c["id"]: c for c in json.loads(p.stdout)["cases"]}
    assert set(cells) == set(cases)
    for cid in cases[:4]:
        assert cells[cid]["status"] == "contained" and cells[cid]["expected"], cells[cid]
    c = cells["term.escape-sequences"]
    assert c["status"] == "unsupported" and "terminal" in c["reason"], c
    # without an image it is refused in one line
    p = corral_in(state, "probe", "--isolation", "microvm", check=False)
    assert p.returncode == 2 and "needs --image NAME" in p.stderr, p.stderr


@pytest.mark.slow
def test_a_guest_that_floods_its_console_is_ended_with_an_event(vm_store, monkeypatch):
    """The guest kernel's OOM report is written to its console (an error-level message);
    with the console's bound lowered to a few bytes, that is a flood: the VM is ended."""
    from corral.backends import microvm
    from corral.errors import SandboxSetupError

    state, name = vm_store
    with corral.Sandbox(policy(name, memory="256MiB", timeout="60s")) as sb:
        sb.open()
        monkeypatch.setattr(microvm, "CONSOLE_MAX", 16)
        r = sb.exec(["python3", "-c", "b = b'x' * (1 << 30)"])
        assert r.verdict in ("oom", "killed"), r
        assert any(e["kind"] == "teardown" and "more than 16 bytes to its console"
                   in e["message"] for e in r.events), r.events
        with pytest.raises(SandboxSetupError, match="gone"):
            sb.exec(["true"])

