ID = 'kernel.io-uring'
CATEGORY = 'kernel'
DESCRIPTION = 'io_uring_setup: a ring that bypasses syscall filters'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
params = ctypes.create_string_buffer(120)
judge_syscall("io_uring_setup", 1, params, cleanup=os.close)
"""
CONTROL = 'host'
CONTAINED = 'io_uring_setup fails with EPERM or ENOSYS'
