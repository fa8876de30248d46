ID = 'kernel.process-vm-readv'
CATEGORY = 'kernel'
DESCRIPTION = 'process_vm_readv: read another address space (its own, the least it needs)'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
src = ctypes.create_string_buffer(b"x" * 64); dst = ctypes.create_string_buffer(64)
li = iovec(ctypes.addressof(dst), 64); ri = iovec(ctypes.addressof(src), 64)
judge_syscall("process_vm_readv", os.getpid(), ctypes.byref(li), 1, ctypes.byref(ri), 1, 0)
"""
CONTROL = 'host'
CONTAINED = 'process_vm_readv fails with EPERM'
