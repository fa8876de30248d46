"""The microvm tier: each sandbox is a virtual machine of its own, with its own kernel.

QEMU (q35; KVM where a probe boot shows it works, else TCG emulation) boots Debian's pinned
cloud kernel (backends/microvm_assets.py) with an initramfs that mounts the image's tree,
as a read-only squashfs on virtio-blk, and runs corral's agent (guest/microvm_agent.py)
with the image's python3. The agent's one peer is the host, over a virtio-serial port;
nothing of the host's file system is shared with the guest.

Around QEMU, on the host: an unprivileged uid of its own (a fresh one per sandbox), no
supplementary groups, its own session, a cgroup (memory: the guest's RAM plus
QEMU_OVERHEAD; the policy's CPUs as a quota; a pids cap), QEMU's seccomp sandbox
(`-sandbox on` denying obsolete calls, privilege changes, spawning and resource control),
`-nodefaults -no-user-config`, no network device at all, and PR_SET_PDEATHSIG so that QEMU
dies with its supervisor. network.mode = "allow" adds no device either: the guest's
connections to 127.0.0.1:3128 are relayed over a second virtio-serial port to the egress
proxy and nothing else (backends/microvm_net.py). Its files reach it as open descriptors (/proc/self/fd/N), so
its uid needs no access to corral's state directory.

The host treats the guest as hostile: frames are bounded (MAX_FRAME) and typed, anything
else ends the VM; output past the policy's cap is read and dropped; the wall clock is the
host's (a K frame, then the VM is killed if the agent does not answer); CPU time is the
guest kernel's RLIMIT_CPU on the command, reported back and checked against the limit.

Each sandbox gets a fresh identity (hostname, /etc/machine-id) and fresh entropy before
its first command. Live sandboxes: backends/microvm_live.py.

A read-only workspace is copied in (backends/microvm_ws.py). Not built yet (refused,
naming a tier that could): a writable or review workspace and ro_binds (no host directory
is shared), layered images, a terminal. See docs/tiers.md.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import threading
import time

from ..errors import BackendUnavailable, SandboxSetupError, UnsupportedRule
from ..events import LimitEvent
from ..plan import (
    SCRATCH,
    CpuQuota,
    CpuTime,
    EgressProxy,
    Environment,
    ImageRoot,
    MemoryLimit,
    Namespaces,
    NoNetwork,
    Op,
    OutputCap,
    PidsLimit,
    Plan,
    ReadOnlyBind,
    Rlimit,
    Scratch,
    Seccomp,
    SystemRoot,
    WallClock,
    WorkspaceMount,
)
from ..result import Result, Usage
from . import microvm_assets as assets
from .base import Backend, Gap, LiveSandbox, TierCheck, assert_never

MAX_FRAME = 65536
#: QEMU's own memory beside the guest's RAM (its code, TCG's translation cache, capped at
#: TB_SIZE_MB, device state): the cgroup's limit is the guest's plus this
QEMU_OVERHEAD = 256 << 20
TB_SIZE_MB = 64
#: the guest's RAM at least this (the kernel and the agent's python need it)
MIN_RAM = 128 << 20
#: how long a boot may take to the agent's ready frame (TCG on a loaded host: seconds)
BOOT_TIMEOUT = 120.0
#: after a K frame, how long the agent has to report the end before the VM is killed
KILL_GRACE = 3.0
#: how long the guest has to take a frame we send it: past it (it stopped reading its
#: control port) the VM is ended, so no host thread blocks on it forever
SEND_TIMEOUT = 30.0
CONSOLE_TAIL = 16384
#: threads and processes of QEMU itself (vCPU threads, I/O workers)
QEMU_PIDS = 64
#: the egress proxy's memory beside QEMU's, in the same cgroup (network allow)
PROXY_OVERHEAD = 128 << 20
#: the guest's console (kernel messages) over a sandbox's life: past it the VM is ended
CONSOLE_MAX = 8 << 20

_CANNOT = {
    "host": "the microvm tier boots an image, not the host's /usr: set image = \"NAME\" "
            "(corral image build / pull), or use isolation = \"namespace\" for image = "
            "\"host\"",
    "bind": "the microvm tier shares no host directory with its guest yet; use isolation = "
            "\"namespace\" for filesystem.ro_binds",
    "layers": "the microvm tier boots an image's base tree only, not layers over it yet; use "
              "isolation = \"namespace\" for a layered image",
    "seccomp": "the guest's commands run under the guest's own kernel without a seccomp "
               "filter (the VM boundary stands in for it; QEMU itself runs under -sandbox "
               "on)",
}


def _accel() -> tuple[str, str]:
    """("kvm" or "tcg", why), from the cached KVM probe."""
    try:
        ok, why = assets.kvm_usable()
    except (OSError, BackendUnavailable) as e:
        return "tcg", f"KVM probe not run: {e}"
    return ("kvm" if ok else "tcg"), why


class MicrovmBackend(Backend):
    name = "microvm"
    mechanism = ("QEMU virtual machine (q35; KVM where usable, else TCG emulation) with its "
                 "own guest kernel; QEMU as an unprivileged uid in a cgroup under its "
                 "seccomp sandbox")
    own_kernel = True
    properties = {"own_kernel": True, "pid_isolation": True, "host_fs_hidden": True,
                  "no_host_root": True, "network_namespace": True, "read_only_root": True}

    @property
    def kernel_note(self) -> str:
        accel, why = _accel()
        how = ("accelerated by KVM" if accel == "kvm" else
               "emulated by QEMU's TCG (no usable KVM: " + why + ")")
        return (f"Debian's cloud kernel {assets.KERNEL_RELEASE} in a virtual machine, "
                f"{how}; a guest-kernel exploit lands in QEMU's process (its own uid, "
                f"cgroup and seccomp sandbox), not on the host kernel directly" + (
                    "; each sandbox is a fresh QEMU restored from a warm snapshot of a "
                    "booted guest (one per image, kernel and memory size), reseeded with "
                    "fresh host entropy and given a hostname and machine-id of its own "
                    "before it runs anything" if self.warm else
                    "; each sandbox is a cold boot"))

    @property
    def egress_note(self) -> str:
        return ("only through the egress proxy at http://127.0.0.1:3128 inside the guest "
                "(HTTP_PROXY), a relay over a virtio-serial port that the host connects to "
                "the proxy and nothing else; the guest has no network device, route or "
                "resolver")

    def __init__(self, warm: bool = True) -> None:
        """`warm`: start sandboxes from the warm template (backends/microvm_snap.py);
        False: a cold boot each (for benches and tests of the boot itself)."""
        self.warm = warm

    def auto_skip(self) -> str | None:
        return "isolation = \"auto\" never picks microvm; ask for it by name"

    def _require(self) -> None:
        for path, pkg in ((assets.QEMU, "qemu-system-x86"), (assets.BUSYBOX, "busybox-static"),
                          (assets.MKSQUASHFS, "squashfs-tools")):
            if not os.path.isfile(path):
                raise BackendUnavailable(f"the microvm tier needs {path} ({pkg}); run "
                                         f"scripts/setup.sh", field="isolation")
        assets.kernel_files()
        if os.geteuid() != 0:
            raise BackendUnavailable("the microvm tier runs QEMU as a uid of its own, which "
                                     "needs corral to run as root", field="isolation")

    def describe(self, op: Op) -> tuple[str, str]:
        match op:
            case Namespaces():
                return "kernel", ("a virtual machine with its own kernel; the command runs "
                                  "as uid 1000 inside it; QEMU runs on the host as a fresh "
                                  "unprivileged uid, in its own session and cgroup")
            case SystemRoot():
                return "none", _CANNOT["host"]
            case ImageRoot():
                return "kernel", ("the image's tree as a read-only squashfs on virtio-blk "
                                  "(QEMU opens it read-only), mounted by the guest kernel")
            case Seccomp():
                return "none", _CANNOT["seccomp"]
            case Scratch():
                return "kernel", ("a tmpfs of the guest kernel at /scratch (and /tmp in "
                                  "it), capped in size and inodes: ENOSPC past the cap")
            case WorkspaceMount():
                return "kernel", ("copied in at the start (a tar over the control channel, "
                                  "read on the host without following links) to a tmpfs "
                                  "the guest kernel then holds read-only; no host "
                                  "directory is shared, and changes on the host after the "
                                  "start are not seen")
            case ReadOnlyBind():
                return "none", _CANNOT["bind"]
            case Environment():
                return "supervisor", "the command's env is only what the policy sets"
            case MemoryLimit():
                return "kernel", ("the guest's RAM is the limit; QEMU's host cgroup caps it "
                                  f"at the limit + {QEMU_OVERHEAD >> 20} MiB")
            case CpuTime():
                return "kernel", ("RLIMIT_CPU on the command in the guest kernel; the "
                                  "host's wall clock as the backstop")
            case WallClock():
                return "supervisor", ("the host kills the command (and the VM if the agent "
                                      "does not answer) at the limit")
            case CpuQuota():
                return "kernel", "vCPUs and the cpu cgroup (CFS quota) of QEMU's process"
            case PidsLimit():
                return "kernel", "RLIMIT_NPROC for the command's uid in the guest kernel"
            case OutputCap():
                return "supervisor", "bytes past the cap are read and dropped by the host"
            case Rlimit():
                return "kernel", f"RLIMIT_{op.name.upper()} on the command in the guest"
            case NoNetwork():
                return "kernel", "QEMU gets no network device at all (-nodefaults, no -nic)"
            case EgressProxy():
                return "proxy", ("egress proxy at 127.0.0.1:3128 inside (HTTP_PROXY): the "
                                 "guest agent relays each connection over a virtio-serial "
                                 "port to the host, which connects it to the proxy only; "
                                 "no network device, route or resolver in the guest")
            case _:
                assert_never(op)

    def check(self, plan: Plan) -> TierCheck:
        self._require()
        missing: list[tuple[Op, str]] = []
        for op in plan.ops:
            match op:
                case SystemRoot():
                    pass   # refused below, whether the policy named "host" or not
                case ImageRoot():
                    if op.layers:
                        missing.append((op, _CANNOT["layers"]))
                case WorkspaceMount():
                    from .microvm_ws import check as ws_check

                    why = ws_check(op)
                    if why:
                        missing.append((op, why))
                case ReadOnlyBind():
                    missing.append((op, _CANNOT["bind"]))
                case Seccomp():
                    missing.append((op, _CANNOT["seccomp"]))
                case (Namespaces() | Scratch() | Environment() | MemoryLimit() | CpuTime()
                      | WallClock() | CpuQuota() | PidsLimit() | OutputCap() | Rlimit()
                      | NoNetwork() | EgressProxy()):
                    pass
                case _:
                    assert_never(op)
        check = TierCheck.of(self.name, plan, missing)
        if plan.find(SystemRoot):
            # the default root, image = "host": refused even as a default (there is no
            # host root to boot, and nothing weaker is run), under the rule "image"
            check = TierCheck(self.name, (*check.gaps, Gap(SystemRoot(rule="image"),
                                                           _CANNOT["host"], explicit=True)))
        return check

    def open(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None
             ) -> MicrovmSandbox:
        return self._open(MicrovmSandbox, plan, check, granted, upstream_ca)

    def _open(self, cls, plan: Plan, check: TierCheck, granted, upstream_ca):
        check.admit(self.name)
        for g in check.gaps:   # fail closed: a default this tier cannot give is not
            if isinstance(g.op, (WorkspaceMount, ReadOnlyBind, EgressProxy, ImageRoot)):
                raise UnsupportedRule(g.reason, field=g.rule)   # quietly dropped either
        net = {"granted": list(granted), "upstream_ca": upstream_ca}
        if not self.warm:
            return cls(plan, check, net=net)
        from . import microvm_snap as snap

        path = snap.snap_path(machine(plan)["key"])
        if not os.path.isfile(path):
            try:
                snap.template(plan, check, MicrovmSandbox, path)
            except SandboxSetupError:
                return cls(plan, check, net=net)   # no template: a cold boot, slower only
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return cls(plan, check, mode="restore", snapshot=fd, net=net)
        except SandboxSetupError:
            try:
                os.unlink(path)   # a template that does not restore is made again next time
            except OSError:
                pass
            return cls(plan, check, net=net)
        finally:
            os.close(fd)

    def open_live(self, plan: Plan, check: TierCheck, granted=(), upstream_ca=None):
        from .microvm_live import MicrovmLive

        return self._open(MicrovmLive, plan, check, granted, upstream_ca)


def frame(kind: bytes, data: bytes = b"") -> bytes:
    return kind + struct.pack(">I", len(data)) + data


class FrameReader:
    """Frames from the guest, parsed strictly: a known type, at most MAX_FRAME bytes."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed, self.buf = allowed, bytearray()

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        self.buf += chunk
        out = []
        while len(self.buf) >= 5:
            kind, n = bytes(self.buf[:1]), struct.unpack(">I", self.buf[1:5])[0]
            if kind not in self.allowed or n > MAX_FRAME:
                raise ValueError(f"bad frame from the guest (type {kind!r}, {n} bytes)")
            if len(self.buf) < 5 + n:
                break
            out.append((kind, bytes(self.buf[5:5 + n])))
            del self.buf[:5 + n]
        return out


