ID = "kernel.userns"
CATEGORY = "kernel"
DESCRIPTION = "unshare(CLONE_NEWUSER|CLONE_NEWNS) to get a user namespace with every capability"
CLAIMS = ("kernel_surface_filtered",)
CODE = """
judge_syscall("unshare", 0x10000000 | 0x00020000)
"""
CONTROL = "host"
CONTAINED = "unshare fails with EPERM (seccomp) or ENOSYS: no new user namespace, no new capabilities"
