"""`corral doctor`: what this host supports, tier by tier, and how to fix what is missing."""

from __future__ import annotations

import json
import os
import shutil
import sys


def _landlock_abi() -> int | str:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    nr = 444  # landlock_create_ruleset, same number on x86_64 and aarch64
    abi = libc.syscall(nr, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 0:
        e = ctypes.get_errno()
        return f"unavailable ({os.strerror(e)}); boot with lsm=landlock,... to enable it"
    return abi


def _seccomp() -> bool | str:
    try:
        import seccomp  # noqa: F401
    except ImportError:
        return "libseccomp's Python binding is missing; apt-get install python3-seccomp"
    with open("/proc/self/status") as f:
        if "Seccomp:" not in f.read():
            return "the kernel has no seccomp support"
    return True


def _kvm() -> str:
    if not os.path.exists("/dev/kvm"):
        return "no /dev/kvm"
    try:
        import fcntl

        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
        try:
            version = fcntl.ioctl(fd, 0xAE00)  # KVM_GET_API_VERSION
        finally:
            os.close(fd)
        api = f"/dev/kvm answers (API {version})"
    except OSError as e:
        return f"/dev/kvm present but unusable: {e.strerror}"
    from ..errors import BackendUnavailable

    try:   # whether it boots the microvm tier's guest kernel: a cached probe boot
        from ..backends.microvm_assets import kvm_usable

        ok, why = kvm_usable()
    except (BackendUnavailable, OSError) as e:
        return f"{api}; whether it boots a guest is not known ({getattr(e, 'message', e)})"
    return (f"{api}; usable by the microvm tier: {why}" if ok else
            f"{api} but not usable by the microvm tier, which emulates with TCG: {why}")


def _cgroup_attach() -> bool | str:
    """Whether moving a process into a cgroup is fast (favordynmods on a cgroup2 mount)."""
    with open("/proc/mounts") as f:
        v2 = [line.split()[1] for line in f if line.split()[2:3] == ["cgroup2"]]
    with open("/proc/mounts") as f:
        if any("favordynmods" in line for line in f):
            return True
    where = v2[0] if v2 else "/sys/fs/cgroup"
    return (f"slow: each sandbox start waits ~10 ms for an RCU grace period; fix: "
            f"mount -o remount,favordynmods {where} (scripts/setup.sh does)")


def _tiers() -> dict:
    """Each tier: True when it can run the default policy here, else why not (and the
    defaults it would leave unenforced)."""
    from ..backends import KNOWN
    from ..errors import BackendUnavailable
    from ..plan import build_plan
    from ..policy import Policy

    out: dict = {}
    for tier in KNOWN:
        try:
            from ..backends import get_backend

            backend = get_backend(tier)
            check = backend.check(build_plan(Policy(isolation=tier), {}))
        except BackendUnavailable as e:
            out[tier] = e.message
            continue
        except Exception as e:  # noqa: BLE001 - doctor reports, it does not crash
            out[tier] = f"check failed: {type(e).__name__}: {e}"
            continue
        unenforced = sorted({g.rule for g in check.unenforced})
        refused = sorted({g.rule for g in check.refused})   # of the default policy
        out[tier] = True if not check.gaps else "; ".join(
            ["usable"] + ([f"unenforced here: {', '.join(unenforced)}"] if unenforced else [])
            + ([f"refuses the default {', '.join(refused)} (set it)"] if refused else []))
    return out


def facts() -> dict:
    from ..backends.namespace import find_bwrap, userns_available
    from ..linux import limits

    cg = limits.detect()
    bwrap = find_bwrap()
    userns = userns_available()
    sc = _seccomp()
    root = os.geteuid() == 0
    idmap: bool | str = "not needed (not root)"
    if root:
        from ..linux import idmap as _idmap

        idmap = _idmap.supported("/tmp")
    runsc = shutil.which("runsc")
    return {
        "root": root,
        "bwrap": bwrap or "missing; apt-get install bubblewrap",
        "user_namespaces": userns,
        "seccomp": sc,
        "cgroups": {"version": cg.version, "reason": cg.reason,
                    "usable": [c for c in ("memory", "pids", "cpu") if getattr(cg, c)]},
        "idmapped_mounts": idmap,
        "cgroup_attach": _cgroup_attach(),
        "landlock_abi": _landlock_abi(),
        "runsc": runsc or "missing; apt-get install runsc",
        "kvm": _kvm(),
        "tiers": _tiers(),
    }


def report(as_json: bool = False) -> int:
    f = facts()
    if as_json:
        sys.stdout.write(json.dumps(f, indent=2) + "\n")
        return 0
    def mark(v) -> str:
        return "ok " if v is True or (isinstance(v, (int, str)) and str(v).startswith("/")) \
            else "-- "
    lines = [f"corral doctor ({'root' if f['root'] else 'uid ' + str(os.geteuid())})"]
    for key in ("bwrap", "user_namespaces", "seccomp", "idmapped_mounts", "cgroup_attach",
                "runsc", "kvm"):
        v = f[key]
        lines.append(f"  {mark(v)}{key}: {v}")
    cg = f["cgroups"]
    lines.append(f"  {'ok ' if cg['usable'] else '-- '}cgroups: {cg['version'] or 'none'}, "
                 f"usable: {', '.join(cg['usable']) or 'none'}"
                 + (f" ({cg['reason']})" if cg["reason"] else ""))
    abi = f["landlock_abi"]
    lines.append(f"  {'ok ' if isinstance(abi, int) else '-- '}landlock: "
                 f"{'ABI ' + str(abi) if isinstance(abi, int) else abi}")
    lines.append("tiers:")
    for tier, v in f["tiers"].items():
        ok = v is True or str(v).startswith("usable")
        lines.append(f"  {'ok ' if ok else '-- '}{tier}: {'usable' if v is True else v}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