def parse_exit(data: bytes) -> dict:
    """The X frame: {"code": 0-255 or None, "signal": 1-64 or None, "cpu": seconds,
    "oom": the guest kernel's OOM kills during the command, "full": /scratch out of bytes
    (1) and/or inodes (2) at the end}."""
    try:
        x = json.loads(data.decode("utf-8"))
    except RecursionError:   # deep nesting ([[[[...): not a ValueError (tests/fuzz found it)
        raise ValueError("bad exit frame from the guest") from None
    if not isinstance(x, dict) or set(x) != {"code", "signal", "cpu", "oom", "full"}:
        raise ValueError("bad exit frame from the guest")
    code, sig, cpu, oom = x["code"], x["signal"], x["cpu"], x["oom"]
    if not (type(oom) is int and 0 <= oom < 1 << 31 and x["full"] in (0, 1, 2, 3)
            and type(x["full"]) is int):
        raise ValueError("bad exit frame from the guest")
    if not ((code is None or type(code) is int and 0 <= code <= 255)
            and (sig is None or type(sig) is int and 1 <= sig <= 64)
            and (code is None) != (sig is None)
            and type(cpu) in (int, float) and 0 <= cpu < 1e9):
        raise ValueError("bad exit frame from the guest")
    return x


def machine(plan: Plan) -> dict:
    """The VM a plan boots: RAM, vCPUs, scratch, files, accelerator, and the key a warm
    snapshot of it is kept under."""
    from .base import ExecLimits

    lim = ExecLimits.from_plan(plan)
    (img,) = plan.find(ImageRoot)
    (scratch,) = plan.find(Scratch)
    quota = plan.find(CpuQuota)
    cpus = quota[0].cpus if quota else None
    ncpu = max(1, min(os.cpu_count() or 1, int(-(-cpus // 1)))) if cpus else 1
    ram = max(lim.memory, MIN_RAM)
    accel = _accel()
    vmlinuz, _ = assets.kernel_files()
    rd = assets.initramfs()
    disk = assets.root_disk(img.digest.removeprefix("sha256:"), img.tree)
    key = (img.digest, assets.KERNEL_VERSION, os.path.basename(rd), ram, ncpu, scratch.size,
           scratch.inodes, accel[0], TB_SIZE_MB)
    return {"ram": ram, "ncpu": ncpu, "scratch": scratch, "cpus": cpus, "accel": accel,
            "files": (vmlinuz, rd, disk), "key": key}


class MicrovmSandbox(LiveSandbox):
    """One VM. `mode`: "boot" (a cold boot), "template" (a cold boot with a QMP monitor,
    for backends/microvm_snap.py to save and end), or "restore" (from `snapshot`, an
    open file of a saved template; the guest is reseeded and answers ready again)."""

    def __init__(self, plan: Plan, check: TierCheck, *, mode: str = "boot",
                 snapshot: int | None = None, net: dict | None = None) -> None:
        from ..linux.limits import RunCgroup
        from .host.ids import free_uids

        self.plan, self.events, self.mode = plan, check.events(), mode
        self.proc = self.cg = self.sock = self.drainer = self.qmp = None
        self.netsock = self.relay = self.proxy = None
        self.egress = bool(plan.find(EgressProxy)) and mode != "template"
        self.dead: str | None = None
        #: teardown events of the VM's own end (a protocol violation, a flooded console)
        self.end_events: list[dict] = []
        self.console = bytearray()
        self.console_bytes = 0
        self.busy = threading.Lock()
        #: one sender at a time on the control channel (stdin's feeder beside a kill)
        self.send_lock = threading.Lock()
        m = machine(plan)
        ram, ncpu, scratch, cpus = m["ram"], m["ncpu"], m["scratch"], m["cpus"]
        vmlinuz, rd, disk = m["files"]
        self.accel, self.accel_why = m["accel"]
        #: what a snapshot of this VM must match to be restored into it
        self.machine_key = m["key"]
        from ..linux import rundir

        self.uid = free_uids(1)[0]
        fds: list[int] = []
        self.dir = None
        try:
            # a locked run directory records the cgroup: if this supervisor dies, the next
            # corral start's sweep kills what is left in it (QEMU, were PDEATHSIG missed)
            rundir.sweep_if_due()
            self.dir = rundir.RunDir()
            self.run_id = f"{self.dir.id}-mvm"
            from .host.cgroups import with_relay_tasks

            self.cg = RunCgroup.create(
                self.run_id, memory=ram + QEMU_OVERHEAD + (PROXY_OVERHEAD if self.egress
                                                           else 0),
                pids=with_relay_tasks(plan)(QEMU_PIDS) if self.egress else QEMU_PIDS,
                cpus=cpus)
            self.dir.track(self.cg)
            files = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in (vmlinuz, rd, disk)]
            fds += files
            host, guest = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock = host
            fds.append(guest.detach())
            # the relay's port is there in every VM (a restored guest has the devices its
            # template had); with network none its host end is closed at once
            nhost, nguest = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self.netsock = nhost
            fds.append(nguest.detach())
            kf, rf, df = (f"/proc/self/fd/{fd}" for fd in files)
            accel = "kvm" if self.accel == "kvm" else f"tcg,tb-size={TB_SIZE_MB}"
            argv = [assets.QEMU, "-M", "q35", "-accel", accel,
                    *(["-cpu", "host"] if self.accel == "kvm" else []),
                    "-m", f"{ram >> 20}M", "-smp", str(ncpu),
                    "-nodefaults", "-no-user-config", "-display", "none",
                    "-serial", "stdio", "-no-reboot", "-kernel", kf, "-initrd", rf,
                    "-append", (f"console=ttyS0 quiet panic=-1 reboot=t "
                                f"corral_scratch={scratch.size} "
                                f"corral_inodes={scratch.inodes}"),
                    "-drive", f"file={df},if=none,id=root,format=raw,readonly=on",
                    "-device", "virtio-blk-pci,drive=root",
                    "-device", "virtio-serial-pci",
                    "-chardev", f"socket,id=ctl,fd={fds[3]}",
                    "-device", "virtserialport,chardev=ctl,name=corral.ctl",
                    "-chardev", f"socket,id=net,fd={fds[4]}",
                    "-device", "virtserialport,chardev=net,name=corral.net",
                    "-device", "virtio-rng-pci",
                    "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,"
                                "resourcecontrol=deny"]
            if mode == "template":
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                self.qmp = mine
                fds.append(theirs.detach())
                argv += ["-chardev", f"socket,id=qmp,fd={fds[-1]}",
                         "-mon", "chardev=qmp,mode=control"]
            elif mode == "restore":
                fds.append(os.dup(snapshot))
                argv += ["-incoming", f"fd:{fds[-1]}"]
            passed = list(fds)
            cgfds = self.cg.attach_fds()
            fds += cgfds
            self.proc = _spawn(argv, self.uid, cgfds, passed)
        except BaseException:
            self.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        self.drainer = threading.Thread(target=self._drain, daemon=True)
        self.drainer.start()
        if mode != "template":   # a fresh identity: no two sandboxes share one
            self.hostname = "corral-" + os.urandom(4).hex()
            self.machine_id = os.urandom(16).hex()
            self._send(frame(b"H", json.dumps({"hostname": self.hostname,
                                               "machine_id": self.machine_id,
                                               "time": time.time()}).encode()))
        if mode == "restore":   # fresh entropy before anything runs: the agent mixes it
            # into the guest kernel's pool and forces a reseed of its CRNG
            self._send(frame(b"S", os.urandom(64)))
        self.boot_s = self._wait_ready()
        try:
            self._workspace()
            self._network(net or {})
        except BaseException:
            self.close()
            raise

    def _workspace(self) -> None:
        """A read-only workspace, copied in (backends/microvm_ws.py)."""
        ws = self.plan.find(WorkspaceMount)
        if not ws or self.mode == "template":
            return
        from .microvm_ws import pack

        data, skipped = pack(ws[0].path)
        for i in range(0, len(data), MAX_FRAME):
            self._send(frame(b"W", data[i:i + MAX_FRAME]))
        self._send(frame(b"w", json.dumps({"dest": ws[0].dest}).encode()))
        self._wait_ready()
        if skipped:
            from ..events import NoticeEvent

            self.events.append(NoticeEvent(
                f"{skipped} entries of the workspace were not copied into the microvm "
                f"guest (links leading out of it, or special files)").to_dict())

    def _network(self, net: dict) -> None:
        """network allow: the guest's relay (an N frame), and ours (microvm_net.py)."""
        if self.mode == "template":
            return   # saved with its relay port connected, as a sandbox with allow has it
        if not self.egress:
            self.netsock.close()   # nothing at the port's other end
            self.netsock = None
            return
        from .host.proxy import egress_files
        from .microvm_net import PROXY_SOCKET, HostRelay

        self.ca, ca_file, self.upstream_ca = egress_files(self.dir, net.get("granted") or [],
                                                          net.get("upstream_ca"))
        self.granted = net.get("granted") or []
        pem = ""
        if ca_file:
            with open(ca_file) as f:
                pem = f.read()
        from ..plan import PROXY_PORT

        self._send(frame(b"N", json.dumps({"port": PROXY_PORT, "ca": pem}).encode()))
        self.proxy_path = os.path.join(self.dir.path, PROXY_SOCKET)
        self.relay = HostRelay(self.netsock, self.proxy_path, self._violation)

    def start_proxy(self):
        """The egress proxy, serving the relay's unix listener (per one-shot command, or
        for a live sandbox's life)."""
        from ..grants import proxy_config
        from .host.proxy import start_proxy
        from .microvm_net import proxy_listener

        (egress,) = self.plan.find(EgressProxy)
        config = proxy_config(egress.config_json, self.granted, self.ca, self.upstream_ca)
        attach = self.cg.attach_fds()
        try:
            self.proxy = start_proxy(config, proxy_listener(self.proxy_path), attach,
                                     self.uid, self.uid)
        finally:
            for fd in attach:
                os.close(fd)
        return self.proxy

    def stop_proxy(self) -> list[dict]:
        proxy, self.proxy = self.proxy, None
        if proxy is None:
            return []
        try:
            os.unlink(self.proxy_path)
        except OSError:
            pass
        return proxy.stop()

    def _violation(self, why: str) -> None:
        from ..events import TeardownEvent

        self.end_events.append(TeardownEvent(f"the microvm guest was ended: {why}").to_dict())
        self._kill(why)

    def _drain(self) -> None:
        """QEMU's stdout (the guest's console): the last CONSOLE_TAIL bytes are kept."""
        with self.proc.stdout as out:
            while chunk := os.read(out.fileno(), 65536):
                self.console += chunk
                del self.console[:-CONSOLE_TAIL]
                self.console_bytes += len(chunk)
                if self.console_bytes > CONSOLE_MAX and not self.dead:
                    self._violation(f"it wrote more than {CONSOLE_MAX} bytes to its "
                                    f"console")

    def _tail(self) -> str:
        lines = bytes(self.console).decode("utf-8", "replace").strip().splitlines()
        return " / ".join(x.strip() for x in lines[-4:])[-600:]

    def _wait_ready(self) -> float:
        t0 = time.monotonic()
        reader = FrameReader(b"R")
        while True:
            left = BOOT_TIMEOUT - (time.monotonic() - t0)
            r, _, _ = select.select([self.sock], [], [], max(0.0, left))
            chunk = self.sock.recv(65536) if r else None
            if not chunk:
                why = "timed out" if chunk is None else "ended"
                self.close()
                raise SandboxSetupError(f"the microvm guest's boot {why} before its agent "
                                        f"answered ({self.accel}); console: {self._tail()}",
                                        step="microvm boot")
            try:
                frames = reader.feed(chunk)
            except ValueError as e:
                self.close()
                raise SandboxSetupError(str(e), step="microvm boot") from None
            if frames:
                if reader.buf:
                    self.close()
                    raise SandboxSetupError("the guest sent more than its ready frame",
                                            step="microvm boot")
                return time.monotonic() - t0

    def exec(self, argv: list[str], *, stdin: int | None = None, on_stdout=None,
             on_stderr=None, timeout: float | None = None, tty=None) -> Result:

        if not argv:
            raise SandboxSetupError("no command given", step="exec")
        if tty is not None:
            raise BackendUnavailable("a terminal (-t) is not offered on the microvm tier "
                                     "yet; run without -t, or use isolation = "
                                     "\"namespace\" for -t", field="tty")
        if self.dead:
            raise SandboxSetupError(f"the microvm sandbox is gone ({self.dead})", step="exec")
        if not self.busy.acquire(blocking=False):
            raise BackendUnavailable("the microvm tier runs one command at a time in a "
                                     "sandbox (a run_code context holds one while it lives); "
                                     "use isolation = \"namespace\" for concurrent commands",
                                     field="isolation")
        try:
            if self.egress:
                self.start_proxy()
            try:
                result = self._exec(argv, stdin, on_stdout, on_stderr, timeout)
            finally:
                net = self.stop_proxy()
            result.events += net + [dict(e) for e in self.end_events]
            return result
        finally:
            self.busy.release()

    def _exec(self, argv, stdin, on_stdout, on_stderr, timeout) -> Result:
        from .base import ExecLimits

        lim = ExecLimits.from_plan(self.plan, timeout)
        (envop,) = self.plan.find(Environment)
        env = dict(envop.env)
        env.setdefault("HOME", SCRATCH)
        spec = {"argv": list(argv), "env": env, "cwd": self.plan.cwd, "cpu": lim.cpu,
                "rlimits": {k: int(v) for k, v in lim.rlimits.items()}, "pids": lim.pids}
        t0 = time.monotonic()
        self._send(frame(b"C", json.dumps(spec).encode()))
        if stdin is None:
            self._send(frame(b"D"))
        else:
            threading.Thread(target=self._feed_stdin, args=(stdin,), daemon=True).start()
        out = {b"O": bytearray(), b"E": bytearray()}
        trunc = {b"O": False, b"E": False}
        cbs = {b"O": on_stdout, b"E": on_stderr}
        reader = FrameReader(b"OEX")
        ended = timed_out = None
        killed_at = None
        events = list(self.events)
        while ended is None:
            now = time.monotonic()
            if killed_at is None and now - t0 >= lim.wall:
                timed_out, killed_at = "timeout", now
                self._send(frame(b"K"))
            if killed_at is not None and now - killed_at >= KILL_GRACE:
                self._kill("the agent did not answer a kill")
                break
            wait = (killed_at + KILL_GRACE - now) if killed_at else (t0 + lim.wall - now)
            r, _, _ = select.select([self.sock], [], [], max(0.01, wait))
            if not r:
                continue
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._kill("the VM ended")
                break
            try:
                frames = reader.feed(chunk)
                for kind, data in frames:
                    if kind == b"X":
                        ended = parse_exit(data)
                        break
                    room = lim.cap - len(out[kind])
                    if len(data) > room:
                        data, trunc[kind] = data[:max(room, 0)], True
                    if data:
                        out[kind] += data
                        if cbs[kind] is not None:
                            cbs[kind](bytes(data))
            except ValueError as e:   # the guest broke the protocol: it is ended
                self._kill(str(e))
                break
        wall = time.monotonic() - t0
        for kind, stream in ((b"O", "stdout"), (b"E", "stderr")):
            if trunc[kind]:
                events.append(LimitEvent.output(stream, lim.cap).to_dict())
        # QEMU's own cgroup OOM (the VM is then gone), or the guest kernel's OOM killer
        # during the command (the guest's RAM is the policy's memory limit)
        host_oom = (self.cg.usage().oom_kills or 0) if self.cg is not None else 0
        guest_oom = 0
        code = sig = None
        cpu = None
        if ended is not None:
            code, sig, cpu = ended["code"], ended["signal"], float(ended["cpu"])
            guest_oom = ended["oom"] if sig == signal.SIGKILL else 0
            if (timed_out is None and sig in (signal.SIGXCPU, signal.SIGKILL)
                    and cpu >= lim.cpu - 0.05):
                timed_out = "cpu_time"
        elif timed_out is None:
            sig = signal.SIGKILL
        oom = host_oom + guest_oom
        full = ended["full"] if ended is not None else 0
        if full & 1:
            events.append(LimitEvent.scratch_full().to_dict())
        if full & 2:
            events.append(LimitEvent.scratch_inodes().to_dict())
        if timed_out == "timeout":
            events.append(LimitEvent.timeout(lim.wall).to_dict())
            code = sig = None
        elif timed_out == "cpu_time":
            events.append(LimitEvent.cpu_time(lim.cpu).to_dict())
            code = sig = None
        (m,) = self.plan.find(MemoryLimit)
        if host_oom:
            events.append(LimitEvent.memory(host_oom, m.bytes + QEMU_OVERHEAD).to_dict())
        if guest_oom:
            events.append(LimitEvent("memory", message=(
                f"the guest kernel's OOM killer killed {guest_oom} process(es): the guest's "
                f"RAM is the {max(m.bytes, MIN_RAM)} byte limit")).to_dict())
        from ..result import decide_verdict

        verdict = decide_verdict(exit_code=code, signal=sig, oom_kills=oom or 0,
                                 timed_out=timed_out)
        return Result(verdict=verdict, exit_code=code, signal=sig,
                      stdout=out[b"O"].decode("utf-8", "replace"),
                      stderr=out[b"E"].decode("utf-8", "replace"),
                      stdout_truncated=trunc[b"O"], stderr_truncated=trunc[b"E"],
                      usage=Usage(wall_s=wall, cpu_s=cpu), events=events,
                      isolation="microvm")

    def _feed_stdin(self, fd: int) -> None:
        try:
            while chunk := os.read(fd, MAX_FRAME):
                self._send(frame(b"I", chunk))
        except OSError:
            pass
        self._send(frame(b"D"))

    def _send(self, data: bytes) -> None:
        """Send within SEND_TIMEOUT, or end the VM with an event: a guest that stops
        reading its control port would block the sending thread (a kill at a timeout, a
        command's start, stdin's feeder) forever. One sender at a time."""
        with self.send_lock:
            if self.dead:
                return
            view = memoryview(data)
            deadline = time.monotonic() + SEND_TIMEOUT
            try:
                while view:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [self.sock], [], left)[1]:
                        self._violation("it stopped reading its control channel")
                        return
                    try:
                        view = view[self.sock.send(view, socket.MSG_DONTWAIT):]
                    except BlockingIOError:
                        continue
            except (OSError, ValueError, AttributeError):
                pass    # the VM's end closed

    def _kill(self, why: str) -> None:
        """End the VM: the sandbox is unusable from here on."""
        self.dead = why
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            if self.cg is not None:     # QEMU's exit, not held back by its CPU quota
                self.cg.unthrottle()
            self.proc.wait()

    def close(self) -> list[str]:
        problems: list[str] = []
        self._kill(self.dead or "closed")
        if self.drainer is not None:
            self.drainer.join(5)
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.proxy is not None:
            self.stop_proxy()
        for attr in ("sock", "qmp", "netsock"):
            if getattr(self, attr, None) is not None:
                getattr(self, attr).close()
                setattr(self, attr, None)
        if self.cg is not None:
            try:
                self.cg.destroy()
            except Exception as e:   # noqa: BLE001 - teardown reports, never raises
                problems.append(f"could not remove the microvm's cgroup: {e}")
            self.cg = None
        if getattr(self, "dir", None) is not None:
            problems += self.dir.remove()
            self.dir = None
        return problems


def _spawn(argv: list[str], uid: int, cgfds: list[int], fds: list[int]):
    """QEMU as `uid` (gid the same, no groups), in the run's cgroup, its own session, dying
    with this process (PR_SET_PDEATHSIG, set after the uid change, which would clear it)."""
    import subprocess

    from ..linux import _sys

    def child() -> None:
        from ..linux.limits import RunCgroup

        RunCgroup.attach_self(cgfds)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        _sys.set_pdeathsig(signal.SIGKILL)

    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, pass_fds=fds, preexec_fn=child,
                            start_new_session=True, close_fds=True)
