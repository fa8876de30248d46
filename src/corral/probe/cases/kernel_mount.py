ID = 'kernel.mount'
CATEGORY = 'kernel'
DESCRIPTION = 'mount a tmpfs (mount(2)) in the writable directory'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
t = os.path.join(SCRATCH, "mnt"); os.makedirs(t, exist_ok=True)
judge_syscall("mount", b"none", t.encode(), b"tmpfs", 0, None,
              cleanup=lambda r: sys_call("umount2", t.encode(), 2))
"""
CONTROL = 'host'
CONTAINED = 'mount fails with EPERM'
