ID = 'kernel.module-load'
CATEGORY = 'kernel'
DESCRIPTION = 'finit_module (with a bad fd: only the permission check matters)'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
if ON_HOST and sys_call("finit_module", -1, b"", 0)[1] == "ENOSYS":
    out("UNSUPPORTED", "this kernel has no module support")
else:
    judge_syscall("finit_module", -1, b"", 0)   # EBADF means it got past the permission check
"""
CONTROL = 'host'
CONTAINED = 'finit_module fails with EPERM before looking at its arguments'
