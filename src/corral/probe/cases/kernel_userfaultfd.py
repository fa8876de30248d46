ID = 'kernel.userfaultfd'
CATEGORY = 'kernel'
DESCRIPTION = "userfaultfd(2), a staple of kernel exploits' race windows"
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
judge_syscall("userfaultfd", os.O_CLOEXEC | 1, cleanup=os.close)   # UFFD_USER_MODE_ONLY
"""
CONTROL = 'host'
CONTAINED = 'userfaultfd fails with EPERM or ENOSYS'
