from ._net import HASH, host_file, same_as_host

ID = "info.boot-id"
CATEGORY = "info"
DESCRIPTION = "the host's boot id (/proc/sys/kernel/random/boot_id): ties runs to one machine and boot"
CLAIMS = ("own_kernel",)
CODE = HASH + """
try:
    out("SEEN", h(open("/proc/sys/kernel/random/boot_id", "rb").read()))
except OSError as e:
    out("DENIED", f"boot_id: {ename(e)}")
"""
CONTROL = "host"
CONTAINED = "the boot id is the sandbox kernel's own (or unreadable)"


def score(obs):
    return same_as_host(obs, host_file("/proc/sys/kernel/random/boot_id"), "boot id")
