"""What the microvm tier boots: the pinned guest kernel, the initramfs, an image's root as a
read-only squashfs disk, and whether this host's KVM can boot it (a cached probe).

All of it lives under <state dir>/microvm, written by corral (never by a guest), each file
atomically (a temporary name, then rename) and world-readable, since QEMU runs as an
unprivileged uid of its own:

    kernel-<version>/vmlinuz           from Debian's cloud kernel package, sha256-checked
    kernel-<version>/modules/*.ko      the few modules the guest needs (virtio, squashfs)
    initrd-<key>.cpio                  busybox, those modules, /init, the guest agent
    roots/<image digest>.sqfs          mksquashfs of the image's tree
    kvm-<host kernel release>.json     the KVM probe's answer

`python -m corral.backends.microvm_assets` fetches and extracts the kernel (scripts/setup.sh
runs it): `apt-get download` of the pinned package from the Debian mirror, its sha256
checked before anything of it is unpacked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile

from ..errors import BackendUnavailable, SandboxSetupError

#: the guest kernel: Debian 12's cloud kernel (virtio drivers as modules, no graphics, no
#: sound), pinned by package version and the .deb's sha256
KERNEL_PACKAGE = "linux-image-6.1.0-57-cloud-amd64"
KERNEL_VERSION = "6.1.192-3"
KERNEL_RELEASE = "6.1.0-57-cloud-amd64"
KERNEL_DEB_SHA256 = "4fdd0172a8c3f41a97e92465b2ac1867e1c10d82d7aeed3d26ee7a5d14df1754"
#: the modules the guest loads, in dependency order (the package's modules.dep is made by
#: depmod at install, which never runs here)
MODULES = (
    "drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko", "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci.ko", "drivers/block/virtio_blk.ko",
    "drivers/char/virtio_console.ko", "drivers/char/hw_random/virtio-rng.ko",
    "fs/squashfs/squashfs.ko",
)
#: files the root disk gets when the image's tree has none (mount points of the initramfs)
PSEUDO_FILES = ("etc/machine-id", "etc/corral-ca.pem")
#: in the root disk's file name: a disk of an older format is built again
ROOT_FORMAT = 2
BUSYBOX = "/bin/busybox"   # Debian's busybox-static (scripts/setup.sh installs it)
QEMU = "/usr/bin/qemu-system-x86_64"
MKSQUASHFS = "/usr/bin/mksquashfs"

#: /init of the initramfs (busybox sh): load the modules, mount the image's squashfs
#: read-only, a tmpfs /scratch capped at corral_scratch bytes (from the kernel command
#: line: the kernel hands unknown name=value words to init's environment), /tmp in it, the
#: agent on a small tmpfs /run/corral, then switch_root to the image's python3 running it.
#: Overcommit is always allowed, as for a process in a memory cgroup on the host: a large
#: allocation succeeds and the guest kernel's OOM killer ends the command once its pages
#: no longer fit (verdict oom), rather than a MemoryError at malloc.
#: The agent (and so every command) runs with no_new_privs, and the root is nosuid: a
#: set-uid binary of the image gives the sandbox's user nothing.
#: Any failure powers the guest off (PID 1 exits: panic=-1 and -no-reboot end QEMU).
INIT = r"""#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
$B echo 1 > /proc/sys/vm/overcommit_memory
for m in MODULES; do $B insmod /m/$m.ko || { $B echo "corral-init: insmod $m failed"; exit 1; }; done
i=0
while [ ! -b /dev/vda ]; do i=$((i+1)); [ $i -gt 500 ] && { $B echo "corral-init: no /dev/vda"; exit 1; }; $B usleep 10000; done
$B mkdir -p /newroot
$B mount -t squashfs -o ro,nosuid,nodev /dev/vda /newroot || { $B echo "corral-init: root mount failed"; exit 1; }
$B mount -t tmpfs -o "size=$corral_scratch,nr_inodes=$corral_inodes,mode=0755" scratch /newroot/scratch || exit 1
$B mkdir -m 1777 /newroot/scratch/tmp
$B mount --bind /newroot/scratch/tmp /newroot/tmp || exit 1
$B mount -t tmpfs -o size=8m,mode=0755 run /newroot/run || exit 1
$B mkdir /newroot/run/corral
$B cp /agent.py /newroot/run/corral/agent.py
$B cp /bin/busybox /newroot/run/corral/busybox
[ -d /newroot/workspace ] && { $B mount -t tmpfs -o ro,size=80m,mode=0755 ws /newroot/workspace || exit 1; }
$B echo 00000000000000000000000000000000 > /newroot/run/corral/machine-id
$B touch /newroot/run/corral/ca.pem
$B chmod 444 /newroot/run/corral/machine-id
$B chmod 644 /newroot/run/corral/ca.pem
$B mount --bind /newroot/run/corral/machine-id /newroot/etc/machine-id || exit 1
$B mount --bind /newroot/run/corral/ca.pem /newroot/etc/corral-ca.pem || exit 1
$B ip link set lo up || exit 1
$B hostname corral
$B mount --move /dev /newroot/dev
$B mkdir -p /newroot/dev/pts
$B mount -t devpts -o mode=0620,ptmxmode=0666 devpts /newroot/dev/pts || exit 1
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup || exit 1
$B echo "+memory +pids" > /newroot/sys/fs/cgroup/cgroup.subtree_control
exec $B setpriv --nnp $B switch_root /newroot /usr/bin/python3 -I -S /run/corral/agent.py
"""


def state_root() -> str:
    from ..images.store import state_dir

    return os.path.join(state_dir(), "microvm")


def kernel_dir(root: str | None = None) -> str:
    return os.path.join(root or state_root(), f"kernel-{KERNEL_VERSION}")


def _mkdirs(path: str) -> None:
    os.makedirs(path, 0o755, exist_ok=True)


def _write_atomic(path: str, data: bytes) -> None:
    d = os.path.dirname(path)
    _mkdirs(d)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with _quiet():
            os.unlink(tmp)
        raise


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, t, e, tb):
        return isinstance(e, OSError)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def install_kernel(root: str | None = None, deb: str | None = None) -> str:
    """Download (apt-get download) the pinned kernel package, check its sha256, extract
    vmlinuz and MODULES into kernel_dir(). `deb`: a .deb already at hand (checked all the
    same). Returns the kernel directory."""
    kdir = kernel_dir(root)
    if os.path.isfile(os.path.join(kdir, "vmlinuz")):
        return kdir
    with tempfile.TemporaryDirectory(prefix="corral-kernel-") as tmp:
        if deb is None:
            os.chmod(tmp, 0o755)   # apt's _apt user writes the download
            p = subprocess.run(["apt-get", "download", f"{KERNEL_PACKAGE}={KERNEL_VERSION}"],
                               cwd=tmp, capture_output=True, text=True, check=False)
            debs = [f for f in os.listdir(tmp) if f.endswith(".deb")]
            if p.returncode != 0 or len(debs) != 1:
                raise SandboxSetupError(f"apt-get download {KERNEL_PACKAGE}={KERNEL_VERSION} "
                                        f"failed: {p.stderr.strip()[-300:]}", step="kernel")
            deb = os.path.join(tmp, debs[0])
        got = sha256_file(deb)
        if got != KERNEL_DEB_SHA256:
            raise SandboxSetupError(f"{os.path.basename(deb)} has sha256 {got}, not the "
                                    f"pinned {KERNEL_DEB_SHA256}: refusing it", step="kernel")
        x = os.path.join(tmp, "x")
        subprocess.run(["dpkg-deb", "-x", deb, x], check=True)
        stage = tempfile.mkdtemp(dir=tmp, prefix="k-")
        shutil.copyfile(os.path.join(x, "boot", f"vmlinuz-{KERNEL_RELEASE}"),
                        os.path.join(stage, "vmlinuz"))
        os.mkdir(os.path.join(stage, "modules"))
        for m in MODULES:
            shutil.copyfile(os.path.join(x, "lib", "modules", KERNEL_RELEASE, "kernel", m),
                            os.path.join(stage, "modules", os.path.basename(m)))
        for dirpath, dirs, files in os.walk(stage):
            os.chmod(dirpath, 0o755)
            for f in files:
                os.chmod(os.path.join(dirpath, f), 0o644)
        _mkdirs(os.path.dirname(kdir))
        try:
            os.rename(stage, kdir)
        except OSError:
            if not os.path.isfile(os.path.join(kdir, "vmlinuz")):   # not a racing install
                raise
    return kdir


#: where scripts/setup.sh (as root, default state dir) puts the kernel: found there too
#: when CORRAL_STATE_DIR points elsewhere
SYSTEM_STATE = "/var/lib/corral/microvm"


def kernel_files(root: str | None = None) -> tuple[str, str]:
    """(vmlinuz, modules dir) of the installed kernel, or BackendUnavailable."""
    kdir = kernel_dir(root)
    if not os.path.isfile(os.path.join(kdir, "vmlinuz")) and root is None:
        kdir = kernel_dir(SYSTEM_STATE)
    vmlinuz = os.path.join(kdir, "vmlinuz")
    if not os.path.isfile(vmlinuz):
        raise BackendUnavailable(f"the microvm tier's guest kernel is not installed in "
                                 f"{kdir}; run scripts/setup.sh (or python -m "
                                 f"corral.backends.microvm_assets)", field="isolation")
    return vmlinuz, os.path.join(kdir, "modules")


def _cpio(entries) -> bytes:
    """A newc cpio archive of (name, mode, data) entries (data None for a directory)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], 1):
        body = data or b""
        nm = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            ino if name != "TRAILER!!!" else 0, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0,
            len(nm), 0))
        out += hdr.encode() + nm
        out += b"\0" * (-len(out) % 4)
        out += body
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def initramfs(root: str | None = None) -> str:
    """The initramfs (built once per kernel, busybox and agent: its name holds their
    hash)."""
    from .. import guest

    _, mdir = kernel_files(root)
    if not os.path.isfile(BUSYBOX):
        raise BackendUnavailable("the microvm tier needs busybox-static (/bin/busybox); "
                                 "run scripts/setup.sh", field="isolation")
    names = [os.path.basename(m)[:-3] for m in MODULES]
    init = INIT.replace("MODULES", " ".join(names)).encode()
    agent = guest.source("microvm_agent.py").encode()
    with open(BUSYBOX, "rb") as f:
        bb = f.read()
    h = hashlib.sha256(init + agent + bb + KERNEL_VERSION.encode()).hexdigest()[:16]
    path = os.path.join(root or state_root(), f"initrd-{h}.cpio")
    if os.path.isfile(path):
        return path
    d, f644, x755 = 0o040755, 0o100644, 0o100755
    entries = [(n, d, None) for n in ("bin", "dev", "proc", "sys", "m", "newroot")]
    entries += [("bin/busybox", x755, bb), ("init", x755, init), ("agent.py", f644, agent)]
    for n in names:
        with open(os.path.join(mdir, n + ".ko"), "rb") as f:
            entries.append((f"m/{n}.ko", f644, f.read()))
    _write_atomic(path, _cpio(entries))
    for old in os.listdir(os.path.dirname(path)):   # the ones an older agent was built into
        if old.startswith("initrd-") and old.endswith(".cpio") and old != os.path.basename(path):
            with _quiet():   # a QEMU reading one holds it open: unlinking is safe
                os.unlink(os.path.join(os.path.dirname(path), old))
    return path


