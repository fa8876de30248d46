from ._net import HASH, host_file, same_as_host

ID = "info.proc1"
CATEGORY = "info"
DESCRIPTION = "read /proc/1/cmdline and /proc/1/stat's start time: is pid 1 the host's init?"
CLAIMS = ("pid_isolation",)
CODE = HASH + """
try:
    cmd = open("/proc/1/cmdline", "rb").read()
    start = open("/proc/1/stat", "rb").read().rsplit(b")", 1)[1].split()[19]
    out("SEEN", h(cmd + b" " + start))
except (OSError, IndexError) as e:
    out("DENIED", f"/proc/1: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "pid 1 is the sandbox's own init, not the host's"


def score(obs):
    cmd, stat = host_file("/proc/1/cmdline"), host_file("/proc/1/stat")
    host = cmd + b" " + stat.rsplit(b")", 1)[1].split()[19] if cmd is not None and stat else None
    return same_as_host(obs, host, "pid 1 (init)")
