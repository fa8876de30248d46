ID = 'kernel.fsopen'
CATEGORY = 'kernel'
DESCRIPTION = 'the new mount API: fsopen("tmpfs")'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
judge_syscall("fsopen", b"tmpfs", 0, cleanup=os.close)
"""
CONTROL = 'host'
CONTAINED = 'fsopen fails with EPERM or ENOSYS'
