"""The microvm tier's warm template: boot a guest once per machine (image, kernel,
initramfs, RAM, vCPUs, scratch size, accelerator), save the booted, idle guest with QEMU's
migration to a file, and start each sandbox by restoring a fresh QEMU from that file. A
running VM is never reused across sandboxes: each restore is a new QEMU process, uid and
cgroup (backends/microvm.py), and the restored guest is reseeded with fresh host entropy
(the agent's S frame) before it answers ready.

The template runs no user code and holds no secret: it is the state of a guest just
booted, whose agent waits for its first frame. Files: <state>/microvm/snaps/<key>.vmstate,
written by corral under a temporary name and renamed, world-readable (QEMU reads it as
its own uid through an inherited descriptor).

QMP (QEMU's monitor protocol) is used on the template only, over a socketpair: stop, getfd
(the state file's descriptor, passed with SCM_RIGHTS), migrate to it, poll until done.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time

from ..errors import SandboxSetupError

QMP_LINE_MAX = 1 << 16
SAVE_TIMEOUT = 120.0
#: templates kept (the newest by modification time); older ones (other memory sizes,
#: images, or an initramfs since rebuilt) are removed when a new one is written
KEEP = 8


def snap_path(key: tuple) -> str:
    from .microvm_assets import state_root

    h = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    return os.path.join(state_root(), "snaps", f"{h}.vmstate")


class _Qmp:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _line(self, deadline: float) -> dict:
        while b"\n" not in self.buf:
            if len(self.buf) > QMP_LINE_MAX:
                raise SandboxSetupError("QEMU's monitor sent an over-long line",
                                        step="microvm snapshot")
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise SandboxSetupError("QEMU's monitor did not answer",
                                        step="microvm snapshot") from None
            if not chunk:
                raise SandboxSetupError("QEMU's monitor closed", step="microvm snapshot")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise SandboxSetupError("QEMU's monitor sent a non-object", step="microvm snapshot")
        return msg

    def reply(self, deadline: float) -> dict:
        while True:
            msg = self._line(deadline)
            if "event" in msg:
                continue
            if "error" in msg:
                raise SandboxSetupError(f"QEMU's monitor: {str(msg['error'])[:200]}",
                                        step="microvm snapshot")
            if "return" in msg:
                return msg["return"]

    def cmd(self, execute: str, deadline: float, fds: list[int] | None = None, **args):
        data = json.dumps({"execute": execute, **({"arguments": args} if args else {})})
        if fds:
            socket.send_fds(self.sock, [data.encode() + b"\n"], fds)
        else:
            self.sock.sendall(data.encode() + b"\n")
        return self.reply(deadline)


def save(vm, path: str) -> None:
    """Save the booted template `vm` (a MicrovmSandbox in mode "template") to `path`."""
    deadline = time.monotonic() + SAVE_TIMEOUT
    q = _Qmp(vm.qmp)
    greeting = q._line(deadline)
    if "QMP" not in greeting:
        raise SandboxSetupError("QEMU's monitor did not greet", step="microvm snapshot")
    q.cmd("qmp_capabilities", deadline)
    # not stopped first: the saved run state is then "running", so a restored QEMU runs
    # the guest as soon as the state is loaded (a stopped source restores paused); the
    # idle guest's migration converges at once and ends with the source stopped
    d = os.path.dirname(path)
    os.makedirs(d, 0o755, exist_ok=True)
    tmp = os.path.join(d, f".tmp-{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            q.cmd("getfd", deadline, fds=[fd], fdname="snap")
        finally:
            os.close(fd)
        q.cmd("migrate", deadline, uri="fd:snap")
        while True:
            st = q.cmd("query-migrate", deadline).get("status")
            if st == "completed":
                break
            if st in ("failed", "cancelled"):
                raise SandboxSetupError(f"saving the microvm template {st}",
                                        step="microvm snapshot")
            if time.monotonic() > deadline:
                raise SandboxSetupError("saving the microvm template timed out",
                                        step="microvm snapshot")
            time.sleep(0.05)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        _prune(d, keep=path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _prune(d: str, keep: str) -> None:
    try:
        old = sorted((e for e in os.scandir(d) if e.name.endswith(".vmstate")
                      and e.is_file(follow_symlinks=False) and e.path != keep),
                     key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)
    except OSError:
        return
    for e in old[KEEP - 1:]:
        try:
            os.unlink(e.path)   # a restore that has it open keeps reading it
        except OSError:
            pass


def template(plan, check, sandbox_cls, path: str) -> None:
    """Make the snapshot at `path` for this plan's machine: one cold boot, saved."""
    vm = sandbox_cls(plan, check, mode="template")
    try:
        save(vm, path)
    finally:
        vm.close()
