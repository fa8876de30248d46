ID = 'kernel.bpf'
CATEGORY = 'kernel'
DESCRIPTION = 'bpf(BPF_MAP_CREATE) of a one-entry array'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
attr = ctypes.create_string_buffer(72)
for off, v in ((0, 2), (4, 4), (8, 4), (12, 1)):    # ARRAY, key 4, value 4, 1 entry
    ctypes.c_uint32.from_buffer(attr, off).value = v
judge_syscall("bpf", 0, attr, 72, cleanup=os.close)
"""
CONTROL = 'host'
CONTAINED = 'bpf fails with EPERM or ENOSYS'
