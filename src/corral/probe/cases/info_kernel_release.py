import os

from ._net import HASH, same_as_host

ID = "info.kernel-release"
CATEGORY = "info"
DESCRIPTION = "the host kernel's exact release and build (uname -r -v): picks the kernel exploit to use"
CLAIMS = ("own_kernel",)
CODE = HASH + """
u = os.uname()
out("SEEN", h(u.release + " " + u.version))
"""
CONTROL = "host"
CONTAINED = "the sandbox's kernel reports a release and build of its own"


def score(obs):
    u = os.uname()
    return same_as_host(obs, u.release + " " + u.version, "kernel release")