def root_disk(digest: str, tree: str, root: str | None = None) -> str:
    """The image's tree as a read-only squashfs (built once per image digest)."""
    if not (len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise SandboxSetupError(f"bad image digest {digest[:80]!r}", step="microvm root")
    path = os.path.join(root or state_root(), "roots", f"{digest}-{ROOT_FORMAT}.sqfs")
    if os.path.isfile(path):
        return path
    if not os.path.isfile(MKSQUASHFS):
        raise BackendUnavailable("the microvm tier needs squashfs-tools (mksquashfs); run "
                                 "scripts/setup.sh", field="isolation")
    d = os.path.dirname(path)
    _mkdirs(d)
    tmp = os.path.join(d, f".tmp-{os.getpid()}-{digest[:12]}.sqfs")
    # the mount points the initramfs binds over: the sandbox's own machine-id and the
    # run's CA bundle (grants.CA_BUNDLE), as empty files where the tree has none
    pseudo = []
    for name in PSEUDO_FILES:
        if not os.path.lexists(os.path.join(tree, name)):
            pseudo += ["-p", f"{name} f 444 0 0 true"]
    p = subprocess.run([MKSQUASHFS, tree, tmp, "-noappend", "-quiet", "-no-progress",
                        "-comp", "lz4", "-no-xattrs", *pseudo], capture_output=True,
                       text=True, check=False)
    if p.returncode != 0:
        with _quiet():
            os.unlink(tmp)
        raise SandboxSetupError(f"mksquashfs of image {digest[:12]} failed: "
                                f"{p.stderr.strip()[-300:]}", step="microvm root")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def kvm_usable(root: str | None = None) -> tuple[bool, str]:
    """Whether QEMU with KVM boots the guest kernel on this host: (usable, why), from a
    probe boot cached per host kernel release (and guest kernel version). The probe boots
    the kernel with an initramfs whose /init powers the guest off at once; a KVM that
    cannot run it (a nested PVM here: "emulation failure", or a hang) fails or times out."""
    if not os.path.exists("/dev/kvm"):
        return False, "no /dev/kvm on this host"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm is not readable and writable by corral"
    cache = os.path.join(root or state_root(),
                         f"kvm-{os.uname().release}-{KERNEL_VERSION}.json")
    try:
        with open(cache) as f:
            got = json.load(f)
        if isinstance(got, dict) and isinstance(got.get("usable"), bool):
            return got["usable"], str(got.get("why", ""))[:300]
    except (OSError, ValueError):
        pass
    usable, why = _kvm_probe(root)
    with _quiet():
        _write_atomic(cache, json.dumps({"usable": usable, "why": why}).encode())
    return usable, why


def _kvm_probe(root: str | None) -> tuple[bool, str]:
    vmlinuz, _ = kernel_files(root)
    if not os.path.isfile(BUSYBOX):
        return False, "no busybox to build the probe's initramfs"
    with open(BUSYBOX, "rb") as f:
        bb = f.read()
    init = b"#!/bin/busybox sh\n/bin/busybox echo corral-kvm-ok\n/bin/busybox poweroff -f\n"
    with tempfile.TemporaryDirectory(prefix="corral-kvm-") as tmp:
        rd = os.path.join(tmp, "probe.cpio")
        with open(rd, "wb") as f:
            f.write(_cpio([("bin", 0o040755, None), ("bin/busybox", 0o100755, bb),
                           ("init", 0o100755, init)]))
        try:
            p = subprocess.run([QEMU, "-M", "q35", "-accel", "kvm", "-cpu", "host", "-m",
                                "128", "-nodefaults", "-no-user-config", "-display", "none",
                                "-serial", "stdio", "-no-reboot", "-kernel", vmlinuz,
                                "-initrd", rd, "-append",
                                "console=ttyS0 quiet panic=-1 reboot=t"],
                               capture_output=True, timeout=20, check=False)
        except subprocess.TimeoutExpired:
            return False, "a KVM boot of the guest kernel hung (no answer in 20 s)"
        if b"corral-kvm-ok" in p.stdout:
            return True, "a KVM boot of the guest kernel answered"
        err = (p.stderr or p.stdout).decode("utf-8", "replace").strip().splitlines()
        return False, "a KVM boot of the guest kernel failed: " + (
            err[0][:200] if err else f"exit {p.returncode}")


if __name__ == "__main__":
    import sys

    print(install_kernel(deb=sys.argv[1] if len(sys.argv) > 1 else None))
