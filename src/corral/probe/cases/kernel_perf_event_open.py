ID = 'kernel.perf-event-open'
CATEGORY = 'kernel'
DESCRIPTION = 'perf_event_open on itself (a software clock)'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
attr = ctypes.create_string_buffer(128)
ctypes.c_uint32.from_buffer(attr, 0).value = 1      # PERF_TYPE_SOFTWARE
ctypes.c_uint32.from_buffer(attr, 4).value = 128    # size; config 0 = CPU clock
judge_syscall("perf_event_open", attr, 0, -1, -1, 0, cleanup=os.close)
"""
CONTROL = 'host'
CONTAINED = 'perf_event_open fails with EPERM, EACCES or ENOSYS'
