"""The process tier's way out when network.mode = "allow": per command, an egress proxy on
the host's 127.0.0.1 at a free port, admitting only the sandbox's uid, and a cgroup v2
directory of the command's own whose socket programs (bpf) let it reach only that port
(see process.py's module docstring for the whole fence)."""

from __future__ import annotations

import os

from ..errors import SandboxSetupError
from ..linux import landlock, limits
from .host.proxy import start_proxy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .process import ProcessSandbox

NETWORK_ALLOW_NOTE = (
    "the egress proxy listens on the host's 127.0.0.1 at a free port P per command and "
    "admits a connection only if the socket at its other end belongs to the sandbox's uid "
    "(the kernel's socket table, sock_diag); the command sits in a cgroup v2 directory of its own whose socket "
    "programs (bpf) let it connect only to 127.0.0.1:P (or ::ffff:127.0.0.1:P) over TCP "
    "and refuse UDP sends, binds and non-TCP inet sockets; Landlock allows TCP connect to "
    "port P only; seccomp allows only inet stream sockets (unix sockets only from "
    "socketpair; no bind, listen, accept or TCP Fast Open). Left open: the host's network "
    "namespace is shared (its interfaces and /proc/net are visible), and host services on "
    "127.0.0.1 stay unreachable, P being the proxy itself")


class _Egress:
    """The network side of one exec: a listener on the host's 127.0.0.1 at a free port P,
    a cgroup v2 directory for the command alone with the socket programs for P attached
    (cgroup_bpf.py), the Landlock ruleset allowing TCP connect to P, and the proxy.

    The directory is `<run cgroup>/sandbox` when the run cgroup is v2 (limits keep applying;
    the proxy stays in the run cgroup itself, above the programs), else `<cgroup2
    mount>/corral/<run id>` (hybrid hosts: the limits are in v1), noted in the run dir so
    the stale sweep removes it. Removing the directory detaches and frees the programs."""

    def __init__(self, sb: ProcessSandbox, run_id: str, cg) -> None:
        import socket

        from ..linux import cgroup_bpf

        self.sb = sb
        self.ruleset: landlock.Ruleset | None = None
        self.cgroup = None
        self.attach: list[int] = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.listener.bind(("127.0.0.1", 0))
            self.listener.listen(4096)
            self.port = self.listener.getsockname()[1]
            if cg is not None and cg.version == "v2":
                path = os.path.join(cg.paths[0], "sandbox")
                made = _mkdir_cgroup(path)
            else:
                mnt = cgroup_bpf.cgroup2_mount()
                if mnt is None:
                    raise SandboxSetupError("no cgroup2 filesystem is mounted",
                                            step="egress-cgroup", field="network.mode")
                path = os.path.join(mnt, limits.PARENT, run_id)
                # noted before it exists: a supervisor dying in between leaves nothing the
                # sweep cannot find (it skips a noted directory that was never made)
                sb.dir.track(limits.RunCgroup(run_id, "v2", {"cgroup2": path}))
                made = _mkdir_cgroup(path)
            self.cgroup = made
            try:
                progs = cgroup_bpf.Programs(self.port)
                try:
                    progs.attach(path)
                finally:
                    progs.close()
            except OSError as e:
                raise SandboxSetupError(f"cannot attach the socket programs to {path}: "
                                        f"{e.strerror}", step="egress-cgroup",
                                        errno=e.errno, field="network.mode") from None
            self.attach = self.cgroup.attach_fds()
            self.ruleset = sb._landlock(self.port)
        except BaseException:
            for c in self.close():
                try:
                    c.destroy()
                except SandboxSetupError:
                    pass
            for fd in self.attach:
                os.close(fd)
            raise

    def start_proxy(self, cg):
        """The egress proxy on the listener, as the proxy's own uid, in the run cgroup (not
        in the command's: its upstream connects must not meet the programs)."""
        import json

        from ..grants import proxy_config

        sb = self.sb
        config = json.loads(proxy_config(sb.egress[0].config_json, sb.granted, sb.ca,
                                         sb.upstream_ca))
        config["peer_uid"] = sb.uid   # only the command's sockets get in
        attach = cg.attach_fds() if cg is not None else []
        uid, gid = ((sb.proxy_uid, sb.proxy_gid) if sb.root else (sb.uid, sb.gid))
        try:   # the listener is the proxy's now: start_proxy closes it here
            return start_proxy(json.dumps(config), self.listener, attach, uid, gid)
        finally:
            for fd in attach:
                os.close(fd)

    def close(self) -> list:
        """Close what this exec holds; returns the cgroup to destroy (before the run's)."""
        self.listener.close()
        if self.ruleset is not None:
            self.ruleset.close()
            self.ruleset = None
        cgs, self.cgroup = ([self.cgroup] if self.cgroup is not None else []), None
        return cgs


def _mkdir_cgroup(path: str):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path)
    except OSError as e:
        raise SandboxSetupError(f"cannot create the cgroup {path}: {e.strerror}",
                                step="egress-cgroup", errno=e.errno,
                                field="network.mode") from None
    return limits.RunCgroup(os.path.basename(path), "v2", {"cgroup2": path})
