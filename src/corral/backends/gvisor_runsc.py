"""runsc seen from the supervisor: the user namespace that gives each sandbox's Sentry a host
uid of its own, runsc's own failures (read from its log, never from the command's
stderr), the orphans it leaves to reap, and its state to delete at close."""

from __future__ import annotations

import json
import os
import time

from ..events import TeardownEvent
from ..linux._sys import mount
from ..linux.supervise import (
    ExecFailed,
    errno_from_message,
)

#: runsc exits 128 when it fails itself (util.Fatalf), before or while starting the command
RUNSC_FAILED = 128
#: how runsc's own failure of `runsc run` starts, on its stderr (the command's) and in its log
RUNSC_FAILED_PREFIX = b"running container: "
#: the most of runsc's log (--log, per exec) that is read back
LOG_MAX = 1 << 16


def runsc_error(log: str) -> str | None:
    """The last error runsc logged for `runsc run` (--log-format=json: one object per
    entry, {"msg": ..., "level": "error", ...}), or None: runsc's own, structured word that
    it failed, apart from the command's stderr (a command may print anything and exit 128
    itself). runsc's log is written outside the sandbox; still bounded and parsed strictly."""
    try:
        with open(log, "rb") as f:
            text = f.read(LOG_MAX).decode(errors="replace")
    except FileNotFoundError:
        return None
    decoder = json.JSONDecoder()
    found, at = None, 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return found
        try:
            entry, at = decoder.raw_decode(text, at)
        except ValueError:
            return found   # cut short at LOG_MAX
        if (isinstance(entry, dict) and entry.get("level") == "error"
                and isinstance(entry.get("msg"), str)
                and entry["msg"].startswith(RUNSC_FAILED_PREFIX.decode())):
            found = entry["msg"]


def _exec_failure(error: str, name: str) -> tuple[str, ExecFailed] | None:
    """(name, ExecFailed) when runsc's error is that it could not start the command: not
    found in PATH (`error finding executable "NAME" in PATH [...]: no such file or
    directory`) or not loadable (`creating process: failed to load PATH: permission
    denied`); None for any other failure of runsc's."""
    if ("starting sandbox: error finding executable " not in error
            and "creating process: failed to load " not in error):
        return None
    errno = errno_from_message(error)
    return (name, ExecFailed(errno)) if errno else None


#: the uid runsc 20221219 gives its Sentry (in a user namespace of the Sentry's own that
#: maps it to the same id one level up: runsc's namespace)
RUNSC_NOBODY = 65534


CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000


MS_REC, MS_SLAVE = 0x4000, 1 << 19


def runsc_userns(uid: int, sentry_uid: int) -> int:
    """The user namespace runsc runs in (an fd of it, kept for the sandbox's life), so that
    its Sentry has a host uid of its own: runsc 20221219 always runs the Sentry as uid
    65534 of runsc's own namespace, which here is `sentry_uid` on the host, not the host's
    nobody shared by every sandbox. Nothing else is mapped but root (runsc itself: host
    root, with capabilities only over this namespace and those it makes) and the run's uid
    (the gofer's, container root in the spec's user namespace, one level down)."""
    from ..linux.idmap import userns

    pairs = [(0, 0), (uid, uid), (RUNSC_NOBODY, sentry_uid)]
    return userns(pairs, pairs)


def enter_userns(fd: int) -> None:
    """For the runsc process only (between fork and exec): join the sandbox's user
    namespace, then a mount namespace owned by it (runsc mounts its chroot there; a slave
    of ours, so nothing reaches the host's mounts). A network namespace runsc joins must be
    owned by that user namespace too (gvisor_net.ProxyNet.create(owner=...))."""
    from ..linux._sys import _libc

    for call, args, what in ((_libc.setns, (fd, CLONE_NEWUSER), "setns user namespace"),
                             (_libc.unshare, (CLONE_NEWNS,), "unshare mount namespace")):
        if call(*args) != 0:
            import ctypes

            e = ctypes.get_errno()
            raise OSError(e, f"{what}: {os.strerror(e)}")
    mount("none", "/", "", MS_REC | MS_SLAVE, "")


def _reap(pids: set[int], timeout: float = 1.0) -> None:
    """Reap those of `pids` that are (or become, as orphans of runsc) our zombie children;
    others are not ours (a process that exited with its parent alive was reaped there)."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left:
        for p in list(left):
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                done = -1
            if done:
                left.discard(p)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.002)
    # a process born after the last sample (a ptrace stub, say) that runsc's exit orphaned:
    # it is in the session of one of the run's processes
    for child, state, session in _children():
        if state == "Z" and session in pids:
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass


def reap_strays(uids: set[int]) -> int:
    """Reap our zombie children that are runsc's own processes (it re-executes itself, so
    each is named "exe") running as one of `uids` (a sandbox's): a gofer or Sentry that a
    kill orphaned after _reap stopped waiting (under load, a killed process can take longer
    than its second to die). Called at each exec and at close, so strays of one exec are
    reaped by the next or by the sandbox's end. The supervised runsc itself and the egress
    proxy are never named "exe": their own waits are untouched. Returns how many."""
    n = 0
    for child, state, _ in _children():
        if state != "Z":
            continue
        try:
            with open(f"/proc/{child}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if st.get("Name", "").strip() != "exe" or \
                int(st.get("Uid", "-1").split()[0]) not in uids:
            continue
        try:
            if os.waitpid(child, os.WNOHANG)[0]:
                n += 1
        except ChildProcessError:
            pass
    return n


def _children() -> list[tuple[int, str, int]]:
    """(pid, state, session) of this process's children (every thread's)."""
    out = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                kids = f.read().split()
        except OSError:
            continue
        for k in kids:
            try:
                with open(f"/proc/{k}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out.append((int(k), fields[0], int(fields[3])))
    return out


def _is_of(name: str, cid: str) -> bool:
    """Whether a file of a runsc state dir ("<sandbox>_sandbox:<container>.state", .lock,
    ...) belongs to container `cid`."""
    return name.startswith(f"{cid}_sandbox:") or name.partition(":")[2].startswith(f"{cid}.")


def delete_container(runsc: str, state: str, cid: str) -> list[dict]:
    """`runsc delete --force`: kill what is left of the container and drop its state."""
    import subprocess

    try:
        p = subprocess.run([runsc, f"--root={state}", "delete", "--force", cid],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return [TeardownEvent(f"runsc delete {cid} failed: {e}").to_dict()]
    if p.returncode:
        msg = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return [TeardownEvent(f"runsc delete {cid} failed: {msg[0]}").to_dict()]
    return []


def remove_state(state: str, cid: str) -> list[dict]:
    events = []
    for n in os.listdir(state):
        if _is_of(n, cid):
            p = os.path.join(state, n)
            try:
                if os.path.isdir(p) and not os.path.islink(p):
                    import shutil

                    shutil.rmtree(p)
                else:
                    os.unlink(p)
            except OSError as e:
                events.append(TeardownEvent(f"remove {p}: {e.strerror}").to_dict())
    return events
